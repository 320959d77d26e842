#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/base/remote_addr.h"
#include "core/event.h"
#include "core/symbols/type_layout.h"

// Plain records of a kwatch recording (`run.kwdb`), as TraceWriter stores them and
// TraceReader returns them. The SQLite schema they map to is documented in docs/recording.md.

namespace kwatch::core::store {

// PRAGMA application_id of every recording: 'kwdb'.
inline constexpr int32_t kTraceApplicationId = 0x6b776462;
// PRAGMA user_version: the schema this kwatch writes, and the newest it reads.
// 2: hits.pid. Schema 1 recordings (no pid per hit) are read with HitRecord::pid 0.
// 3: fields.is_union, sites.inlined. 4: session.ns_pid. 5: the aggregates, aggregate_rows and
// aggregate_buckets tables (older recordings read with no aggregations). 6: stack_frames,
// hits.stack_id. 7: the profile written while recording (profile_snapshot, profile_bins,
// session.summary_events; core/store/trace_summary.h); older recordings are replayed. 8: probe
// hits in hit_blocks (session.hit_blocks; core/store/hit_blocks.h).
inline constexpr int32_t kTraceSchemaVersion = 8;

// How the recording started. Clocks: wall = CLOCK_REALTIME, mono = CLOCK_MONOTONIC (the clock
// of AccessEvent::time_ns and HitRecord::time_ns), both in nanoseconds.
struct SessionRecord {
  std::string command_line;    // the kwatch command line, as the user would retype it
  pid_t pid = 0;               // target process (0: none, e.g. CPU-wide kernel watches)
  pid_t ns_pid = 0;            // its own pid in its pid namespace (a container's); 0: the same
  std::string kernel;          // uname -r
  std::string host;            // uname -n
  uint64_t start_wall_ns = 0;  // CLOCK_REALTIME at start
  uint64_t start_mono_ns = 0;  // CLOCK_MONOTONIC at start
  std::string kwatch_version;  // e.g. "0.1.0"
  std::string mode;            // "watch" or "probe"
  std::string backend;         // e.g. "perf", "ptrace", "page", "int3"
};

// How the recording ended (written by TraceWriter::Finish).
struct SessionEnd {
  uint64_t end_wall_ns = 0;        // CLOCK_REALTIME at the end; 0 in Finish: now
  uint64_t end_mono_ns = 0;        // CLOCK_MONOTONIC at the end; 0 in Finish: now
  std::optional<int> exit_status;  // the target's exit status, when it exited
  std::string exit_reason;         // e.g. "target exited", "interrupted (SIGINT)"
  uint64_t lost_count = 0;         // events the backend reported lost (ring overflow)
};

// One watched object. `id` is AccessEvent::watch_id.
struct WatchRecord {
  uint32_t id = 0;
  std::string expr;       // as the user wrote it, e.g. "cache->lines[3]"
  RemoteAddr address;     // first watched byte
  uint64_t length = 0;    // watched bytes
  std::string kind;       // "r", "w", "rw" or "x"
  std::string backend;    // backend that served this watch
  std::string coverage;   // how the hardware covers it, e.g. "24 bytes: 3 exact 8-byte slots"
  std::string type_name;  // C type of the object ("" if unknown)
  std::vector<symbols::FieldLayout> fields;  // flattened layout (empty if unknown), in layout order
};

// A code address, symbolized once. `ip` is AccessEvent::ip or HitRecord::ip.
struct SiteRecord {
  RemoteAddr ip;
  std::string function;  // "" when no symbol covers the address
  uint64_t offset = 0;   // from the function's start
  std::string file;      // "" when no line info
  int line = 0;
  std::string disassembly;  // AT&T text of the instruction ("" if not decoded)
  std::string inlined;      // the inlined function the instruction is in ("" if none; schema 3)
};

// A task that made recorded events, with its command name: kernel sessions record who ran
// on the CPU (tid 0 is each CPU's idle task, "swapper/N": one row per name). `tid` is
// AccessEvent::tid.
struct TaskRecord {
  pid_t pid = 0;
  pid_t tid = 0;
  std::string comm;  // /proc/TID/comm when the task was first seen, "?" when it was gone

  bool operator==(const TaskRecord&) const = default;
};

// One probe point. `id` is HitRecord::probe_id.
struct ProbeRecord {
  uint32_t id = 0;
  std::string event;  // event name, e.g. "handle_request"
  std::string spec;   // as the user wrote it, e.g. "handle_request req->len:u32"
  RemoteAddr address;
  std::string function;
  std::string file;
  int line = 0;
  bool is_return = false;
};

// One probe hit. Arguments keep their order; names need not be unique.
// One frame of a recorded stack (--stack), symbolized when it was recorded.
struct StackFrameRecord {
  RemoteAddr ip;         // frame 0: the hit's address; the others: return addresses
  std::string function;  // "" without a symbol
  uint64_t offset = 0;   // of the looked-up address (a return address - 1) in `function`
  std::string file;
  int line = 0;

  bool operator==(const StackFrameRecord&) const = default;
};

// A distinct stack of a recording, innermost frame first; hits name it by id (schema 6).
struct StackRecord {
  uint32_t id = 0;  // 1, 2, ...
  std::vector<StackFrameRecord> frames;

  bool operator==(const StackRecord&) const = default;
};

struct HitRecord {
  uint64_t time_ns = 0;  // CLOCK_MONOTONIC
  pid_t pid = 0;         // thread group of `tid` (0: a schema 1 recording, which had none)
  pid_t tid = 0;
  uint32_t cpu = kUnknownCpu;
  uint32_t probe_id = 0;
  RemoteAddr ip;
  bool is_return = false;
  std::vector<std::pair<std::string, std::string>> args;  // name -> formatted value
  uint32_t stack_id = 0;  // --stack: the StackRecord of its user stack (0: none)

  bool operator==(const HitRecord&) const = default;
};

// One bucket of a recorded histogram (hist, lhist): values in [low, high); no low is "below"
// (negative values for hist, values under MIN for lhist), no high "from low up".
struct AggregateBucketRecord {
  std::optional<int64_t> low;
  std::optional<int64_t> high;
  uint64_t count = 0;

  bool operator==(const AggregateBucketRecord&) const = default;
};

// One key's row of a recorded aggregation, as `kwatch probe --agg` printed it.
struct AggregateRowRecord {
  // The key's parts in order, name -> value as the hits show it ("tid" -> "1234", "comm" ->
  // "\"prog\""); empty without `by`.
  std::vector<std::pair<std::string, std::string>> key;
  // count, sum, min, max, avg: the value as printed: a decimal integer ("-3",
  // "18446744073709551615"), or avg's %.6g ("2.5", "1e+20"). "" for hist and lhist.
  std::string value;
  uint64_t count = 0;  // hits aggregated in this row
  // hist, lhist: the buckets in order, the empty ones between the first and the last included.
  std::vector<AggregateBucketRecord> buckets;

  bool operator==(const AggregateRowRecord&) const = default;
};

// The final result of one aggregation on one probe (`kwatch probe -o F --agg ...`; schema 5).
struct AggregateRecord {
  uint32_t probe_id = 0;  // ProbeRecord::id
  std::string event;      // the probe's event
  std::string agg;        // as printed: "count() by tid", "hist(n)", "lhist(n, 0, 100, 10)"
  std::string func;       // "count", "sum", "min", "max", "avg", "hist" or "lhist"
  uint64_t no_value = 0;  // hits whose value (or a key) could not be read: not aggregated
  std::vector<AggregateRowRecord> rows;  // in the order printed

  // hist and lhist: rows hold buckets, not a value.
  bool histogram() const { return func == "hist" || func == "lhist"; }
  bool operator==(const AggregateRecord&) const = default;
};

// A session record for this host, now: kernel, host and both start clocks filled in.
SessionRecord SessionRecordForThisHost();

// CLOCK_REALTIME and CLOCK_MONOTONIC now, in nanoseconds.
uint64_t WallClockNs();
uint64_t MonotonicClockNs();

}  // namespace kwatch::core::store
