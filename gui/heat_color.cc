#include "gui/heat_color.h"

#include <algorithm>
#include <array>
#include <cmath>

namespace kwatch::gui {

namespace {

struct Stop {
  double at;
  int r, g, b;
};

// A sequential ramp (ColorBrewer YlOrRd extended to dark purple): light means few accesses.
constexpr std::array<Stop, 6> kRamp = {{{0.0, 255, 240, 168},
                                        {0.2, 254, 204, 92},
                                        {0.4, 253, 141, 60},
                                        {0.6, 240, 59, 32},
                                        {0.8, 189, 0, 38},
                                        {1.0, 84, 0, 74}}};

}  // namespace

double ScalePosition(double t, Scale s) {
  t = std::clamp(t, 0.0, 1.0);
  if (s == Scale::kLinear) {
    return t;
  }
  return std::log1p(t * (kLogRange - 1.0)) / std::log(kLogRange);
}

double ScaleFraction(double p, Scale s) {
  p = std::clamp(p, 0.0, 1.0);
  if (s == Scale::kLinear) {
    return p;
  }
  return std::expm1(p * std::log(kLogRange)) / (kLogRange - 1.0);
}

QColor EmptyHeatColor() {
  return QColor(236, 236, 236);
}

QColor HeatColor(double t, Scale s) {
  if (!(t > 0.0)) {
    return EmptyHeatColor();
  }
  const double p = ScalePosition(t, s);
  for (size_t i = 1; i < kRamp.size(); ++i) {
    if (p <= kRamp[i].at) {
      const Stop& a = kRamp[i - 1];
      const Stop& b = kRamp[i];
      const double u = (p - a.at) / (b.at - a.at);
      auto mix = [u](int x, int y) { return static_cast<int>(std::lround(x + (y - x) * u)); };
      return QColor(mix(a.r, b.r), mix(a.g, b.g), mix(a.b, b.b));
    }
  }
  return QColor(kRamp.back().r, kRamp.back().g, kRamp.back().b);
}

}  // namespace kwatch::gui
