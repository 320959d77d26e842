#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/types/span.h"
#include "core/base/status_macros.h"

namespace kwatch::watch::profile {

// Rows of counters over one shared time axis (columns of equal width, starting at an origin).
//
// Automatic width (fixed_width_ns == 0): the width starts at initial_width_ns; when a time
// falls past the last of the max_columns columns, the width doubles (adjacent columns merge
// pairwise, in every row) until it fits. The origin stays put, so column c always covers
// [origin + c*width, origin + (c+1)*width). Each doubling costs O(rows x max_columns) and
// happens once per doubling of the covered time span, never per event.
//
// Fixed width: the width never changes; the axis is a window of at most max_columns columns
// that slides forward when a time falls past its end, by at least half its length (older
// columns are dropped; their counts stay in the callers' totals), so column c covers
// [origin + (first_bucket()+c)*width, ... + width). A time before the window is "late":
// ColumnFor returns kLate and the caller does not bin it.
//
// Times before the origin go to the first column (automatic) or to bucket 0 (fixed).
// Memory: max_columns x 8 bytes per row that was ever incremented; a row that never was holds
// no counters (it reads as zeros), so rows can be added for everything that might be counted.
// A sparse row (AddSparseRow) holds 16 bytes per column it counted in, until that is more than
// max_columns / 8 columns, when it becomes a full row: for the many rows that count in a few
// columns (one thread's accesses to one field). Copyable; not thread-safe.
class TimeBins {
 public:
  static constexpr uint32_t kLate = ~0U;

  TimeBins() : TimeBins(0, 0, 1'000'000, 240) {}
  // max_columns >= 2 and initial_width_ns >= 1 (smaller values are raised to these).
  TimeBins(uint64_t origin_ns, uint64_t fixed_width_ns, uint64_t initial_width_ns,
           uint32_t max_columns);

  // Appends a row of zeros (no counters until its first Increment); returns its id (ids are
  // 0, 1, 2, ...).
  uint32_t AddRow();
  // Appends a sparse row (see above); read it with RowCopy.
  uint32_t AddSparseRow();

  // The column for time `t_ns`, reshaping all rows first if `t_ns` lies past the last
  // column (see above); kLate for a time before a fixed window. O(1) when t_ns falls in the
  // same column as the previous call.
  uint32_t ColumnFor(uint64_t t_ns) {
    if (t_ns - cur_lo_ < cur_len_) {
      return cur_col_;
    }
    return ColumnSlow(t_ns);
  }
  void Increment(uint32_t row, uint32_t column) {
    const uint32_t block = blocks_[row];
    if (block < kSparse) {
      ++cells_[static_cast<size_t>(block) * max_ + column];
    } else {
      IncrementSlow(row, column);
    }
  }

  // Adds `n` to a cell (as n Increments).
  void Add(uint32_t row, uint32_t column, uint64_t n);

  // The first columns() counters of `row` (columns() covers everything seen so far). A full
  // row (AddRow) only.
  absl::Span<const uint64_t> Row(uint32_t row) const {
    const uint32_t block = blocks_[row];
    KW_CHECK(block < kSparse || block == kNoBlock);
    return absl::MakeConstSpan(
        block == kNoBlock ? zeros_.data() : cells_.data() + static_cast<size_t>(block) * max_,
        used_);
  }
  // The same, of either kind of row.
  std::vector<uint64_t> RowCopy(uint32_t row) const;
  uint32_t rows() const { return static_cast<uint32_t>(blocks_.size()); }
  // Rows holding max_columns() counters (incremented full rows, and sparse rows grown full).
  uint32_t counted_rows() const { return counted_rows_; }
  // (column, count) pairs held by sparse rows.
  uint64_t sparse_cells() const { return sparse_cells_; }
  // Columns in use: up to and including the latest one an event fell in (0 before any).
  uint32_t columns() const { return used_; }
  uint32_t max_columns() const { return max_; }
  uint64_t width_ns() const { return width_; }
  bool automatic() const { return automatic_; }
  uint64_t origin_ns() const { return origin_; }
  // Bucket number (from the origin) of column 0: always 0 with automatic width.
  uint64_t first_bucket() const { return first_; }
  // Start of column `c`, in nanoseconds after the origin.
  uint64_t ColumnStartNs(uint32_t c) const { return (first_ + c) * width_; }

 private:
  // blocks_ values: a block number, kNoBlock, or kSparse + an index into sparse_.
  static constexpr uint32_t kNoBlock = ~0U;
  static constexpr uint32_t kSparse = 0x80000000U;
  using SparseRow = std::vector<std::pair<uint32_t, uint64_t>>;  // (column, count), by column

  uint32_t NewBlock();
  void IncrementSlow(uint32_t row, uint32_t column);
  uint32_t ColumnSlow(uint64_t t_ns);
  void Double();
  void Slide(uint64_t bucket);

  uint64_t origin_;
  uint64_t width_;
  bool automatic_;
  uint32_t max_;
  uint64_t first_ = 0;
  uint32_t used_ = 0;
  std::vector<uint32_t> blocks_;  // per row: its block of max_ counters in cells_, or kNoBlock
  std::vector<uint64_t> cells_;   // blocks of max_ counters, in order of first increment
  std::vector<uint64_t> zeros_;   // max_ zeros: what an uncounted row reads
  std::vector<SparseRow> sparse_;
  uint64_t sparse_cells_ = 0;
  uint32_t counted_rows_ = 0;  // blocks in cells_
  // The column of the last lookup: times in [cur_lo_, cur_lo_ + cur_len_) map to cur_col_.
  uint64_t cur_lo_ = 0;
  uint64_t cur_len_ = 0;
  uint32_t cur_col_ = 0;
};

}  // namespace kwatch::watch::profile
