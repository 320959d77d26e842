#include "watch/profile/false_sharing.h"

#include <algorithm>

namespace kwatch::watch::profile {

void RecordLineWrite(CacheLine& line, uint32_t thread, uint64_t mask, const uint32_t* positions,
                     uint32_t n_positions, core::RemoteAddr ip, uint64_t t_ns, uint64_t window_ns,
                     uint32_t site_capacity) {
  LineWriter* w = nullptr;
  for (LineWriter& cand : line.writers) {
    if (cand.thread == thread) {
      w = &cand;
      break;
    }
  }
  if (w == nullptr) {
    LineWriter& added = line.writers.emplace_back();
    added.thread = thread;
    added.field_writes.assign(line.fields.size(), 0);
    added.sites = SiteTable(site_capacity);
    w = &added;
  }
  ++w->writes;
  w->mask |= mask;
  for (uint32_t i = 0; i < n_positions; ++i) {
    ++w->field_writes[positions[i]];
  }
  w->sites.Add(ip, /*write=*/true);
  ++line.writes;

  if (line.last_thread != CacheLine::kNoThread && line.last_thread != thread &&
      (t_ns < line.last_ns || t_ns - line.last_ns <= window_ns)) {
    uint64_t previous = line.last_mask;
    for (const LineWriter& other : line.writers) {
      if (other.thread == line.last_thread) {
        previous |= other.mask;
        break;
      }
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
      for (size_t p = 0; p < line.fields.size(); ++p) {
        if (w.field_writes[p] != 0) {
          tw.fields.emplace_back(line.fields[p], w.field_writes[p]);
          ++writers_per_field[p];
        }
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
