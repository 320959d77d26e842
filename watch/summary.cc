#include "watch/summary.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace kwatch::watch {

std::string KernelAccessJson(const KernelAccessStats& stats) {
  // Syscall names are plain identifiers ("read", "syscall_512"): nothing to escape.
  std::string out = absl::StrCat("{\"syscall_stops\":", stats.syscall_stops, ",\"syscalls\":[");
  bool first = true;
  for (const auto& [name, c] : stats.syscalls) {
    absl::StrAppendFormat(&out,
                          "%s{\"name\":\"%s\",\"calls\":%d,\"bounced\":%d,\"opened\":%d,"
                          "\"retried\":%d,\"events\":%d,\"unknown\":%d}",
                          first ? "" : ",", name, c.calls, c.bounced, c.opened, c.retried, c.events,
                          c.unknown);
    first = false;
  }
  out += "],\"unprotected\":[";
  first = true;
  for (const auto& [key, u] : stats.unprotected) {
    absl::StrAppendFormat(&out, R"(%s{"page":"0x%x","syscall":"%s","times":%d,"ms":%.3f})",
                          first ? "" : ",", key.first, key.second, u.times,
                          static_cast<double>(u.ns) / 1e6);
    first = false;
  }
  out += "]}";
  return out;
}

std::vector<std::string> KernelAccessLines(const KernelAccessStats& stats) {
  std::vector<std::string> out;
  for (const auto& [name, c] : stats.syscalls) {
    std::vector<std::string> how;
    if (c.bounced > 0) {
      how.push_back(absl::StrCat(c.bounced, " through a scratch buffer"));
    }
    if (c.opened > 0) {
      how.push_back(absl::StrCat(c.opened, " with the page opened, other threads stopped"));
    }
    if (c.retried > 0) {
      how.push_back(absl::StrCat(c.retried, " run again after EFAULT"));
    }
    std::string line = absl::StrCat("kernel: ", name, ": ", c.calls, " call",
                                    c.calls == 1 ? "" : "s", " on watched pages");
    if (!how.empty()) {
      absl::StrAppend(&line, " (", absl::StrJoin(how, ", "), ")");
    }
    if (c.events > 0) {
      absl::StrAppend(&line, "; ", c.events, " exact access", c.events == 1 ? "" : "es",
                      " to watched bytes reported");
    }
    if (c.unknown > 0) {
      absl::StrAppend(&line, "; ", c.unknown, " call", c.unknown == 1 ? "" : "s",
                      " given a pointer into watched bytes, what the kernel did there is not "
                      "known (not counted as events)");
    }
    out.push_back(std::move(line));
  }
  for (const auto& [key, u] : stats.unprotected) {
    out.push_back(absl::StrFormat(
        "kernel: page 0x%x unprotected for %.3f ms during %s() (%d time%s); accesses by other "
        "threads then were not seen",
        key.first, static_cast<double>(u.ns) / 1e6, key.second, u.times, u.times == 1 ? "" : "s"));
  }
  return out;
}

std::vector<std::string> FieldsOverlapping(const std::string& display,
                                           const core::symbols::TypeLayout& layout, uint64_t offset,
                                           uint64_t size) {
  std::vector<std::string> out;
  for (const size_t c : core::symbols::CountedFields(layout.fields)) {
    const core::symbols::FieldLayout& f = layout.fields[c];
    uint64_t lo = f.offset;
    uint64_t hi = f.offset + (f.size == 0 ? 1 : f.size);
    if (f.bit_size > 0) {
      lo = f.offset + f.bit_offset / 8;
      hi = f.offset + (f.bit_offset + f.bit_size + 7) / 8;
    }
    if (lo < offset + size && hi > offset) {
      out.push_back(absl::StrCat(display, f.path));
    }
  }
  return out;
}

std::string WatchFieldName(const Watch& w) {
  if (!w.target.layout.has_value()) {
    return w.target.display;
  }
  const auto names = FieldsOverlapping(w.target.display, *w.target.layout, 0, w.target.length);
  return names.size() == 1 ? names[0] : w.target.display;
}

Summary::Summary(const std::vector<Watch>& watches)
    : watches_(watches), access_names_(watches.size()), counts_(watches.size()) {
  range_names_.reserve(watches.size());
  for (const auto& w : watches) {
    range_names_.push_back({WatchFieldName(w)});
  }
}

const std::vector<std::string>& Summary::FieldNames(const core::AccessEvent& ev) {
  const Watch& w = watches_[ev.watch_id];
  if (ev.access_size == 0 || !w.target.layout.has_value() || ev.access_addr < w.target.addr) {
    return range_names_[ev.watch_id];
  }
  const uint64_t offset = ev.access_addr - w.target.addr;
  const uint64_t key = (offset << 32) | ev.access_size;
  auto& cache = access_names_[ev.watch_id];
  auto it = cache.find(key);
  if (it == cache.end()) {
    auto names = FieldsOverlapping(w.target.display, *w.target.layout, offset, ev.access_size);
    if (names.empty()) {
      names.push_back(absl::StrCat(w.target.display, " (padding +", offset, ")"));
    }
    it = cache.emplace(key, std::move(names)).first;
  }
  return it->second;
}

std::string Summary::FieldLabel(const core::AccessEvent& ev) {
  return absl::StrJoin(FieldNames(ev), ",");
}

void Summary::Add(const core::AccessEvent& ev) {
  ++events_;
  WatchCounts& c = counts_[ev.watch_id];
  c.total.Add(ev.kind);
  for (const std::string& name : FieldNames(ev)) {
    c.fields[name].Add(ev.kind);
  }
  c.threads[ev.tid].Add(ev.kind);
  c.sites[ev.ip].Add(ev.kind);
}

}  // namespace kwatch::watch
