#include "watch/profile/duration.h"

#include <cstdint>

#include <gtest/gtest.h>

namespace kwatch::watch::profile {
namespace {

TEST(FormatDuration, LargestUnitAtMostThreeDecimals) {
  EXPECT_EQ(FormatDuration(0), "0 ns");
  EXPECT_EQ(FormatDuration(900), "900 ns");
  EXPECT_EQ(FormatDuration(1'000), "1 us");
  EXPECT_EQ(FormatDuration(1'500'000), "1.5 ms");
  EXPECT_EQ(FormatDuration(240'000'000), "240 ms");
  EXPECT_EQ(FormatDuration(2'250'000'000), "2.25 s");
  EXPECT_EQ(FormatDuration(1'234'567), "1.235 ms");
  EXPECT_EQ(FormatDuration(3'600'000'000'000), "3600 s");
}

TEST(FormatSince, ATimeBeforeTheOriginIsNegativeNotAWrappedHugeNumber) {
  EXPECT_EQ(SinceNs(1'500, 1'000), 500);
  EXPECT_EQ(SinceNs(400, 1'000), -600);
  EXPECT_EQ(SinceNs(0, UINT64_MAX), -INT64_MAX);
  EXPECT_EQ(SinceNs(UINT64_MAX, 0), INT64_MAX);
  EXPECT_EQ(FormatSince(1'000'000'000 + 1'500'000, 1'000'000'000), "1.5 ms");
  EXPECT_EQ(FormatSince(1'000'000'000 - 3'000'000, 1'000'000'000), "-3 ms");
  EXPECT_EQ(FormatSince(7, 7), "0 ns");
}

}  // namespace
}  // namespace kwatch::watch::profile
