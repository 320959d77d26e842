#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "core/store/trace_records.h"
#include "watch/profile/storage_profile.h"
#include "watch/recording.h"
#include "watch/recording_window.h"

namespace kwatch::gui {

struct Snapshot;

// What to load from a recording.
struct LoadRequest {
  std::string path;
  // Times are nanoseconds after the session's start: [from_ns, to_ns), unset = unbounded.
  std::optional<uint64_t> from_ns;
  std::optional<uint64_t> to_ns;
  std::optional<pid_t> tid;  // only this thread's events
  // About this many time columns over the session (the profile doubles the width as needed).
  uint32_t columns = 240;
  // Read the source lines around each site (the main load does; slices reuse them).
  bool read_sources = true;
  // When set and the file still holds this many events and is as complete as `known_complete`,
  // the load stops early and returns a snapshot with `unchanged` set (follow mode).
  std::optional<uint64_t> known_events;
  bool known_complete = false;
  // Follow mode: the last main snapshot of this file. While the recording is still being
  // written (and was when `base` loaded), only the events committed after base's are read and
  // added to a copy of its profile (Snapshot::incremental).
  std::shared_ptr<const Snapshot> base;
};

// Source text around a site: lines [first_line, first_line + lines.size()).
struct SourceSnippet {
  std::string file;  // as the recording names it
  int first_line = 0;
  int line = 0;  // the site's line
  std::vector<std::string> lines;
};

// One immutable load of a recording: its session, sites and the storage profile of the
// requested slice. Built on a worker thread, then shared read-only (std::shared_ptr<const>).
struct Snapshot {
  LoadRequest request;
  bool unchanged = false;    // follow mode: nothing new since request.known_events (no profile)
  bool incremental = false;  // follow mode: request.base's profile plus the newer events
  uint64_t events_read = 0;  // events read from the file by an incremental load
  core::store::SessionRecord session;
  bool complete = false;
  std::optional<core::store::SessionEnd> end;
  uint64_t recorded_events = 0;  // events in the file (all threads and times)
  std::vector<core::store::WatchRecord> watches;
  // The probe session's aggregations (kwatch probe -o F --agg), as kwatch printed them at its end.
  std::vector<core::store::AggregateRecord> aggregates;
  absl::flat_hash_map<uint64_t, core::store::SiteRecord> sites;  // by ip
  absl::flat_hash_map<uint64_t, SourceSnippet> sources;          // by ip, readable sources only
  std::optional<watch::profile::StorageProfile> profile;         // unset only when `unchanged`
  double load_seconds = 0;

  // Session length in ns: to the end record, else to the last event (0 when unknown).
  uint64_t SpanNs() const;
};

using SnapshotPtr = std::shared_ptr<const Snapshot>;

// The heatmap of a time window at the resolution of its own columns (the viewer zoomed in):
// request.from_ns/to_ns (both set), request.columns, request.tid.
struct ZoomGrid {
  LoadRequest request;
  uint64_t recorded_events = 0;  // events in the file when it was read
  watch::WindowHeat heat;
  double load_seconds = 0;
};
using ZoomPtr = std::shared_ptr<const ZoomGrid>;

// Reads the window's counts (watch::HeatInWindow: profile_bins at the finest level that fits,
// events only at the columns' edges). Errors as LoadSnapshot's; InvalidArgument without a
// window.
absl::StatusOr<ZoomPtr> LoadZoom(const LoadRequest& req);

// Opens `req.path` and builds its snapshot. Errors are TraceReader's (NotFound, DataLoss for a
// corrupted file, InvalidArgument for another SQLite database, FailedPrecondition for a newer
// schema), with the path in the message.
absl::StatusOr<SnapshotPtr> LoadSnapshot(const LoadRequest& req);

// Lines [line - context, line + context] of `file` (1-based `line`); nullopt when the file is
// unreadable, not a regular file, larger than 8 MiB (also when it says otherwise, as /proc
// files do), or shorter than `line`. Lines longer than 1000 bytes are cut (" [...]").
std::optional<SourceSnippet> ReadSourceSnippet(const std::string& file, int line, int context);

}  // namespace kwatch::gui
