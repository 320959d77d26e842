#include "watch/profile/time_bins.h"

#include <algorithm>

namespace kwatch::watch::profile {

TimeBins::TimeBins(uint64_t origin_ns, uint64_t fixed_width_ns, uint64_t initial_width_ns,
                   uint32_t max_columns)
    : origin_(origin_ns),
      width_(fixed_width_ns != 0 ? fixed_width_ns : std::max<uint64_t>(initial_width_ns, 1)),
      automatic_(fixed_width_ns == 0),
      max_(std::max<uint32_t>(max_columns, 2)),
      zeros_(max_, 0) {}

uint32_t TimeBins::AddRow() {
  blocks_.push_back(kNoBlock);
  return static_cast<uint32_t>(blocks_.size() - 1);
}

uint32_t TimeBins::AddSparseRow() {
  blocks_.push_back(kSparse + static_cast<uint32_t>(sparse_.size()));
  sparse_.emplace_back();
  return static_cast<uint32_t>(blocks_.size() - 1);
}

void TimeBins::IncrementSlow(uint32_t row, uint32_t column) {
  uint32_t& block = blocks_[row];
  if (block == kNoBlock) {
    block = NewBlock();
    ++cells_[static_cast<size_t>(block) * max_ + column];
    return;
  }
  SparseRow& v = sparse_[block - kSparse];
  if (!v.empty() && v.back().first == column) {  // times mostly arrive in order
    ++v.back().second;
    return;
  }
  const auto it = std::lower_bound(v.begin(), v.end(), column,
                                   [](const auto& cell, uint32_t c) { return cell.first < c; });
  if (it != v.end() && it->first == column) {
    ++it->second;
    return;
  }
  v.insert(it, {column, 1});
  ++sparse_cells_;
  if (v.size() > max_ / 8) {  // denser than a full row's worth: become one
    const uint32_t dense = NewBlock();
    for (const auto& [c, n] : v) {
      cells_[static_cast<size_t>(dense) * max_ + c] = n;
    }
    sparse_cells_ -= v.size();
    SparseRow().swap(v);
    block = dense;
  }
}

void TimeBins::Add(uint32_t row, uint32_t column, uint64_t n) {
  if (n == 0) {
    return;
  }
  const uint32_t block = blocks_[row];
  if (block < kSparse) {
    cells_[static_cast<size_t>(block) * max_ + column] += n;
    return;
  }
  IncrementSlow(row, column);  // creates the cell (or the block) with 1
  const uint32_t now = blocks_[row];
  if (now < kSparse) {
    cells_[static_cast<size_t>(now) * max_ + column] += n - 1;
    return;
  }
  SparseRow& v = sparse_[now - kSparse];
  const auto it = std::lower_bound(v.begin(), v.end(), column,
                                   [](const auto& cell, uint32_t c) { return cell.first < c; });
  it->second += n - 1;
}

std::vector<uint64_t> TimeBins::RowCopy(uint32_t row) const {
  const uint32_t block = blocks_[row];
  if (block == kNoBlock || block < kSparse) {
    const absl::Span<const uint64_t> r = Row(row);
    return {r.begin(), r.end()};
  }
  std::vector<uint64_t> out(used_, 0);
  for (const auto& [c, n] : sparse_[block - kSparse]) {
    if (c < used_) {
      out[c] = n;
    }
  }
  return out;
}

uint32_t TimeBins::NewBlock() {
  cells_.resize(cells_.size() + max_, 0);
  return counted_rows_++;
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
  for (uint32_t r = 0; r < counted_rows(); ++r) {
    uint64_t* row = cells_.data() + static_cast<size_t>(r) * max_;
    for (size_t c = 0; c < half; ++c) {
      const uint64_t a = row[2 * c];
      const uint64_t b = 2 * c + 1 < max_ ? row[2 * c + 1] : 0;
      row[c] = a + b;
    }
    std::fill(row + half, row + max_, 0);
  }
  for (SparseRow& v : sparse_) {
    size_t out = 0;
    for (const auto& [c, n] : v) {
      if (out > 0 && v[out - 1].first == c / 2) {
        v[out - 1].second += n;
      } else {
        v[out++] = {c / 2, n};
      }
    }
    sparse_cells_ -= v.size() - out;
    v.resize(out);
  }
  used_ = (used_ + 1) / 2;
  cur_len_ = 0;
}

void TimeBins::Slide(uint64_t bucket) {
  const uint64_t new_first = std::max(bucket - max_ + 1, first_ + max_ / 2);
  const uint64_t shift = new_first - first_;
  for (uint32_t r = 0; r < counted_rows(); ++r) {
    uint64_t* row = cells_.data() + static_cast<size_t>(r) * max_;
    if (shift >= max_) {
      std::fill(row, row + max_, 0);
    } else {
      std::copy(row + shift, row + max_, row);
      std::fill(row + (max_ - shift), row + max_, 0);
    }
  }
  for (SparseRow& v : sparse_) {
    size_t out = 0;
    for (const auto& [c, n] : v) {
      if (c >= shift) {
        v[out++] = {static_cast<uint32_t>(c - shift), n};
      }
    }
    sparse_cells_ -= v.size() - out;
    v.resize(out);
  }
  used_ = used_ > shift ? static_cast<uint32_t>(used_ - shift) : 0;
  first_ = new_first;
  cur_len_ = 0;
}

}  // namespace kwatch::watch::profile
