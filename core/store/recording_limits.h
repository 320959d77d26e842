#pragma once

#include <cstddef>
#include <cstdint>

namespace kwatch::core::store {

// The most a recording may hold (docs/recording.md, "Limits"). A recording is a file people
// share: TraceReader refuses a file beyond these with ResourceExhausted, naming the limit and
// what the file has, so that a small crafted file cannot make the reader, the report or the
// viewer take unbounded memory or time. kwatch never records beyond them (its layouts stop at
// core::symbols::kMaxLayoutFields fields per watch, probe strings at 256 bytes).

// Bytes of one name or text: expressions, field paths, type names, function and file names,
// task names, probe specs, the session's host, kernel, backend and end reason.
inline constexpr size_t kMaxRecordedText = size_t{64} << 10;
// Bytes of the recorded command line (as typed: a long argument list fits).
inline constexpr size_t kMaxRecordedCommandLine = size_t{4} << 20;
// Bytes of one probe hit's arguments (hits.args, JSON).
inline constexpr size_t kMaxRecordedArgs = size_t{1} << 20;
// Bytes of any one value SQLite loads from a recording (above all the limits here).
inline constexpr size_t kMaxRecordedValue = size_t{8} << 20;
// Watches; their ids are 0 .. kMaxRecordedWatches - 1 (kwatch numbers them from 0).
inline constexpr uint32_t kMaxRecordedWatches = 4096;
// Fields (layout nodes) of all watches together: 64 watches of 4096 fields.
inline constexpr size_t kMaxRecordedFields = size_t{1} << 18;
// Bytes of the names the report gives the leaf fields (the watch's expression followed by the
// field's path), all watches together.
inline constexpr size_t kMaxRecordedFieldNames = size_t{64} << 20;

// Aggregations (`kwatch probe --agg`) of a recording, their rows (keys) and histogram buckets,
// all aggregations together. A histogram row has at most 10002 buckets (lhist's limit).
inline constexpr size_t kMaxRecordedAggregates = 4096;
inline constexpr size_t kMaxRecordedAggregateRows = size_t{1} << 20;
inline constexpr size_t kMaxRecordedAggregateBuckets = size_t{1} << 22;
// Frames of all the recorded stacks together (--stack: at most 256 per stack).
inline constexpr size_t kMaxRecordedStackFrames = size_t{1} << 22;
// Bytes of one row's key (aggregate_rows.key, JSON as hits.args), and of all keys together.
inline constexpr size_t kMaxRecordedAggregateKey = kMaxRecordedArgs;
inline constexpr size_t kMaxRecordedAggregateKeys = size_t{64} << 20;
// Bytes of the profile written while recording (profile_snapshot, all chunks together); kwatch
// writes none larger (the report then replays the events).
inline constexpr size_t kMaxRecordedSnapshot = size_t{64} << 20;

}  // namespace kwatch::core::store
