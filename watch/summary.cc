#include "watch/summary.h"

#include "absl/strings/str_cat.h"

namespace kwatch::watch {

std::string WatchFieldName(const Watch& w) {
  if (!w.target.layout.has_value()) {
    return w.target.display;
  }
  const core::FieldLayout* only = nullptr;
  int leaves = 0;
  for (const auto& f : w.target.layout->fields) {
    if (!f.is_leaf) {
      continue;
    }
    const uint64_t end = f.offset + (f.size == 0 ? 1 : f.size);
    if (f.offset < w.target.length && end > 0) {
      ++leaves;
      only = &f;
    }
  }
  if (leaves == 1 && only != nullptr) {
    return absl::StrCat(w.target.display, only->path);
  }
  return w.target.display;
}

Summary::Summary(const std::vector<Watch>& watches) : counts_(watches.size()) {
  field_names_.reserve(watches.size());
  for (const auto& w : watches) {
    field_names_.push_back(WatchFieldName(w));
  }
}

void Summary::Add(const core::AccessEvent& ev) {
  ++events_;
  WatchCounts& c = counts_[ev.watch_id];
  c.total.Add(ev.kind);
  c.fields[field_names_[ev.watch_id]].Add(ev.kind);
  c.threads[ev.tid].Add(ev.kind);
  c.sites[ev.ip].Add(ev.kind);
}

}  // namespace kwatch::watch
