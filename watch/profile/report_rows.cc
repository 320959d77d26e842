#include "watch/profile/report_rows.h"

#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"

namespace kwatch::watch::profile {

ThreadSelection::ThreadSelection(const StorageProfile& profile, const std::vector<pid_t>& tids)
    : p_(profile), filtered_(!tids.empty()), on_(profile.threads().size(), tids.empty()) {
  for (const pid_t tid : tids) {
    const uint32_t t = profile.ThreadIndex(tid);
    if (t != StorageProfile::kNone) {
      on_[t] = true;
    }
  }
}

RwCounts ThreadSelection::FieldCounts(uint32_t field) const {
  if (!filtered_) {
    return p_.field_counts(field);
  }
  RwCounts c;
  for (uint32_t t = 0; t < on_.size(); ++t) {
    if (on_[t]) {
      c += p_.ThreadFieldCounts(t, field);
    }
  }
  return c;
}

uint32_t ThreadSelection::FieldThreads(uint32_t field) const {
  uint32_t n = 0;
  for (uint32_t t = 0; t < on_.size(); ++t) {
    n += on_[t] && p_.ThreadFieldCounts(t, field).total() > 0 ? 1 : 0;
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
  for (uint32_t t = 0; t < on_.size(); ++t) {
    if (on_[t]) {
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

WatchRows BuildWatch(const StorageProfile& p, const ReportSelection& sel,
                     const ThreadSelection& threads, uint32_t obj) {
  WatchRows w;
  w.object = obj;
  const auto [begin, end] = p.FieldRange(obj);
  absl::flat_hash_map<core::RemoteAddr, std::vector<uint32_t>> site_fields;
  for (uint32_t f = begin; f < end; ++f) {
    if (!FieldShown(sel, p.fields()[f].path)) {
      continue;
    }
    FieldRow r;
    r.field = f;
    r.counts = threads.FieldCounts(f);
    r.threads = threads.FieldThreads(f);
    r.sites = p.FieldSites(f);
    r.other_sites = p.FieldOtherSites(f);
    r.reads = threads.FieldHeat(f, false);
    r.writes = threads.FieldHeat(f, true);
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
  for (uint32_t t = 0; t < p.threads().size(); ++t) {
    if (!threads.Selected(t)) {
      continue;
    }
    ThreadRow tr;
    tr.thread = t;
    for (const FieldRow& f : w.fields) {
      const RwCounts& c = p.ThreadFieldCounts(t, f.field);
      if (c.total() > 0) {
        tr.total += c;
        tr.fields.emplace_back(f.field, c);
      }
    }
    if (!tr.fields.empty()) {
      w.threads.push_back(std::move(tr));
    }
  }
  return w;
}

}  // namespace

ReportRows BuildReportRows(const StorageProfile& profile, const ReportSelection& sel) {
  const ThreadSelection threads(profile, sel.threads);
  ReportRows rows;
  for (uint32_t obj = 0; obj < profile.objects().size(); ++obj) {
    rows.watches.push_back(BuildWatch(profile, sel, threads, obj));
  }
  for (FalseSharingFinding& f : profile.FalseSharing(sel.top_sites)) {
    const bool shown = std::any_of(f.threads.begin(), f.threads.end(),
                                   [&](const auto& tw) { return threads.Selected(tw.thread); });
    if (shown) {
      rows.false_sharing.push_back(std::move(f));
    }
  }
  return rows;
}

}  // namespace kwatch::watch::profile
