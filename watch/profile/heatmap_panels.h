#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "watch/profile/storage_profile.h"

namespace kwatch::watch::profile {

// One heatmap panel of a storage profile (an image's, as `kwatch report --png` draws it):
// fields (rows, in layout order) x time buckets (columns).
struct HeatmapPanel {
  std::string title;                // e.g. "g_stats  (struct stats, 40 bytes at 0x4040)"
  std::vector<std::string> rows;    // field labels
  std::vector<uint64_t> row_lines;  // cache line (absolute address / 64) of each row
  uint64_t start_ns = 0;            // time of column 0, relative to the session start
  uint64_t bucket_ns = 1;           // width of a column
  size_t columns = 0;
  std::vector<uint64_t> counts;  // rows.size() * columns, row-major
};

// The panels of a profile, one per watched object with a shown field: rows are its fields in
// layout order (those whose path contains `field_filter`, all when empty), cells are reads +
// writes per time column of the profile (at least one column).
std::vector<HeatmapPanel> HeatmapPanels(const StorageProfile& profile,
                                        const std::string& field_filter);

}  // namespace kwatch::watch::profile
