#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "core/store/trace_reader.h"
#include "core/store/trace_summary.h"
#include "core/store/trace_writer.h"
#include "watch/profile/storage_profile.h"

namespace kwatch::watch {

// The profile a recording keeps while it is written (core/store/trace_summary.h): a storage
// profile of every committed event (default ProfileOptions from the session's start), stored
// with a batch after at least 2^17 events (and a quarter as many events as the last snapshot
// took bytes) since the last, and at Finish, with the (thread, field) counts of each 16.8 ms bin
// and the coarser levels. `start_mono_ns`: the session's start.
std::unique_ptr<core::store::SummarySource> MakeProfileSummarySource(uint64_t start_mono_ns);

// The profile of a whole recording (every event) as ProfileFromRecording would replay it with
// `opts` (its start_ns is set to the session's), built from the profile the recording keeps
// and the events committed after it, with the time columns rebuilt from profile_bins (plus the
// events of the 16.8 ms bins the columns' edges cut): time independent of the number of events
// before the snapshot. nullopt when the recording keeps no profile to use (older schema, events
// committed out of time order, other options, a fixed-width window that would slide): replay
// then. Errors: the reader's, and DataLoss for a damaged profile.
absl::StatusOr<std::optional<profile::StorageProfile>> ProfileFromSummary(
    const core::store::TraceReader& reader, profile::ProfileOptions opts);

}  // namespace kwatch::watch
