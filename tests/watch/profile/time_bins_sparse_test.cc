// watch/profile/time_bins.h: sparse rows count like full rows through doublings and slides,
// hold a pair per counted column, and become full rows once they count in many columns.
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "watch/profile/time_bins.h"

namespace kwatch::watch::profile {
namespace {

using ::testing::ElementsAre;

TEST(TimeBinsSparse, CountsLikeAFullRow) {
  TimeBins b(0, 0, 10, 32);  // sparse while in at most 4 columns
  const uint32_t s = b.AddSparseRow();
  for (uint64_t t : {0, 10, 11, 20, 30, 31, 32}) {
    b.Increment(s, b.ColumnFor(t));
  }
  EXPECT_THAT(b.RowCopy(s), ElementsAre(1, 2, 1, 3));
  EXPECT_EQ(b.sparse_cells(), 4u);
  EXPECT_EQ(b.counted_rows(), 0u);
  EXPECT_EQ(b.ColumnFor(400), 20u);  // doubles to 20 ns columns: pairs merge
  const std::vector<uint64_t> row = b.RowCopy(s);
  ASSERT_EQ(row.size(), 21u);
  EXPECT_EQ(row[0], 3u);
  EXPECT_EQ(row[1], 4u);
  EXPECT_EQ(row[2], 0u);
  EXPECT_EQ(b.sparse_cells(), 2u);
}

TEST(TimeBinsSparse, SlidesDropOldColumns) {
  TimeBins b(0, 10, 1, 32);
  const uint32_t s = b.AddSparseRow();
  for (uint64_t t : {0, 15, 170, 175}) {
    b.Increment(s, b.ColumnFor(t));
  }
  EXPECT_EQ(b.sparse_cells(), 3u);
  EXPECT_EQ(b.ColumnFor(330), 17u);  // bucket 33: the window slides by 16
  EXPECT_EQ(b.first_bucket(), 16u);
  std::vector<uint64_t> row = b.RowCopy(s);
  ASSERT_EQ(row.size(), 18u);
  EXPECT_EQ(row[1], 2u);  // bucket 17
  EXPECT_EQ(std::accumulate(row.begin(), row.end(), uint64_t{0}), 2u);
  EXPECT_EQ(b.sparse_cells(), 1u);
  b.ColumnFor(10000);  // everything slides out
  row = b.RowCopy(s);
  EXPECT_EQ(std::accumulate(row.begin(), row.end(), uint64_t{0}), 0u);
  EXPECT_EQ(b.sparse_cells(), 0u);
}

TEST(TimeBinsSparse, ManyColumnsMakeAFullRow) {
  TimeBins b(0, 1, 1, 64);  // fixed 1 ns columns, 64 of them: full beyond 8 pairs
  const uint32_t s = b.AddSparseRow();
  for (uint64_t t = 0; t < 8; ++t) {
    b.Increment(s, b.ColumnFor(t * 2));
  }
  EXPECT_EQ(b.sparse_cells(), 8u);
  EXPECT_EQ(b.counted_rows(), 0u);
  b.Increment(s, b.ColumnFor(20));
  EXPECT_EQ(b.sparse_cells(), 0u);
  EXPECT_EQ(b.counted_rows(), 1u);
  const std::vector<uint64_t> row = b.RowCopy(s);
  EXPECT_EQ(row.size(), 21u);
  EXPECT_EQ(row[0], 1u);
  EXPECT_EQ(row[1], 0u);
  EXPECT_EQ(row[14], 1u);
  EXPECT_EQ(row[20], 1u);
  EXPECT_EQ(b.Row(s).size(), 21u);  // a full row now
}

TEST(TimeBinsSparse, RandomIncrementsMatchAFullRow) {
  // Out-of-order times, doublings and (fixed width) slides: the sparse row always reads as the
  // full row fed the same increments.
  for (const uint64_t fixed : {uint64_t{0}, uint64_t{7}}) {
    std::mt19937_64 rng(42 + fixed);
    TimeBins b(100, fixed, 3, 32);
    const uint32_t full = b.AddRow();
    const uint32_t sparse = b.AddSparseRow();
    for (int i = 0; i < 5000; ++i) {
      const uint64_t t = 100 + static_cast<uint64_t>(i) * 3 + rng() % 200;
      const uint32_t c = b.ColumnFor(t);
      if (c == TimeBins::kLate) {
        continue;
      }
      b.Increment(full, c);
      b.Increment(sparse, c);
      if (i % 97 == 0) {
        const absl::Span<const uint64_t> f = b.Row(full);
        ASSERT_EQ(b.RowCopy(sparse), std::vector<uint64_t>(f.begin(), f.end())) << i;
      }
    }
  }
}

}  // namespace
}  // namespace kwatch::watch::profile
