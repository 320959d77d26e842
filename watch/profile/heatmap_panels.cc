#include "watch/profile/heatmap_panels.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"

namespace kwatch::watch::profile {

std::vector<HeatmapPanel> HeatmapPanels(const StorageProfile& profile,
                                        const std::string& field_filter) {
  std::vector<HeatmapPanel> panels;
  const TimeBins& bins = profile.bins();
  for (uint32_t obj = 0; obj < profile.objects().size(); ++obj) {
    const WatchedObject& o = profile.objects()[obj];
    HeatmapPanel p;
    p.title = o.type_name.empty()
                  ? absl::StrFormat("%s  (%d bytes at 0x%x)", o.expr, o.length, o.addr.value)
                  : absl::StrFormat("%s  (%s, %d bytes at 0x%x)", o.expr, o.type_name, o.length,
                                    o.addr.value);
    p.columns = std::max<uint32_t>(bins.columns(), 1);
    p.bucket_ns = bins.width_ns();
    p.start_ns = bins.ColumnStartNs(0);
    const auto [first, last] = profile.FieldRange(obj);
    for (uint32_t f = first; f < last; ++f) {
      const FieldInfo& fi = profile.fields()[f];
      if (!field_filter.empty() && fi.path.find(field_filter) == std::string::npos) {
        continue;
      }
      p.rows.push_back(fi.path);
      p.row_lines.push_back((o.addr.value + fi.begin) / 64);
      const auto reads = profile.FieldBins(f, false);
      const auto writes = profile.FieldBins(f, true);
      for (size_t c = 0; c < p.columns; ++c) {
        p.counts.push_back((c < reads.size() ? reads[c] : 0) + (c < writes.size() ? writes[c] : 0));
      }
    }
    if (!p.rows.empty()) {
      panels.push_back(std::move(p));
    }
  }
  return panels;
}

}  // namespace kwatch::watch::profile
