#include "watch/kernel/kernel_event.h"

#include <algorithm>

namespace kwatch::watch::kernel {

void SiteTally::Add(const PerfSample& s) {
  SiteStat& st = by_ip[s.ip];
  ++st.events;
  st.tids.insert(s.tid);
  st.cpus.insert(s.cpu);
  auto [it, fresh] = last_ip.try_emplace({s.cpu, s.tid}, s.ip);
  if (!fresh) {
    if (it->second == s.ip) {
      if (repeated++ == 0) {
        first_repeated_ip = s.ip;
      }
    }
    it->second = s.ip;
  }
}

std::vector<std::pair<uint64_t, const SiteStat*>> SitesByEvents(const SiteTally& t) {
  std::vector<std::pair<uint64_t, const SiteStat*>> out;
  for (const auto& [ip, st] : t.by_ip) {
    out.emplace_back(ip, &st);
  }
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return a.second->events > b.second->events;
  });
  return out;
}

}  // namespace kwatch::watch::kernel
