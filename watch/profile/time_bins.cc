#include "watch/profile/time_bins.h"

#include <algorithm>

namespace kwatch::watch::profile {

TimeBins::TimeBins(uint64_t origin_ns, uint64_t fixed_width_ns, uint64_t initial_width_ns,
                   uint32_t max_columns)
    : origin_(origin_ns),
      width_(fixed_width_ns != 0 ? fixed_width_ns : std::max<uint64_t>(initial_width_ns, 1)),
      automatic_(fixed_width_ns == 0),
      max_(std::max<uint32_t>(max_columns, 2)) {}

uint32_t TimeBins::AddRow() {
  cells_.resize(cells_.size() + max_, 0);
  return rows_++;
}

uint32_t TimeBins::ColumnSlow(uint64_t t_ns) {
  const uint64_t rel = t_ns < origin_ ? 0 : t_ns - origin_;
  uint64_t bucket = rel / width_;
  if (bucket < first_) {
    return kLate;
  }
  if (bucket - first_ >= max_) {
    if (automatic_) {
      while (bucket >= max_) {
        Double();
        bucket = rel / width_;
      }
    } else {
      Slide(bucket);
    }
  }
  const auto col = static_cast<uint32_t>(bucket - first_);
  used_ = std::max(used_, col + 1);
  if (t_ns >= origin_) {
    cur_lo_ = origin_ + bucket * width_;
    cur_len_ = width_;
    cur_col_ = col;
  } else {
    cur_len_ = 0;  // times before the origin always take the slow path
  }
  return col;
}

void TimeBins::Double() {
  width_ *= 2;
  const uint32_t half = (max_ + 1) / 2;
  for (uint32_t r = 0; r < rows_; ++r) {
    uint64_t* row = cells_.data() + static_cast<size_t>(r) * max_;
    for (size_t c = 0; c < half; ++c) {
      const uint64_t a = row[2 * c];
      const uint64_t b = 2 * c + 1 < max_ ? row[2 * c + 1] : 0;
      row[c] = a + b;
    }
    std::fill(row + half, row + max_, 0);
  }
  used_ = (used_ + 1) / 2;
  cur_len_ = 0;
}

void TimeBins::Slide(uint64_t bucket) {
  const uint64_t new_first = std::max(bucket - max_ + 1, first_ + max_ / 2);
  const uint64_t shift = new_first - first_;
  for (uint32_t r = 0; r < rows_; ++r) {
    uint64_t* row = cells_.data() + static_cast<size_t>(r) * max_;
    if (shift >= max_) {
      std::fill(row, row + max_, 0);
    } else {
      std::copy(row + shift, row + max_, row);
      std::fill(row + (max_ - shift), row + max_, 0);
    }
  }
  used_ = used_ > shift ? static_cast<uint32_t>(used_ - shift) : 0;
  first_ = new_first;
  cur_len_ = 0;
}

}  // namespace kwatch::watch::profile
