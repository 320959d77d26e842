#include "watch/profile/false_sharing.h"

#include <algorithm>
#include <cstddef>

namespace kwatch::watch::profile {

void RecordLineWrite(CacheLine& line, uint32_t thread, uint64_t mask, const uint32_t* positions,
                     uint32_t n_positions, core::RemoteAddr ip, uint64_t t_ns, uint64_t window_ns,
                     uint32_t site_capacity) {
  const auto [slot, added] =
      line.writer_index.try_emplace(thread, static_cast<uint32_t>(line.writers.size()));
  if (added) {
    LineWriter& writer = line.writers.emplace_back();
    writer.thread = thread;
    writer.sites = SiteTable(site_capacity);
  }
  LineWriter* w = &line.writers[slot->second];
  ++w->writes;
  w->mask |= mask;
  // Positions arrive ascending (one pass); field_writes stays sorted by position.
  auto& fw = w->field_writes;
  size_t j = 0;
  for (uint32_t i = 0; i < n_positions; ++i) {
    const uint32_t pos = positions[i];
    if (i > 0 && pos < positions[i - 1]) {
      j = 0;  // not ascending after all: search from the start
    }
    while (j < fw.size() && fw[j].first < pos) {
      ++j;
    }
    if (j < fw.size() && fw[j].first == pos) {
      ++fw[j].second;
    } else {
      fw.insert(fw.begin() + static_cast<std::ptrdiff_t>(j), {pos, 1});
    }
    ++j;
  }
  w->sites.Add(ip, /*write=*/true);
  ++line.writes;

  if (line.last_thread != CacheLine::kNoThread && line.last_thread != thread &&
      (t_ns < line.last_ns || t_ns - line.last_ns <= window_ns)) {
    uint64_t previous = line.last_mask;
    if (const auto it = line.writer_index.find(line.last_thread); it != line.writer_index.end()) {
      previous |= line.writers[it->second].mask;
    }
    if ((mask & previous) != 0) {
      ++line.true_transfers;
    } else {
      if (line.false_transfers == 0) {
        line.first_false_ns = t_ns;
      }
      ++line.false_transfers;
      line.first_false_ns = std::min(line.first_false_ns, t_ns);
      line.last_false_ns = std::max(line.last_false_ns, t_ns);
    }
  }
  line.last_thread = thread;
  line.last_mask = mask;
  line.last_ns = t_ns;
}

std::vector<FalseSharingFinding> FindFalseSharing(const std::vector<CacheLine>& lines,
                                                  uint64_t min_transfers, size_t top_sites) {
  std::vector<FalseSharingFinding> out;
  for (size_t li = 0; li < lines.size(); ++li) {
    const CacheLine& line = lines[li];
    if (line.false_transfers == 0 || line.false_transfers < min_transfers ||
        line.false_transfers < line.true_transfers) {
      continue;
    }
    FalseSharingFinding f;
    f.line = static_cast<uint32_t>(li);
    f.addr = line.addr;
    f.fields = line.fields;
    f.false_transfers = line.false_transfers;
    f.true_transfers = line.true_transfers;
    f.first_ns = line.first_false_ns;
    f.last_ns = line.last_false_ns;
    std::vector<uint32_t> writers_per_field(line.fields.size(), 0);
    for (const LineWriter& w : line.writers) {
      FalseSharingFinding::ThreadWrites tw;
      tw.thread = w.thread;
      tw.writes = w.writes;
      for (const auto& [p, n] : w.field_writes) {
        tw.fields.emplace_back(line.fields[p], n);
        ++writers_per_field[p];
      }
      tw.top_sites = w.sites.Ranked();
      if (tw.top_sites.size() > top_sites) {
        tw.top_sites.resize(top_sites);
      }
      tw.other_sites = w.sites.other();
      f.threads.push_back(std::move(tw));
    }
    for (size_t p = 0; p < line.fields.size(); ++p) {
      if (writers_per_field[p] > 1) {
        f.shared_fields.push_back(line.fields[p]);
      }
    }
    std::stable_sort(f.threads.begin(), f.threads.end(),
                     [](const auto& a, const auto& b) { return a.writes > b.writes; });
    out.push_back(std::move(f));
  }
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return a.false_transfers > b.false_transfers;
  });
  return out;
}

}  // namespace kwatch::watch::profile
