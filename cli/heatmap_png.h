#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace kwatch::cli {

// One heatmap panel: fields (rows, in layout order) x time buckets (columns).
struct HeatmapPanel {
  std::string title;                // e.g. "g_stats  (struct stats, 40 bytes)"
  std::vector<std::string> rows;    // field labels
  std::vector<uint64_t> row_lines;  // cache line (absolute address / 64) of each row
  uint64_t start_ns = 0;            // time of column 0, relative to the session start
  uint64_t bucket_ns = 1;           // width of a column
  size_t columns = 0;
  std::vector<uint64_t> counts;  // rows.size() * columns, row-major
};

// Writes the panels, one under the other, with field labels, a time axis in seconds, cache
// line separators and a legend, as a PNG (cairo, no display needed). Cells are coloured by
// kwatch's one heat scale (watch/profile/heat_scale.h: watch::HeatRgb of the cell's count, the
// largest count of all panels, and linear or, with `log_scale`, log), as kwatch-gui colours
// them. Errors name the path.
absl::Status WriteHeatmapPng(const std::vector<HeatmapPanel>& panels, const std::string& subtitle,
                             bool log_scale, const std::string& path);

}  // namespace kwatch::cli
