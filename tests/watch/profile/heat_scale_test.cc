#include "watch/profile/heat_scale.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

namespace kwatch::watch::profile {
namespace {

// HSL lightness of 0xRRGGBB (0..255), as QColor::lightness, for monotonicity checks. Channels
// are rounded to integers, so two close positions may differ by half a unit the wrong way.
double Lightness(uint32_t rgb) {
  const double r = (rgb >> 16) & 0xff;
  const double g = (rgb >> 8) & 0xff;
  const double b = rgb & 0xff;
  return (std::max({r, g, b}) + std::min({r, g, b})) / 2.0;
}

TEST(HeatScale, PositionEndpoints) {
  for (const HeatScale s : {HeatScale::kLinear, HeatScale::kLog}) {
    EXPECT_EQ(HeatPosition(0, 100, s), 0.0);
    EXPECT_EQ(HeatPosition(5, 0, s), 0.0);
    EXPECT_DOUBLE_EQ(HeatPosition(100, 100, s), 1.0);
    EXPECT_DOUBLE_EQ(HeatPosition(500, 100, s), 1.0);  // clamped to max
  }
  EXPECT_DOUBLE_EQ(HeatPosition(1, 100, HeatScale::kLinear), 0.01);
  EXPECT_DOUBLE_EQ(HeatPosition(1, 100, HeatScale::kLog), 0.0);  // the log scale starts at 1
  EXPECT_DOUBLE_EQ(HeatPosition(1, 1, HeatScale::kLinear), 1.0);
  EXPECT_DOUBLE_EQ(HeatPosition(1, 1, HeatScale::kLog), 0.0);  // no range: the bottom
}

TEST(HeatScale, LogVersusLinear) {
  // 10 of 100: a tenth of the way linearly, half way on the log scale.
  EXPECT_DOUBLE_EQ(HeatPosition(10, 100, HeatScale::kLinear), 0.1);
  EXPECT_NEAR(HeatPosition(10, 100, HeatScale::kLog), 0.5, 1e-12);
  EXPECT_NEAR(HeatPosition(4, 16, HeatScale::kLog), 0.5, 1e-12);
  // The log scale lifts small counts: from 2 up, never below the linear position (1 is the
  // log scale's bottom).
  for (uint64_t c = 2; c <= 1000; ++c) {
    EXPECT_GE(HeatPosition(c, 1000, HeatScale::kLog) + 1e-12,
              HeatPosition(c, 1000, HeatScale::kLinear))
        << c;
  }
}

TEST(HeatScale, MonotonicInCountAndDarkerWithMore) {
  for (const HeatScale s : {HeatScale::kLinear, HeatScale::kLog}) {
    double prev_pos = -1.0;
    double prev_light = 1e9;
    for (uint64_t c = 1; c <= 300; ++c) {
      const double pos = HeatPosition(c, 300, s);
      EXPECT_GT(pos, prev_pos) << c;
      prev_pos = pos;
      const double light = Lightness(HeatRgb(c, 300, s));
      EXPECT_LE(light, prev_light + 0.5) << c;
      prev_light = light;
    }
  }
  double prev = 1e9;
  for (int i = 0; i <= 1000; ++i) {
    const double light = Lightness(HeatRampRgb(i / 1000.0));
    EXPECT_LE(light, prev + 0.5) << i;
    prev = light;
  }
  // Coarsely, strictly darker.
  for (int i = 1; i <= 10; ++i) {
    EXPECT_LT(Lightness(HeatRampRgb(i / 10.0)), Lightness(HeatRampRgb((i - 1) / 10.0))) << i;
  }
}

TEST(HeatScale, ColoursAndTheEmptyColour) {
  for (const HeatScale s : {HeatScale::kLinear, HeatScale::kLog}) {
    EXPECT_EQ(HeatRgb(0, 10, s), kEmptyHeatRgb);
    EXPECT_EQ(HeatRgb(0, 0, s), kEmptyHeatRgb);
    EXPECT_EQ(HeatRgb(10, 10, s), 0x54004au);  // the darkest colour is the maximum's
    for (uint64_t c = 1; c <= 10; ++c) {
      EXPECT_NE(HeatRgb(c, 10, s), kEmptyHeatRgb) << c;
    }
  }
  EXPECT_EQ(HeatRampRgb(0.0), 0xfff0a8u);
  EXPECT_EQ(HeatRampRgb(1.0), 0x54004au);
  EXPECT_EQ(HeatRampRgb(0.6), 0xf03b20u);  // a stop exactly
  EXPECT_EQ(HeatRampRgb(-3.0), HeatRampRgb(0.0));
  EXPECT_EQ(HeatRampRgb(7.0), HeatRampRgb(1.0));
  EXPECT_EQ(HeatRgb(1, 1000, HeatScale::kLog), HeatRampRgb(0.0));
}

TEST(HeatScale, CountAtInvertsPosition) {
  for (const HeatScale s : {HeatScale::kLinear, HeatScale::kLog}) {
    EXPECT_EQ(HeatCountAt(0.5, 0, s), 0u);
    EXPECT_EQ(HeatCountAt(1.0, 1000, s), 1000u);
    for (uint64_t c = 1; c <= 1000; ++c) {
      EXPECT_EQ(HeatCountAt(HeatPosition(c, 1000, s), 1000, s), c) << c;
    }
  }
  EXPECT_EQ(HeatCountAt(0.0, 1000, HeatScale::kLog), 1u);
  EXPECT_EQ(HeatCountAt(0.0, 1000, HeatScale::kLinear), 1u);  // never below one access
}

TEST(HeatScale, Levels) {
  const HeatLevels lin = MakeHeatLevels(16, 4, HeatScale::kLinear);
  EXPECT_EQ(lin.upper, (std::vector<uint64_t>{4, 8, 12, 16}));
  EXPECT_EQ(HeatLevel(lin, 0), 0);
  EXPECT_EQ(HeatLevel(lin, 1), 1);
  EXPECT_EQ(HeatLevel(lin, 5), 2);
  EXPECT_EQ(HeatLevel(lin, 16), 4);
  const HeatLevels log = MakeHeatLevels(16, 4, HeatScale::kLog);
  EXPECT_EQ(log.upper, (std::vector<uint64_t>{2, 4, 8, 16}));
  EXPECT_EQ(HeatLevel(log, 3), 2);
  EXPECT_EQ(HeatLevel(log, 9), 4);
  // Small maxima: the maximum is always the darkest level.
  EXPECT_EQ(MakeHeatLevels(3, 4, HeatScale::kLinear).upper, (std::vector<uint64_t>{0, 1, 2, 3}));
  EXPECT_EQ(MakeHeatLevels(3, 4, HeatScale::kLog).upper, (std::vector<uint64_t>{1, 1, 2, 3}));
  EXPECT_EQ(MakeHeatLevels(1, 4, HeatScale::kLinear).upper, (std::vector<uint64_t>{0, 0, 0, 1}));
  EXPECT_EQ(HeatLevel(MakeHeatLevels(1, 4, HeatScale::kLinear), 1), 4);
  EXPECT_EQ(MakeHeatLevels(1000000, 4, HeatScale::kLog).upper,
            (std::vector<uint64_t>{31, 1000, 31622, 1000000}));
}

// The levels are the positions cut into equal parts: one scale for text, PNG and GUI.
TEST(HeatScale, LevelsQuantizeThePosition) {
  for (const HeatScale s : {HeatScale::kLinear, HeatScale::kLog}) {
    for (const int n : {4, 6}) {
      for (uint64_t max = 1; max <= 300; ++max) {
        const HeatLevels levels = MakeHeatLevels(max, n, s);
        for (uint64_t c = 1; c <= max; ++c) {
          const double want = std::max(1.0, std::ceil(n * HeatPosition(c, max, s) - 1e-9));
          ASSERT_EQ(HeatLevel(levels, c), static_cast<int>(want))
              << "max " << max << " count " << c << " levels " << n << " log "
              << (s == HeatScale::kLog);
        }
      }
    }
  }
}

}  // namespace
}  // namespace kwatch::watch::profile
