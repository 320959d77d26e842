#pragma once

#include <cstdint>

#include <QColor>

namespace kwatch::gui {

// How counts map to colours: linearly, or logarithmically over kLogRange (so that counts down
// to 1/kLogRange of the maximum stay visible).
enum class Scale : uint8_t { kLinear = 0, kLog = 1 };

inline constexpr double kLogRange = 1024.0;

// Position on the colour ramp, in [0, 1], of a count that is the fraction `t` of the maximum
// (t in [0, 1]; values outside are clamped). Linear: t. Log: log(1 + t) / log(R) with R =
// kLogRange. Monotonic; 0 maps to 0 and 1 to 1.
double ScalePosition(double t, Scale s);
// The inverse of ScalePosition: the fraction of the maximum drawn at ramp position `p`.
double ScaleFraction(double p, Scale s);

// The colour of a cell whose count is the fraction `t` of the maximum: exactly 0 is the empty
// colour (light grey); any t > 0 is on a pale-yellow to orange to red to dark-purple ramp at
// ScalePosition(t, s), so the smallest non-zero count stays distinguishable from none.
QColor HeatColor(double t, Scale s);

// The colour of empty cells.
QColor EmptyHeatColor();

}  // namespace kwatch::gui
