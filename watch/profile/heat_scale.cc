#include "watch/profile/heat_scale.h"

#include <algorithm>
#include <array>
#include <cmath>

namespace kwatch::watch::profile {

namespace {

struct Stop {
  double at;
  uint32_t rgb;
};

// ColorBrewer YlOrRd extended to dark purple: light means few accesses.
constexpr std::array<Stop, 6> kRamp = {{{0.0, 0xfff0a8},
                                        {0.2, 0xfecc5c},
                                        {0.4, 0xfd8d3c},
                                        {0.6, 0xf03b20},
                                        {0.8, 0xbd0026},
                                        {1.0, 0x54004a}}};

uint32_t Mix(uint32_t a, uint32_t b, double u) {
  uint32_t out = 0;
  for (int shift = 16; shift >= 0; shift -= 8) {
    const double x = (a >> shift) & 0xff;
    const double y = (b >> shift) & 0xff;
    out |= static_cast<uint32_t>(std::lround(x + (y - x) * u)) << shift;
  }
  return out;
}

}  // namespace

double HeatPosition(uint64_t count, uint64_t max, HeatScale scale) {
  if (count == 0 || max == 0) {
    return 0.0;
  }
  count = std::min(count, max);
  if (scale == HeatScale::kLinear) {
    return static_cast<double>(count) / static_cast<double>(max);
  }
  if (max <= 1) {
    return 0.0;
  }
  return std::log(static_cast<double>(count)) / std::log(static_cast<double>(max));
}

uint64_t HeatCountAt(double position, uint64_t max, HeatScale scale) {
  if (max == 0) {
    return 0;
  }
  position = std::clamp(position, 0.0, 1.0);
  const auto m = static_cast<double>(max);
  const double c = scale == HeatScale::kLinear ? position * m : std::pow(m, position);
  return std::clamp<uint64_t>(static_cast<uint64_t>(std::llround(c)), 1, max);
}

uint32_t HeatRampRgb(double position) {
  const double p = std::clamp(position, 0.0, 1.0);
  for (size_t i = 1; i < kRamp.size(); ++i) {
    if (p <= kRamp[i].at) {
      const Stop& a = kRamp[i - 1];
      const Stop& b = kRamp[i];
      return Mix(a.rgb, b.rgb, (p - a.at) / (b.at - a.at));
    }
  }
  return kRamp.back().rgb;
}

uint32_t HeatRgb(uint64_t count, uint64_t max, HeatScale scale) {
  if (count == 0 || max == 0) {
    return kEmptyHeatRgb;
  }
  return HeatRampRgb(HeatPosition(count, max, scale));
}

HeatLevels MakeHeatLevels(uint64_t max, int levels, HeatScale scale) {
  HeatLevels s;
  const auto n = static_cast<uint64_t>(std::max(levels, 1));
  for (uint64_t l = 1; l <= n; ++l) {
    uint64_t u = max;
    if (l < n && scale == HeatScale::kLog) {
      const double x =
          std::pow(static_cast<double>(max), static_cast<double>(l) / static_cast<double>(n));
      u = std::min(max, static_cast<uint64_t>(std::floor(x + 1e-9)));
    } else if (l < n) {
      u = max / n * l + max % n * l / n;  // floor(max * l / n) without overflow
    }
    s.upper.push_back(u);
  }
  return s;
}

int HeatLevel(const HeatLevels& levels, uint64_t count) {
  if (count == 0) {
    return 0;
  }
  for (size_t l = 0; l < levels.upper.size(); ++l) {
    if (count <= levels.upper[l]) {
      return static_cast<int>(l) + 1;
    }
  }
  return static_cast<int>(levels.upper.size());
}

}  // namespace kwatch::watch::profile
