#include "watch/probe/hit_tally.h"

#include <algorithm>

namespace kwatch::watch::probe {

HitTally::HitTally(const std::vector<ProbeDef>& probes, uint64_t limit) : limit_(limit) {
  for (const ProbeDef& p : probes) {
    per_probe_[p.id];
  }
}

bool HitTally::Add(const ProbeHit& hit) {
  if (done()) {
    return false;
  }
  ++taken_;
  PerProbe& pp = per_probe_[hit.probe->id];
  ++pp.hits;
  for (size_t i = 0; i < hit.args.size(); ++i) {
    if (pp.args.size() <= i) {
      pp.args.push_back(ArgTally{hit.args[i].first, {}, 0});
    }
    ArgTally& t = pp.args[i];
    auto it = t.values.find(hit.args[i].second);
    if (it != t.values.end()) {
      ++it->second;
    } else if (t.values.size() < kMaxValues) {
      t.values.emplace(hit.args[i].second, 1);
    } else {
      ++t.other;
    }
  }
  return true;
}

uint64_t HitTally::hits(uint32_t probe_id) const {
  auto it = per_probe_.find(probe_id);
  return it == per_probe_.end() ? 0 : it->second.hits;
}

const std::vector<HitTally::ArgTally>& HitTally::args(uint32_t probe_id) const {
  static const std::vector<ArgTally> kNone;
  auto it = per_probe_.find(probe_id);
  return it == per_probe_.end() ? kNone : it->second.args;
}

std::vector<std::pair<std::string, uint64_t>> HitTally::Ranked(const ArgTally& t) {
  std::vector<std::pair<std::string, uint64_t>> v(t.values.begin(), t.values.end());
  std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second > b.second : a.first < b.first;
  });
  return v;
}

}  // namespace kwatch::watch::probe
