#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/base/remote_addr.h"
#include "core/base/unique_fd.h"
#include "core/event.h"
#include "core/store/sqlite_handle.h"
#include "core/store/trace_records.h"
#include "core/store/trace_summary.h"

namespace kwatch::core::store {

class WalCheckpointer;

// How a recording stores its events and probe hits: in compressed blocks (event_blocks, schema
// 7, and hit_blocks, schema 8: what kwatch writes), or one row each in `events` and `hits` (what
// `kwatch export --sql` gives, and older schemas).
enum class EventStorage { kBlocks, kRows };

// Writes one recording (`kwatch ... -o run.kwdb`): a SQLite database in the schema of
// docs/recording.md.
//
// Durability: events, hits and sites are buffered in memory and committed in one transaction
// when `batch_size` events plus hits are pending, or on Flush(). The database is in WAL mode
// with synchronous=OFF while recording, so a writer killed at any moment (SIGKILL) leaves a
// readable recording holding every committed batch, marked cut short (complete = 0); it
// loses only what was pending. Watches and probes are committed at once. The file is fsynced
// at durable points (WalCheckpointer: every 30 s) and by Finish, not at each commit or
// checkpoint: an OS crash or power loss may lose what came after the last durable point.
// Finish() writes the end record, marks the recording complete, checkpoints and switches to
// journal_mode=DELETE: a finished recording is one self-contained file.
//
// Checkpoints (copying the WAL into the database) follow the commits that fill 256 KiB of WAL,
// without fsync (WalCheckpointer); its thread fsyncs at the durable points, so Append and Flush
// never wait for an fsync.
//
// Errors: a failed write (disk full, quota, I/O error) returns a Status naming the path,
// SQLite's message with the errno text, how many events and hits are committed and how many
// were lost with the failed batch; every later call returns the same error (the writer is
// dead). The committed data stays readable, and the writer marks the recording cut short with
// the reason (session.exit_reason, complete = 0): a reserve of kReserveBytes, allocated on
// the recording's filesystem at Create and released on the failure, leaves room for that last
// small commit on a full disk. The recording's files stay in WAL mode then (path-wal holds
// the last batches); readers need path, path-wal and path-shm together.
// The writer also checks, at each commit and Flush, that `path` still names its file: when
// the file was removed (e.g. its directory deleted: the data would go into an unlinked file)
// it fails at once with DataLoss, says the recording is lost, and location_lost() is true;
// when the file or its directory was renamed, it folds the WAL into the file, marks it cut
// short, fails with FailedPrecondition naming the new path, and moved_to() gives it.
//
// Owns its SQLite connection and the checkpoint thread. Not thread-safe: one thread calls
// everything.
class TraceWriter {
 public:
  static constexpr size_t kDefaultBatchSize = 8192;

  // Creates the recording at `path` with mode 0600 (it holds target memory contents) and
  // writes `session`. Refuses a path that is a symbolic link (also a dangling one) or
  // anything but a regular file. An existing regular file at `path` is replaced only by a
  // complete recording: the new one is written beside it, at `path`.new-PID (path() says
  // where, replaces() names the old one), and Finish renames it over `path` (removing the old
  // one's -wal / -shm / -journal). A session that fails or is killed leaves the old file as it
  // was. The parent directory must exist.
  static absl::StatusOr<std::unique_ptr<TraceWriter>> Create(
      const std::string& path, const SessionRecord& session, size_t batch_size = kDefaultBatchSize,
      EventStorage storage = EventStorage::kBlocks);

  // Without Finish(): commits what is pending and leaves WAL mode (best effort); the
  // recording stays marked cut short.
  ~TraceWriter();
  TraceWriter(const TraceWriter&) = delete;
  TraceWriter& operator=(const TraceWriter&) = delete;

  // Stores a watch (fields included) now. `w.id` must be unique.
  absl::Status AddWatch(const WatchRecord& w);

  // Keeps the recording's profile (core/store/trace_summary.h) with `source`, which sees every
  // watch added after this call and every committed batch; the writer stores its updates
  // when it asks, and at Finish. Call it before the first event.
  void SetSummarySource(std::unique_ptr<SummarySource> source);

  // Stores a probe now. `p.id` must be unique.
  absl::Status AddProbe(const ProbeRecord& p);

  // Stores the final results of a probe session's aggregations now (in one transaction, after
  // those stored before), for `kwatch report` to print them as the session did. Call it before
  // Finish. A write error fails the writer as a failed commit does (the recording is cut short).
  absl::Status AddAggregates(const std::vector<AggregateRecord>& aggregates);

  // Buffers a symbolized code address; later sites with an ip already added are ignored
  // (one hash lookup).
  absl::Status AddSite(const SiteRecord& s);
  // Whether a site for `ip` was added: lets the caller symbolize each ip once.
  bool HasSite(RemoteAddr ip) const { return site_ips_.contains(ip.value); }

  // Buffers a stack (committed with the next batch, before the hits naming it); a stack whose
  // id was added is ignored. Ids are the caller's: 1, 2, ... (HitRecord::stack_id).
  absl::Status AddStack(const StackRecord& stack);

  // Buffers a task's name (committed with the next batch); a (tid, comm) pair already added
  // is ignored.
  absl::Status AddTask(const TaskRecord& t);

  // Buffers an event / a probe hit (moved from, for AppendHit of an rvalue); commits when the
  // batch is full. Events need not arrive
  // in time order: each batch is sorted by time, and a recording whose batches overlap in time
  // gets an index on time at Finish().
  absl::Status Append(const AccessEvent& e);
  absl::Status AppendHit(const HitRecord& h) { return AppendHit(HitRecord(h)); }
  absl::Status AppendHit(HitRecord&& h);

  // Commits everything pending (no-op when nothing is). Call it about every 100 ms.
  absl::Status Flush();

  // Commits what is pending, stores `end` (zero clocks mean now), marks the recording complete,
  // checkpoints, switches the file out of WAL mode and closes it. Later calls fail.
  absl::Status Finish(const SessionEnd& end);

  // Where the recording is: `path`.new-PID while it replaces an existing file (until Finish
  // renames it), else the path given to Create.
  const std::string& path() const { return path_; }
  // The existing recording this one replaces when Finish succeeds; "" when the path was free
  // or once replaced.
  const std::string& replaces() const { return replaces_; }
  // The first failure, OK while the writer works.
  const absl::Status& error() const { return error_; }
  // After a failure: true when the recording's file no longer exists anywhere (removed while
  // recording); nothing of the recording is left.
  bool location_lost() const { return location_lost_; }
  // After a failure: the file's path now, when it was renamed (or its directory) while
  // recording; empty otherwise.
  const std::string& moved_to() const { return moved_to_; }
  // After a Finish() that returned OK: non-empty when the recording is complete but could not
  // leave WAL mode because a reader held it (kwatch-gui --follow, sqlite3): its last batches
  // stay in path-wal, which must stay beside it. A warning for the user, not a failure.
  const std::string& finish_warning() const { return finish_warning_; }
  uint64_t events_committed() const { return events_committed_; }
  uint64_t hits_committed() const { return hits_committed_; }
  size_t pending() const { return events_.size() + hits_.size(); }

 private:
  static constexpr size_t kEventsPerInsert = 32;
  // A small WAL, rewritten in place while its pages are still in the page cache.
  static constexpr int kCheckpointPages = 64;      // 256 KiB of 4 KiB pages
  static constexpr int kRestartPages = 16384;      // 64 MiB: the writer restarts the WAL
  static constexpr off_t kReserveBytes = 1 << 20;  // released on a failure for the last commit

  TraceWriter(std::string path, SqlitePtr db, size_t batch_size, UniqueFd file,
              EventStorage storage);

  absl::Status Init(const SessionRecord& session);
  absl::Status Commit();
  absl::Status WriteBatch();
  // A table of blocks (event_blocks, hit_blocks) and its last block while it holds few records
  // (it is rewritten with the next batch's): its records, its id and its first record's index
  // (1-based).
  template <typename Record>
  struct BlockTable {
    SqliteStmtPtr insert;
    SqliteStmtPtr remove;
    std::vector<Record> tail;
    int64_t tail_id = 0;
    uint64_t tail_index = 0;
    std::vector<Record> pending_tail;  // tail once this batch commits
  };
  // Stores `batch` as blocks of `table` (inside the open transaction), merged with the last
  // block while that one is small; `committed` records came before it.
  template <typename Record>
  absl::Status WriteBlocks(BlockTable<Record>& table, const std::vector<Record>& batch,
                           uint64_t committed, const char* what);
  // Once the batch committed: the tails move on.
  template <typename Record>
  static void TakeTail(BlockTable<Record>& table, const std::vector<Record>& batch);
  // Stores the summary source's update (inside the open transaction).
  absl::Status WriteSummary();
  absl::Status Fail(absl::Status s);
  absl::Status Check() const;
  absl::Status Error(int rc, const char* what);
  absl::Status StopCheckpointer();
  absl::Status RestartWal(bool wait);
  absl::Status CheckLocation();
  absl::Status WriteFailure(const absl::Status& s, size_t dropped);
  void MarkCutShort(const std::string& reason, uint64_t dropped);
  // A complete recording written beside the one it replaces takes its name (with its -wal and
  // -shm when `with_wal`); a failure is a finish_warning_, the recording stays at path_.
  void TakeFinalName(bool with_wal);

  std::string path_;
  std::string replaces_;
  SqlitePtr db_;
  size_t batch_size_;
  std::unique_ptr<WalCheckpointer> checkpointer_;
  UniqueFd file_;     // the database file (O_RDONLY): where it is now, whether it still exists
  UniqueFd reserve_;  // unlinked file of kReserveBytes on the same filesystem, or invalid
  bool location_lost_ = false;
  std::string moved_to_;
  std::string finish_warning_;
  absl::Status error_;  // sticky: the first failure
  bool finished_ = false;

  SqliteStmtPtr begin_;
  SqliteStmtPtr commit_;
  SqliteStmtPtr insert_event_;   // one row
  SqliteStmtPtr insert_events_;  // kEventsPerInsert rows
  SqliteStmtPtr insert_hit_;
  SqliteStmtPtr insert_site_;
  SqliteStmtPtr insert_frame_;
  SqliteStmtPtr insert_task_;
  SqliteStmtPtr update_counts_;
  SqliteStmtPtr delete_snapshot_;
  SqliteStmtPtr insert_snapshot_;
  SqliteStmtPtr upsert_bin_;
  SqliteStmtPtr update_summary_;
  EventStorage storage_;
  BlockTable<AccessEvent> event_blocks_;
  BlockTable<HitRecord> hit_blocks_;
  std::unique_ptr<SummarySource> summary_;
  uint64_t summary_pending_ = 0;  // events given to summary_ since its last stored update
  bool summary_written_ = false;

  std::vector<AccessEvent> events_;
  std::vector<HitRecord> hits_;
  std::vector<SiteRecord> sites_;
  absl::flat_hash_set<uint64_t> site_ips_;
  std::vector<TaskRecord> tasks_;
  std::vector<StackRecord> stacks_;
  absl::flat_hash_set<uint32_t> stack_ids_;
  absl::flat_hash_set<std::pair<pid_t, std::string>> task_keys_;

  uint64_t events_committed_ = 0;
  uint64_t hits_committed_ = 0;
  uint64_t max_event_time_ = 0;  // latest committed event time
  uint64_t max_hit_time_ = 0;
  bool events_in_order_ = true;  // rowid order is time order
  bool hits_in_order_ = true;
};

class TraceReader;

// `kwatch export --sql`: writes `out` (a new file), a copy of the recording `reader` reads with
// its events one row each in `events` and its probe hits one row each in `hits`
// (docs/recording.md, "Schema"), for sqlite3 users; the copy reads as the recording does.
// Returns the number of events written as rows.
absl::StatusOr<uint64_t> ExportEventRows(const TraceReader& reader, const std::string& out);

}  // namespace kwatch::core::store
