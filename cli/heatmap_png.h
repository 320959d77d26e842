#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "watch/profile/heatmap_panels.h"

namespace kwatch::cli {

using watch::profile::HeatmapPanel;

// Writes the panels, one under the other, with field labels, a time axis in seconds, cache
// line separators and a legend, as a PNG (cairo, no display needed). Cells are coloured by
// kwatch's one heat scale (watch/profile/heat_scale.h: watch::HeatRgb of the cell's count, the
// largest count of all panels, and linear or, with `log_scale`, log), as kwatch-gui colours
// them. Names (panel titles, row labels, the subtitle) are drawn escaped as
// core::Printable shows them. Errors name the path; InvalidArgument when the image would be
// more than 32767 pixels tall or 64 million pixels in all (too many fields or columns).
absl::Status WriteHeatmapPng(const std::vector<HeatmapPanel>& panels, const std::string& subtitle,
                             bool log_scale, const std::string& path);

}  // namespace kwatch::cli
