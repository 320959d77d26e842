#include "watch/profile/duration.h"

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

}  // namespace
}  // namespace kwatch::watch::profile
