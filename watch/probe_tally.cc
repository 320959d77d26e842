#include "watch/probe_tally.h"

#include <algorithm>

namespace kwatch::watch {

absl::StatusOr<std::map<uint32_t, ProbeTally>> TallyHits(const core::store::TraceReader& reader,
                                                         const RecordingSlice& slice) {
  std::map<uint32_t, ProbeTally> out;
  const core::store::HitFilter f = HitFilterOf(reader, slice);
  absl::Status st = reader.ForEachHit(f, [&](const core::store::HitRecord& h) {
    ProbeTally& t = out[h.probe_id];
    ++t.hits;
    ++t.threads[h.tid];
    for (size_t i = 0; i < h.args.size(); ++i) {
      if (t.args.size() <= i) {
        t.args.emplace_back(h.args[i].first, std::map<std::string, uint64_t>{});
        t.other_values.push_back(0);
      }
      auto& values = t.args[i].second;
      auto it = values.find(h.args[i].second);
      if (it != values.end()) {
        ++it->second;
      } else if (values.size() < ProbeTally::kMaxValues) {
        values.emplace(h.args[i].second, 1);
      } else {
        ++t.other_values[i];
      }
    }
    return true;
  });
  if (!st.ok()) {
    return st;
  }
  return out;
}

std::vector<std::pair<std::string, uint64_t>> TopValues(const std::map<std::string, uint64_t>& m,
                                                        size_t n) {
  std::vector<std::pair<std::string, uint64_t>> v(m.begin(), m.end());
  std::stable_sort(v.begin(), v.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  if (v.size() > n) {
    v.resize(n);
  }
  return v;
}

}  // namespace kwatch::watch
