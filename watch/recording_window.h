#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "core/store/trace_reader.h"
#include "watch/profile/storage_profile.h"

namespace kwatch::watch {

// The accesses per field in the time columns of one window of a recording: what a viewer
// zoomed into [from_ns, to_ns) shows. Times are ns after the session's start.
struct WindowHeat {
  uint64_t from_ns = 0;
  uint64_t to_ns = 0;
  uint64_t column_ns = 0;  // column c is [from + c * column_ns, min(to, from + (c+1) * ...))
  uint32_t columns = 0;
  // Per global field index (the report's numbering, profile_bins' `field`): reads and writes
  // per column. Only fields with accesses in the window.
  absl::flat_hash_map<uint32_t, std::vector<profile::RwCounts>> fields;
  // How it was read: the finest profile_bins level used (-1: none), how many range reads of
  // profile_bins, and how many events were decoded (the columns' edges inside a 16.8 ms bin,
  // and the events committed after the recording's profile).
  int finest_level = -1;
  uint64_t bin_reads = 0;
  uint64_t events_read = 0;

  uint64_t ColumnStartNs(uint32_t c) const { return from_ns + uint64_t{c} * column_ns; }
};

// Counts the accesses (reads and writes; executions are not counted, as in profile_bins) of
// each field in `columns` equal columns over [from_ns, to_ns), by every thread or only `tid`,
// exactly as a replay of the window's events would. Reads the recording's profile_bins (the
// coarsest bins that lie inside a column, at every level down to 16.8 ms) and the events of
// the 16.8 ms bins the column edges cut, plus the window's events committed after the profile
// (a live recording), whatever the order of the batches; a recording without bins (older
// schema, a profile too large to keep) is read event by event. Time grows with the columns and the
// log of the window's length, not with its events. `columns` >= 1, from_ns < to_ns. Errors: the
// reader's; DataLoss for profile_bins naming fields the watches do not have.
absl::StatusOr<WindowHeat> HeatInWindow(const core::store::TraceReader& reader, uint64_t from_ns,
                                        uint64_t to_ns, uint32_t columns, std::optional<pid_t> tid);

}  // namespace kwatch::watch
