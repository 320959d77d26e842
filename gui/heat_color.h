#pragma once

#include <cstdint>

#include <QColor>

#include "watch/profile/heat_scale.h"

namespace kwatch::gui {

// How counts map to colours: linearly, or logarithmically from 1 to the maximum. kwatch's one
// heat scale (watch/profile/heat_scale.h), shared with `kwatch report` (PNG and text levels).
using Scale = watch::profile::HeatScale;

// Thin QColor wrappers over the pure functions of watch/profile/heat_scale.h, so a count has
// the same colour here as in kwatch's PNG heatmap.

// The colour of a cell with `count` accesses in a view whose largest count is `max`: count 0
// (or max 0) is the empty colour; any other count is on the pale-yellow to orange to red to
// dark-purple ramp at watch::HeatPosition(count, max, s), so the smallest non-zero count stays
// distinguishable from none and the maximum is the darkest colour.
QColor HeatColor(uint64_t count, uint64_t max, Scale s);

// The ramp's colour at `position` in [0, 1] (clamped; for legends): watch::HeatRampRgb.
QColor HeatRampColor(double position);

// The colour of empty cells (watch::kEmptyHeatRgb).
QColor EmptyHeatColor();

}  // namespace kwatch::gui
