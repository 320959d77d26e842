#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/base/remote_addr.h"
#include "core/store/trace_reader.h"
#include "core/store/trace_records.h"
#include "core/symbols/symbolizer.h"
#include "watch/profile/storage_profile.h"
#include "watch/session.h"

namespace kwatch::watch {

// The recording's row for a session watch: expression, resolved range, kind letters ("r",
// "w", "rw", "x"), the backend that served it and its layout.
core::WatchRecord WatchRecordFor(const Watch& w, BackendKind backend);

// The profile's object for a recorded watch (the inverse of WatchRecordFor, as far as the
// profile needs).
WatchedObject ObjectFromRecord(const core::WatchRecord& w);

// A code address symbolized for the recording: function+offset and file:line.
core::SiteRecord SiteRecordFor(core::Symbolizer& symbolizer, core::RemoteAddr ip);

// What part of a recording to profile. Times are seconds from the session's start.
struct RecordingSlice {
  std::optional<double> from_s;
  std::optional<double> to_s;
  std::optional<pid_t> tid;
};

// Replays the events of `reader` (restricted to `slice`) into a profile of its watches,
// with time columns starting at the session's start. Streams: memory does not grow with the
// number of events.
absl::StatusOr<StorageProfile> ProfileFromRecording(const core::TraceReader& reader,
                                                    const RecordingSlice& slice,
                                                    ProfileOptions opts = {});

}  // namespace kwatch::watch
