#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "core/event.h"
#include "core/store/trace_records.h"

// The profile a recording keeps of its own events while it is written (schema 7), so that
// `kwatch report` and kwatch-gui need not read every event: docs/recording.md, "The profile
// written while recording".
//
// Two parts, written together in the transaction of the batch they cover:
// - profile_snapshot: the state of the storage profile (watch/profile) after the first
//   session.summary_events events, in the format of watch/profile/profile_codec.h, opaque to
//   the store, in chunks of at most kSnapshotChunkBytes;
// - profile_bins: per (thread, field) the reads and writes in time bins of kProfileBinLevels
//   levels: level k bins are 2^(kProfileBinShift0 + k * kProfileBinLevelShift) ns wide, from
//   the session's start (bin -1 at every level: before the start), like a mipmap. A bin's
//   counts cover the same events as the snapshot.
// The events after session.summary_events are read from the events table.

namespace kwatch::core::store {

inline constexpr uint32_t kProfileBinLevels = 4;
inline constexpr uint32_t kProfileBinShift0 = 24;  // level 0: 16.8 ms
inline constexpr uint32_t kProfileBinLevelShift = 4;
inline constexpr size_t kSnapshotChunkBytes = size_t{1} << 20;

// log2 of the width in ns of a bin of `level`.
inline constexpr uint32_t ProfileBinShift(uint32_t level) {
  return kProfileBinShift0 + level * kProfileBinLevelShift;
}

// One cell of profile_bins: the accesses of thread `tid` to the profile's field `field`
// (global index, watch by watch in id order, leaves in layout order) in one bin.
struct ProfileBinCell {
  uint32_t level = 0;
  int64_t bin = 0;  // -1: before the session's start
  pid_t tid = 0;
  uint32_t field = 0;
  uint64_t reads = 0;
  uint64_t writes = 0;
};

// What a summary source gives the writer to store.
struct ProfileSummaryUpdate {
  std::string snapshot;               // the profile's state after every event so far
  std::vector<ProfileBinCell> cells;  // counts to add to profile_bins (since the last update)
};

// Keeps the profile of a recording as its events are committed (TraceWriter::SetSummarySource).
// Called by the writer's thread only.
class SummarySource {
 public:
  virtual ~SummarySource() = default;
  SummarySource() = default;
  SummarySource(const SummarySource&) = delete;
  SummarySource& operator=(const SummarySource&) = delete;

  // A watch of the recording; all come before the first event.
  virtual void OnWatch(const WatchRecord& w) = 0;
  // A batch, in the order committed (sorted by time).
  virtual void OnEvents(absl::Span<const AccessEvent> batch) = 0;
  // Whether to store an update with this batch (the writer also stores one at Finish).
  virtual bool WantsUpdate() const = 0;
  virtual ProfileSummaryUpdate TakeUpdate() = 0;
};

// The profile a recording holds (TraceReader::ProfileSummary).
struct StoredProfileSummary {
  std::string snapshot;
  uint64_t events = 0;  // the first `events` events (in recording order) are in it
};

}  // namespace kwatch::core::store
