#pragma once

#include <cstdint>
#include <cstdio>

#include "absl/status/statusor.h"
#include "core/store/trace_reader.h"
#include "watch/recording.h"

namespace kwatch::watch {

// `kwatch report FILE --format chrome-trace`: a recording in the Chrome trace-event format
// (a JSON object with "traceEvents", docs/recording.md), which ui.perfetto.dev and
// chrome://tracing open:
//   - one track per thread: "process_name" / "thread_name" metadata ("M") for every pid and tid
//     that made an event or a hit (names from the recording's tasks when it has them);
//   - an instant event ("ph":"i", "s":"t", category "access") per access, named by the field
//     it touched, args {field, access, value ("OLD -> NEW" in exact modes), addr, site};
//   - an instant event (category "probe") per probe hit, named by the probe's event, args
//     {probe, site, and the hit's arguments};
//   - counters ("ph":"C", named "accesses FIELD", args {reads, writes}) per watched field and
//     time bin of `bucket_ns`, dropping back to 0 after a bin without accesses;
//   - a complete event ("ph":"X", category "call") per call whose entry and `%return` the
//     recording both hold: a return hit ends the innermost open entry of its function on its
//     thread (recursion nests); args {entry: the entry's arguments, return: the return's}.
// Times ("ts", "dur") are microseconds from the session's start.
//
// Streams: events, then hits, are read once in time order from the file and written as they
// come; memory holds the threads seen, the fields' counts of one bin and the open calls (at
// most kMaxOpenCalls per thread and function), never the events.
struct ChromeTraceOptions {
  RecordingSlice slice;
  uint64_t bucket_ns = 0;  // counter bins; 0: the session's length / 200, at least 1 ms
};

// What WriteChromeTrace wrote, by kind of trace event.
struct ChromeTraceCounts {
  uint64_t accesses = 0;  // "i" of category "access"
  uint64_t hits = 0;      // "i" of category "probe"
  uint64_t calls = 0;     // "X"
  uint64_t counters = 0;  // "C"
  uint64_t threads = 0;   // "thread_name" metadata
};

inline constexpr size_t kMaxOpenCalls = 4096;

// Writes the trace of `reader` to `out`. On a read error (a damaged file), `out` holds a
// truncated document and the error is returned; a write error is DataLoss naming errno.
absl::StatusOr<ChromeTraceCounts> WriteChromeTrace(const core::store::TraceReader& reader,
                                                   const ChromeTraceOptions& opts, FILE* out);

}  // namespace kwatch::watch
