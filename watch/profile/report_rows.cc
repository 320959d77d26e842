#include "watch/profile/report_rows.h"

#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"

namespace kwatch::watch::profile {

ThreadSelection::ThreadSelection(const StorageProfile& profile, const std::vector<pid_t>& tids)
    : p_(profile), filtered_(!tids.empty()), on_(profile.threads().size(), tids.empty()) {
  for (const pid_t tid : tids) {
    const uint32_t t = profile.ThreadIndex(tid);
    if (t != StorageProfile::kNone && !on_[t]) {
      on_[t] = true;
      chosen_.push_back(t);
    }
  }
  std::sort(chosen_.begin(), chosen_.end());
}

std::vector<uint32_t> ThreadSelection::SelectedThreads() const {
  if (filtered_) {
    return chosen_;
  }
  std::vector<uint32_t> all(p_.threads().size());
  for (uint32_t t = 0; t < all.size(); ++t) {
    all[t] = t;
  }
  return all;
}

RwCounts ThreadSelection::FieldCounts(uint32_t field) const {
  if (!filtered_) {
    return p_.field_counts(field);
  }
  RwCounts c;
  for (const uint32_t t : chosen_) {
    c += p_.ThreadFieldCounts(t, field);
  }
  return c;
}

uint32_t ThreadSelection::FieldThreads(uint32_t field) const {
  if (!filtered_) {
    return p_.FieldThreadCount(field);
  }
  uint32_t n = 0;
  for (const uint32_t t : chosen_) {
    n += p_.ThreadFieldCounts(t, field).total() > 0 ? 1 : 0;
  }
  return n;
}

std::vector<uint64_t> ThreadSelection::FieldHeat(uint32_t field, bool writes) const {
  std::vector<uint64_t> out(p_.bins().columns(), 0);
  auto add = [&out](const auto& row) {
    for (size_t c = 0; c < out.size() && c < row.size(); ++c) {
      out[c] += row[c];
    }
  };
  if (!filtered_) {
    add(p_.FieldBins(field, writes));
    return out;
  }
  for (const uint32_t t : chosen_) {
    if (p_.ThreadFieldCounts(t, field).total() > 0) {
      add(p_.ThreadFieldBins(t, field, writes));
    }
  }
  return out;
}

bool FieldShown(const ReportSelection& sel, const std::string& path) {
  if (!sel.field_filter.empty() && !absl::StrContains(path, sel.field_filter)) {
    return false;
  }
  if (!sel.path_prefix.empty()) {
    if (!absl::StartsWith(path, sel.path_prefix)) {
      return false;
    }
    const size_t n = sel.path_prefix.size();
    if (path.size() > n && path[n] != '.' && path[n] != '[' && path.compare(n, 2, "->") != 0) {
      return false;
    }
  }
  return true;
}

namespace {

WatchRows BuildWatch(const StorageProfile& p, const ThreadSelection& threads,
                     const std::vector<bool>& shown, uint32_t obj) {
  WatchRows w;
  w.object = obj;
  const auto [begin, end] = p.FieldRange(obj);
  absl::flat_hash_map<core::RemoteAddr, std::vector<uint32_t>> site_fields;
  for (uint32_t f = begin; f < end; ++f) {
    if (!shown[f]) {
      continue;
    }
    FieldRow r;
    r.field = f;
    r.counts = threads.FieldCounts(f);
    r.threads = threads.FieldThreads(f);
    r.sites = p.FieldSites(f);
    r.other_sites = p.FieldOtherSites(f);
    if (r.counts.total() > 0) {  // else no columns: the heat of an untouched field is zeros
      r.reads = threads.FieldHeat(f, false);
      r.writes = threads.FieldHeat(f, true);
    }
    for (const SiteCount& s : r.sites) {
      site_fields[s.ip].push_back(f);
    }
    w.fields.push_back(std::move(r));
  }
  for (const SiteCount& s : p.ObjectSites(obj)) {
    SiteRow row{s, {}};
    if (auto it = site_fields.find(s.ip); it != site_fields.end()) {
      row.fields = std::move(it->second);
    }
    w.sites.push_back(std::move(row));
  }
  return w;
}

}  // namespace

ReportRows BuildReportRows(const StorageProfile& profile, const ReportSelection& sel) {
  const ThreadSelection threads(profile, sel.threads);
  std::vector<bool> shown(profile.fields().size());
  for (uint32_t f = 0; f < shown.size(); ++f) {
    shown[f] = FieldShown(sel, profile.fields()[f].path);
  }
  ReportRows rows;
  for (uint32_t obj = 0; obj < profile.objects().size(); ++obj) {
    rows.watches.push_back(BuildWatch(profile, threads, shown, obj));
  }
  // Per thread, its shown fields, watch by watch: one pass over the fields each thread touched.
  for (const uint32_t t : threads.SelectedThreads()) {
    ThreadRow* row = nullptr;
    uint32_t row_object = StorageProfile::kNone;
    for (const auto& [f, c] : profile.ThreadFields(t)) {  // by field: watch by watch
      if (!shown[f] || c.total() == 0) {
        continue;
      }
      const uint32_t obj = profile.fields()[f].object;
      if (obj != row_object) {
        row = &rows.watches[obj].threads.emplace_back();
        row->thread = t;
        row_object = obj;
      }
      row->total += c;
      row->fields.emplace_back(f, c);
    }
  }
  for (FalseSharingFinding& f : profile.FalseSharing(sel.top_sites)) {
    const bool shown_finding = std::any_of(f.threads.begin(), f.threads.end(), [&](const auto& tw) {
      return threads.Selected(tw.thread);
    });
    if (shown_finding) {
      rows.false_sharing.push_back(std::move(f));
    }
  }
  return rows;
}

}  // namespace kwatch::watch::profile
