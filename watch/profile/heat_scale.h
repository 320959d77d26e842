#pragma once

#include <cstdint>
#include <vector>

namespace kwatch::watch::profile {

// kwatch's one heat scale: how an access count in a heatmap cell becomes a position on the
// colour ramp, a colour (PNG, GUI) and a level (the text report's shading blocks). Pure
// functions of (count, max, scale), so a count has the same colour in every front end.
//
// Positions are in [0, 1] over the counts 1..max (count 0 is the empty cell, drawn apart):
//   linear: count / max;
//   log:    log(count) / log(max) (count 1 at 0, max at 1; 0 when max <= 1).

// Values match gui::Scale's combo-box data (0 linear, 1 log).
enum class HeatScale : uint8_t { kLinear = 0, kLog = 1 };

// The position of `count` on the scale for a view whose largest count is `max`: 0 when count
// or max is 0; counts above max are clamped to max. Monotonic in count.
double HeatPosition(uint64_t count, uint64_t max, HeatScale scale);
// The inverse, for legends: the count drawn at `position` (clamped to [0, 1]), rounded to the
// nearest integer, in [1, max] (0 when max is 0).
uint64_t HeatCountAt(double position, uint64_t max, HeatScale scale);

// Colours are 0xRRGGBB.
// The colour of empty cells (count 0): light grey, lighter than no ramp colour but distinct.
inline constexpr uint32_t kEmptyHeatRgb = 0xececec;
// The ramp at `position` (clamped to [0, 1]): a sequential ramp (ColorBrewer YlOrRd extended to
// dark purple) from pale yellow (0, few accesses) to dark purple (1, the most); lightness
// decreases monotonically.
uint32_t HeatRampRgb(double position);
// The colour of a cell: kEmptyHeatRgb for count 0 (or max 0), else HeatRampRgb(HeatPosition).
uint32_t HeatRgb(uint64_t count, uint64_t max, HeatScale scale);

// The scale cut into `levels` levels of counts up to `max` (the text report's shading), the
// darkest ending at max: upper[k] is the largest count drawn at level k+1 (count 0 is level 0,
// blank; a level whose upper bound does not exceed the previous one is unused). A count's level
// is max(1, ceil(levels * HeatPosition(count, max, scale))), computed exactly in integers:
// linear, upper[k] = floor(max*(k+1)/levels) (max 16, 4 levels: 1-4, 5-8, 9-12, 13-16);
// log, upper[k] = floor(max^((k+1)/levels)) (max 16: 1-2, 3-4, 5-8, 9-16).
struct HeatLevels {
  std::vector<uint64_t> upper;
};
HeatLevels MakeHeatLevels(uint64_t max, int levels, HeatScale scale);
// 0 for count 0, else in [1, upper.size()].
int HeatLevel(const HeatLevels& levels, uint64_t count);

}  // namespace kwatch::watch::profile
