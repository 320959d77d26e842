#include "watch/profile/time_bins.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace kwatch::watch::profile {
namespace {

using ::testing::ElementsAre;

TEST(TimeBins, BucketBoundaries) {
  TimeBins b(1000, 0, 10, 4);
  const uint32_t r = b.AddRow();
  EXPECT_EQ(b.columns(), 0u);
  EXPECT_EQ(b.ColumnFor(1000), 0u);
  EXPECT_EQ(b.ColumnFor(1009), 0u);
  EXPECT_EQ(b.ColumnFor(1010), 1u);
  EXPECT_EQ(b.ColumnFor(1039), 3u);
  EXPECT_EQ(b.ColumnFor(999), 0u);  // before the origin: first column
  EXPECT_EQ(b.ColumnFor(1010), 1u);
  b.Increment(r, b.ColumnFor(1005));
  b.Increment(r, b.ColumnFor(1039));
  EXPECT_EQ(b.width_ns(), 10u);
  EXPECT_THAT(b.Row(r), ElementsAre(1, 0, 0, 1));
  EXPECT_EQ(b.ColumnStartNs(3), 30u);
}

TEST(TimeBins, AutomaticWidthDoublesMergingPairs) {
  TimeBins b(0, 0, 10, 4);
  const uint32_t r0 = b.AddRow();
  const uint32_t r1 = b.AddRow();
  for (uint64_t t : {0, 10, 11, 20, 30, 31, 32}) {
    b.Increment(r0, b.ColumnFor(t));
  }
  b.Increment(r1, b.ColumnFor(25));
  EXPECT_THAT(b.Row(r0), ElementsAre(1, 2, 1, 3));
  EXPECT_EQ(b.ColumnFor(40), 2u);  // 40 / 20
  EXPECT_EQ(b.width_ns(), 20u);
  EXPECT_THAT(b.Row(r0), ElementsAre(3, 4, 0));
  EXPECT_THAT(b.Row(r1), ElementsAre(0, 1, 0));
  EXPECT_EQ(b.ColumnFor(1000), 3u);  // 1000 / 20 = 50 -> /40 = 25 -> /80 = 12 -> /160 = 6 -> /320
  EXPECT_EQ(b.width_ns(), 320u);
  EXPECT_THAT(b.Row(r0), ElementsAre(7, 0, 0, 0));
  EXPECT_THAT(b.Row(r1), ElementsAre(1, 0, 0, 0));
  const uint32_t r2 = b.AddRow();  // a new row joins at the current width
  b.Increment(r2, b.ColumnFor(700));
  EXPECT_THAT(b.Row(r2), ElementsAre(0, 0, 1, 0));
}

TEST(TimeBins, FixedWidthSlidesByAtLeastHalf) {
  TimeBins b(0, 10, 1, 4);
  const uint32_t r = b.AddRow();
  for (uint64_t t : {0, 15, 25, 35}) {
    b.Increment(r, b.ColumnFor(t));
  }
  EXPECT_THAT(b.Row(r), ElementsAre(1, 1, 1, 1));
  EXPECT_EQ(b.ColumnFor(40), 2u);  // window slides by 2: buckets 2..5
  EXPECT_EQ(b.first_bucket(), 2u);
  EXPECT_EQ(b.width_ns(), 10u);
  b.Increment(r, 2);
  EXPECT_THAT(b.Row(r), ElementsAre(1, 1, 1));
  EXPECT_EQ(b.ColumnStartNs(0), 20u);
  EXPECT_EQ(b.ColumnFor(5), TimeBins::kLate);
  EXPECT_EQ(b.ColumnFor(1000), 3u);  // bucket 100: window 97..100, all old columns dropped
  EXPECT_EQ(b.first_bucket(), 97u);
  EXPECT_THAT(b.Row(r), ElementsAre(0, 0, 0, 0));
}

}  // namespace
}  // namespace kwatch::watch::profile
