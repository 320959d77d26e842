#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/base/remote_addr.h"
#include "core/event.h"
#include "core/store/sqlite_handle.h"
#include "core/store/trace_records.h"
#include "core/store/trace_summary.h"

namespace kwatch::core::store {

// Which events to read. Times are CLOCK_MONOTONIC ns, both bounds inclusive; an unset field
// does not filter.
struct EventFilter {
  std::optional<uint64_t> from_ns;
  std::optional<uint64_t> to_ns;
  std::optional<pid_t> tid;
  std::optional<uint32_t> watch_id;
  // Recording order: only the events numbered [first_index, last_index] (1, 2, ... as
  // committed; ProfileSummary's `events` counts them so).
  std::optional<uint64_t> first_index;
  std::optional<uint64_t> last_index;
};

// Which probe hits to read (as EventFilter).
struct HitFilter {
  std::optional<uint64_t> from_ns;
  std::optional<uint64_t> to_ns;
  std::optional<pid_t> tid;
  std::optional<uint32_t> probe_id;
};

// Reads a recording written by TraceWriter, finished or not (a recording whose writer died
// is readable up to its last committed batch, and complete() is false). The file is opened
// read-only and untrusted: no extensions, no views or triggers, trusted_schema=OFF, and the
// reader never checkpoints or otherwise modifies it.
//
// Open() loads the small tables (session, watches with fields, sites, probes); events and
// hits are streamed from the file on each call, so a recording that is still being written
// shows every batch committed so far. Not thread-safe: one thread at a time.
class TraceReader {
 public:
  // Errors: NotFound naming the path if it does not exist; DataLoss "not a kwatch recording
  // or corrupted: ..." for a non-SQLite, truncated or damaged file; InvalidArgument "not a
  // kwatch recording" for a SQLite database of another application; FailedPrecondition
  // "recorded by a newer kwatch (schema N); this kwatch reads schema <= 1".
  static absl::StatusOr<std::unique_ptr<TraceReader>> Open(const std::string& path);

  TraceReader(const TraceReader&) = delete;
  TraceReader& operator=(const TraceReader&) = delete;
  ~TraceReader() = default;

  const std::string& path() const { return path_; }
  // PRAGMA user_version of the file (1 to kTraceSchemaVersion), and whether its events are in
  // event_blocks (schema 7) rather than one row each.
  int schema() const { return schema_; }
  bool event_blocks() const { return event_blocks_; }
  // Whether the recording's batches of events follow each other in time (session.events_in_order,
  // read now): when not, its profile snapshot is not used and reports replay every event.
  absl::StatusOr<bool> EventsInOrder() const { return InOrder("events_in_order"); }
  const SessionRecord& session() const { return session_; }
  // False when the recording was cut short (the writer died before Finish).
  bool complete() const { return complete_; }
  // How it ended; nullopt when cut short.
  const std::optional<SessionEnd>& end() const { return end_; }
  // Why it was cut short, when the writer could say (e.g. "recording cut short: writing events
  // to run.kwdb: database or disk is full (ENOSPC: No space left on device); ..."); empty when
  // complete, or when the writer died without a word (killed).
  const std::string& cut_reason() const { return cut_reason_; }
  const std::vector<WatchRecord>& watches() const { return watches_; }
  // Sorted by ip (unsigned).
  const std::vector<SiteRecord>& sites() const { return sites_; }
  const SiteRecord* FindSite(RemoteAddr ip) const;
  const std::vector<ProbeRecord>& probes() const { return probes_; }
  // The names of the tasks that made events (kernel sessions), by tid; empty for recordings
  // that store none.
  const std::vector<TaskRecord>& tasks() const { return tasks_; }
  // The final results of the probe session's aggregations (`kwatch probe -o F --agg ...`), in
  // the order printed; empty for recordings without (and before schema 5).
  const std::vector<AggregateRecord>& aggregates() const { return aggregates_; }
  // The stacks hits name (`kwatch probe --stack -o F`), read now, by id; empty for recordings
  // without (and before schema 6). Refused beyond kMaxRecordedStackFrames frames in all.
  absl::StatusOr<std::vector<StackRecord>> Stacks() const;

  // Calls `fn` for each matching event in time order (ties in recording order), streaming
  // from the file; `fn` returns false to stop early. A corrupted file stops the stream with a
  // DataLoss error after the events read before the damage were delivered.
  // AccessEvent::trap_ip equals ip when the recording stored none.
  absl::Status ForEachEvent(const EventFilter& filter,
                            absl::FunctionRef<bool(const AccessEvent&)> fn) const;
  absl::Status ForEachHit(const HitFilter& filter,
                          absl::FunctionRef<bool(const HitRecord&)> fn) const;

  // The profile written while recording (schema 7, core/store/trace_summary.h), read now;
  // nullopt when there is none to use: an older schema, none written yet, or events committed
  // out of time order (the snapshot saw them in another order than a replay would). Refused
  // beyond kMaxRecordedSnapshot bytes.
  absl::StatusOr<std::optional<StoredProfileSummary>> ProfileSummary() const;
  // How many events (the first ones in recording order) profile_bins counts, read now: the
  // profile's events, whatever the order of the batches (counts do not depend on it); 0 when
  // the recording keeps no bins to use (older schema, none written yet, no snapshot).
  absl::StatusOr<uint64_t> BinnedEvents() const;
  // Calls `fn` for each profile_bins cell of `level` with bin in [bin_lo, bin_hi).
  absl::Status ForEachProfileBin(uint32_t level, int64_t bin_lo, int64_t bin_hi,
                                 absl::FunctionRef<void(const ProfileBinCell&)> fn) const;

  // Until the returned object is destroyed, every read of this reader sees the recording as it
  // is now (one read transaction), however a live writer commits meanwhile. One at a time.
  class ReadSnapshot {
   public:
    explicit ReadSnapshot(const TraceReader* r) : r_(r) {}
    ReadSnapshot(ReadSnapshot&& o) noexcept : r_(o.r_) { o.r_ = nullptr; }
    ReadSnapshot(const ReadSnapshot&) = delete;
    ReadSnapshot& operator=(const ReadSnapshot&) = delete;
    ReadSnapshot& operator=(ReadSnapshot&&) = delete;
    ~ReadSnapshot();

   private:
    const TraceReader* r_;
  };
  absl::StatusOr<ReadSnapshot> HoldSnapshot() const;

  // Copies the recording, as it is now, into a new file `out` (SQLite's backup), which must not
  // exist.
  absl::Status CopyTo(const std::string& out) const;

  // Number of matching events / hits committed so far.
  absl::StatusOr<uint64_t> CountEvents(const EventFilter& filter = {}) const;
  absl::StatusOr<uint64_t> CountHits(const HitFilter& filter = {}) const;

 private:
  TraceReader(std::string path, SqlitePtr db) : path_(std::move(path)), db_(std::move(db)) {}

  absl::Status Load();
  absl::Status LoadSession();
  absl::Status LoadWatches();
  absl::Status LoadSites();
  absl::Status LoadTasks();
  absl::Status LoadProbes();
  absl::Status LoadAggregates();
  absl::Status LoadAggregateRows(const absl::flat_hash_map<int64_t, size_t>& by_id);
  absl::Status LoadAggregateBuckets(const absl::flat_hash_map<int64_t, size_t>& by_id);
  // DataLoss "not a kwatch recording or corrupted: <path>: <sqlite message>" for corruption,
  // else the SQLite error with the path.
  absl::Status ReadError(int rc) const;
  // Whether rowid order of `table` is time order (read fresh: a live writer may change it).
  absl::StatusOr<bool> InOrder(const char* column) const;
  // The smallest rowid from which a scan of `table` (in time order by rowid) meets from_ns.
  absl::StatusOr<int64_t> FirstRowidAtOrAfter(const char* table, uint64_t from_ns) const {
    return FirstRowidAtLeast(table, "time_ns", from_ns);
  }
  // The smallest rowid from which a scan of `table` in rowid order meets a row whose `expr` is
  // at least `value` (`expr` grows with the rowid).
  absl::StatusOr<int64_t> FirstRowidAtLeast(const char* table, const char* expr,
                                            uint64_t value) const;
  // The bounds every record of a block table has: time and recording order.
  struct BlockBounds {
    std::optional<uint64_t> from_ns;
    std::optional<uint64_t> to_ns;
    std::optional<uint64_t> first_index;
    std::optional<uint64_t> last_index;
  };
  // Calls fn(record) for each record of the blocks of `table` (event_blocks, hit_blocks) within
  // `bounds` for which wanted(record) holds, in time order (merging the blocks that overlap in
  // time unless `in_order`), until fn returns false.
  template <typename Record, typename Wanted, typename Fn>
  absl::Status ForEachInBlocks(const char* table, const BlockBounds& bounds, bool in_order,
                               Wanted wanted, Fn fn) const;
  // sum(count) of the block table `table`.
  absl::StatusOr<uint64_t> SumOfCounts(const char* table) const;
  absl::StatusOr<SqliteStmtPtr> Prepare(const std::string& sql) const;
  // count(*) of `table` ("events", "hits") within the filter's bounds, `id_column` holding
  // the watch or probe id.
  absl::StatusOr<uint64_t> CountRows(absl::string_view table, absl::string_view id_column,
                                     const std::optional<uint64_t>& from_ns,
                                     const std::optional<uint64_t>& to_ns,
                                     const std::optional<pid_t>& tid,
                                     const std::optional<uint32_t>& id) const;

  std::string path_;
  SqlitePtr db_;
  int schema_ = 0;             // PRAGMA user_version of the file
  bool event_blocks_ = false;  // events in event_blocks (schema 7), not in events
  bool hit_blocks_ = false;    // probe hits in hit_blocks (schema 8), not in hits
  SessionRecord session_;
  bool complete_ = false;
  std::string cut_reason_;
  std::optional<SessionEnd> end_;
  std::vector<WatchRecord> watches_;
  std::vector<SiteRecord> sites_;
  std::vector<ProbeRecord> probes_;
  std::vector<TaskRecord> tasks_;
  std::vector<AggregateRecord> aggregates_;
};

}  // namespace kwatch::core::store
