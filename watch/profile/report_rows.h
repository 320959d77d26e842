#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "watch/profile/false_sharing.h"
#include "watch/profile/profile_types.h"
#include "watch/profile/storage_profile.h"

namespace kwatch::watch::profile {

// The report model: what a storage-profile report shows, computed once from a profile and a
// selection, and rendered by the front ends (cli: text, JSON, CSV; gui: its models) without
// computing anything of their own beyond layout.

// The threads whose accesses count: all of them, or those listed (by tid). Tids absent from
// the profile select nothing. Holds a reference to the profile; not thread-safe (read-only use
// from several threads is fine).
class ThreadSelection {
 public:
  // `tids` empty: every thread.
  ThreadSelection(const StorageProfile& profile, const std::vector<pid_t>& tids);

  bool filtered() const { return filtered_; }
  bool Selected(uint32_t thread) const { return on_[thread]; }
  // The selected threads (indices into StorageProfile::threads()), ascending; all of them
  // when not filtered.
  std::vector<uint32_t> SelectedThreads() const;
  // The field's accesses by the selected threads.
  RwCounts FieldCounts(uint32_t field) const;
  // Selected threads that touched the field.
  uint32_t FieldThreads(uint32_t field) const;
  // Per time column (profile.bins().columns() of them): the field's reads or writes by the
  // selected threads.
  std::vector<uint64_t> FieldHeat(uint32_t field, bool writes) const;

 private:
  const StorageProfile& p_;
  bool filtered_;
  std::vector<bool> on_;          // per profile thread
  std::vector<uint32_t> chosen_;  // filtered: the selected threads, ascending
};

// Which part of a profile a report shows.
struct ReportSelection {
  // Fields shown: those whose path contains `field_filter` ("" = all) and, when `path_prefix`
  // is set, whose path is it or continues it with a member or element ("g.lines" keeps
  // "g.lines[3].tag", "g.lines.n" and "g.p->x" but not "g.lines_used").
  std::string field_filter;
  std::string path_prefix;
  // Threads whose accesses count (field counts, heat, per-thread rows), by tid; empty = all.
  // Sites are kept per field for all threads together, so sites stay unfiltered.
  // False-sharing findings are kept when one of these threads took part.
  std::vector<pid_t> threads;
  size_t top_sites = 5;  // sites kept per false-sharing thread
};

// True when `path` is shown under the selection's field filter and path prefix.
bool FieldShown(const ReportSelection& sel, const std::string& path);

// One shown field of a watch.
struct FieldRow {
  uint32_t field = 0;            // global index into StorageProfile::fields()
  RwCounts counts;               // by the selected threads
  uint32_t threads = 0;          // selected threads that touched it
  std::vector<SiteCount> sites;  // all threads, ranked (the profile's bounded site table)
  RwCounts other_sites;          // accesses beyond the site table
  // Per time column, by the selected threads; empty (all zeros) when `counts` is zero, so
  // that untouched fields cost no columns.
  std::vector<uint64_t> reads;
  std::vector<uint64_t> writes;
};

// A site of a watch (all threads) with the shown fields it touched, in layout order.
struct SiteRow {
  SiteCount site;
  std::vector<uint32_t> fields;  // empty: it touched only fields not shown
};

// A selected thread that touched shown fields: its counts per shown field (non-zero only).
struct ThreadRow {
  uint32_t thread = 0;                                // index into StorageProfile::threads()
  RwCounts total;                                     // over its shown fields
  std::vector<std::pair<uint32_t, RwCounts>> fields;  // (global field, counts), layout order
};

struct WatchRows {
  uint32_t object = 0;             // index into StorageProfile::objects()
  std::vector<FieldRow> fields;    // shown fields, layout order (may be empty)
  std::vector<SiteRow> sites;      // the watch's sites, ranked
  std::vector<ThreadRow> threads;  // selected threads with accesses to shown fields, by index
};

struct ReportRows {
  std::vector<WatchRows> watches;  // one per watched object, in order
  // Findings where a selected thread took part, as StorageProfile::FalseSharing ranks them.
  std::vector<FalseSharingFinding> false_sharing;
};

// Builds the rows. O(fields x (columns + selected threads when filtered) + (thread, field)
// pairs x log) plus the profile's false-sharing scan.
ReportRows BuildReportRows(const StorageProfile& profile, const ReportSelection& sel);

}  // namespace kwatch::watch::profile
