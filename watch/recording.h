#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/base/remote_addr.h"
#include "core/store/trace_reader.h"
#include "core/store/trace_records.h"
#include "core/store/trace_writer.h"
#include "core/symbols/symbolizer.h"
#include "watch/profile/storage_profile.h"
#include "watch/session.h"

namespace kwatch::watch {

// The recording's row for a session watch: expression, resolved range, kind letters ("r",
// "w", "rw", "x"), the backend that served it and its layout.
core::store::WatchRecord WatchRecordFor(const Watch& w, BackendKind backend);

// The profile's object for a recorded watch (the inverse of WatchRecordFor, as far as the
// profile needs).
profile::WatchedObject ObjectFromRecord(const core::store::WatchRecord& w);

// A code address symbolized for the recording: function+offset and file:line.
core::store::SiteRecord SiteRecordFor(core::symbols::Symbolizer& symbolizer, core::RemoteAddr ip);

// The recording a command makes (-o): where, and what the session's row says of the command.
struct RecordingSpec {
  std::string path;
  std::string command_line;    // as typed
  std::string kwatch_version;  // the recording kwatch's version
};

// Creates the recording of a process watch session at spec.path (mode "watch", the session's
// backend), with one watch row per watch of `session` on process `pid` (drmgr's placement as
// its coverage when drmgr placed the watches), or per watch whose id is in `only` when it is
// not empty (a joined kwatch's own watches). Errors: the writer's.
absl::StatusOr<std::unique_ptr<core::store::TraceWriter>> CreateWatchRecording(
    const RecordingSpec& spec, const WatchSession& session, pid_t pid,
    std::span<const uint32_t> only = {});

// How a recording ended (FinishRecording), for the command to say.
struct RecordingOutcome {
  // The end record is written: the recording is complete, with `events` events and `hits`
  // probe hits.
  bool complete = false;
  uint64_t events = 0;
  uint64_t hits = 0;
  std::string path;
  std::string warning;  // complete, but Finish warned ("" when not)
  // Not complete: the failure while recording (the first), else the failure of Finish.
  absl::Status error;
  // A failure while recording: where the events committed before it are (the file may have
  // been renamed since); "" when its location is lost, and after a failed Finish.
  std::string kept_at;
  // Not complete: the existing recording -o named, left as it was ("" when there was none).
  std::string previous;
};

// Ends a recording: after a session whose recording did not fail (`record_error` OK), stores
// `end` (Finish); else leaves it as it is, cut short, and tells where its committed events are.
RecordingOutcome FinishRecording(core::store::TraceWriter& writer, const absl::Status& record_error,
                                 const core::store::SessionEnd& end);

// `kwatch report --upgrade FILE`: rewrites the finished recording at `path`, of any older schema
// (or of schema 7 with its events as rows, as `kwatch export --sql` writes them, or a watch
// recording whose batches overlap in time: what kwatch wrote for multi-threaded perf sessions
// before its events were put in time order), as kwatch records now: events in blocks, in time
// order, and, for a watch recording, the profile kept with them. The
// new file replaces the old one only once complete (TraceWriter's rule: the old one stays as
// it was on any failure). Returns the number of events rewritten; nullopt, with nothing done,
// when the recording is current. FailedPrecondition for a recording cut short (upgrade what was
// recorded with `kwatch export --sql` instead); else the reader's and the writer's errors.
absl::StatusOr<std::optional<uint64_t>> UpgradeRecording(const std::string& path);

// What part of a recording to profile. Times are seconds from the session's start.
struct RecordingSlice {
  std::optional<double> from_s;
  std::optional<double> to_s;
  std::optional<pid_t> tid;
};

// The hits of `reader` within `slice` (times from the session's start).
core::store::HitFilter HitFilterOf(const core::store::TraceReader& reader,
                                   const RecordingSlice& slice);

// Replays the events of `reader` (restricted to `slice`) into a profile of its watches,
// with time columns starting at the session's start. Streams: memory does not grow with the
// number of events.
absl::StatusOr<profile::StorageProfile> ProfileFromRecording(const core::store::TraceReader& reader,
                                                             const RecordingSlice& slice,
                                                             profile::ProfileOptions opts = {});

// The profile options of a report on `reader`: time columns `bucket_ms` wide keeping the whole
// session (at most 4096 columns), or with `bucket_ms` 0 an automatic width starting at the
// session's length / 120 (at least 1 us); a recording cut short keeps the defaults.
profile::ProfileOptions ReportProfileOptions(const core::store::TraceReader& reader,
                                             double bucket_ms);

}  // namespace kwatch::watch
