#pragma once

#include <string>
#include <vector>

#include "cli/heatmap_png.h"
#include "watch/profile/storage_profile.h"

namespace kwatch::cli {

// `kwatch report FILE [...]`: the storage profile (and probe hits) of a recording. `args`
// are the arguments after "report". Returns the exit status (0, 1 error, 2 usage).
int ReportMain(const std::vector<std::string>& args);

// Heatmap panels of a profile, one per watched object: rows are its fields in layout order
// (those whose path contains `field_filter`, all when empty), cells are reads + writes per
// time column.
std::vector<HeatmapPanel> HeatmapPanels(const watch::StorageProfile& profile,
                                        const std::string& field_filter);

}  // namespace kwatch::cli
