#include "core/store/trace_writer.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"
#include "core/base/syscall_status.h"
#include "core/base/unique_fd.h"
#include "core/store/args_json.h"
#include "core/store/event_blocks.h"
#include "core/store/hit_blocks.h"
#include "core/store/recording_limits.h"
#include "core/store/trace_reader.h"
#include "core/store/trace_summary.h"
#include "core/store/wal_checkpointer.h"

namespace kwatch::core::store {
namespace {

// Schema version 7 (docs/recording.md; kTraceSchemaVersion). Addresses and memory values are 64-bit
// patterns stored as signed integers.
constexpr const char* kSchemaSql = R"sql(
CREATE TABLE session(
  command_line TEXT NOT NULL,
  pid INTEGER NOT NULL,
  kernel TEXT NOT NULL,
  host TEXT NOT NULL,
  start_wall_ns INTEGER NOT NULL,
  start_mono_ns INTEGER NOT NULL,
  kwatch_version TEXT NOT NULL,
  mode TEXT NOT NULL,
  backend TEXT NOT NULL,
  ns_pid INTEGER,
  end_wall_ns INTEGER,
  end_mono_ns INTEGER,
  exit_status INTEGER,
  exit_reason TEXT,
  event_count INTEGER NOT NULL DEFAULT 0,
  hit_count INTEGER NOT NULL DEFAULT 0,
  lost_count INTEGER,
  events_in_order INTEGER NOT NULL DEFAULT 1,
  hits_in_order INTEGER NOT NULL DEFAULT 1,
  complete INTEGER NOT NULL DEFAULT 0,
  summary_events INTEGER,
  event_blocks INTEGER NOT NULL DEFAULT 0,
  hit_blocks INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE watches(
  id INTEGER PRIMARY KEY,
  expr TEXT NOT NULL,
  address INTEGER NOT NULL,
  length INTEGER NOT NULL,
  kind TEXT NOT NULL,
  backend TEXT NOT NULL,
  coverage TEXT NOT NULL,
  type_name TEXT NOT NULL
);
CREATE TABLE fields(
  watch_id INTEGER NOT NULL,
  idx INTEGER NOT NULL,
  path TEXT NOT NULL,
  type_name TEXT NOT NULL,
  offset INTEGER NOT NULL,
  size INTEGER NOT NULL,
  bit_offset INTEGER NOT NULL,
  bit_size INTEGER NOT NULL,
  depth INTEGER NOT NULL,
  is_leaf INTEGER NOT NULL,
  is_union INTEGER NOT NULL,
  PRIMARY KEY(watch_id, idx)
) WITHOUT ROWID;
CREATE TABLE events(
  time_ns INTEGER NOT NULL,
  pid INTEGER NOT NULL,
  tid INTEGER NOT NULL,
  cpu INTEGER,
  watch_id INTEGER NOT NULL,
  ip INTEGER NOT NULL,
  trap_ip INTEGER,
  addr INTEGER NOT NULL,
  len INTEGER NOT NULL,
  access_addr INTEGER NOT NULL,
  access_size INTEGER NOT NULL,
  kind TEXT NOT NULL,
  value INTEGER,
  old_value INTEGER,
  value_exact INTEGER NOT NULL
);
CREATE TABLE sites(
  ip INTEGER PRIMARY KEY,
  function TEXT NOT NULL,
  offset INTEGER NOT NULL,
  file TEXT NOT NULL,
  line INTEGER NOT NULL,
  disassembly TEXT NOT NULL,
  inlined TEXT NOT NULL
);
CREATE TABLE tasks(
  pid INTEGER NOT NULL,
  tid INTEGER NOT NULL,
  comm TEXT NOT NULL,
  PRIMARY KEY(tid, comm)
) WITHOUT ROWID;
CREATE TABLE probes(
  id INTEGER PRIMARY KEY,
  event TEXT NOT NULL,
  spec TEXT NOT NULL,
  address INTEGER NOT NULL,
  function TEXT NOT NULL,
  file TEXT NOT NULL,
  line INTEGER NOT NULL,
  is_return INTEGER NOT NULL
);
CREATE TABLE hits(
  time_ns INTEGER NOT NULL,
  pid INTEGER NOT NULL,
  tid INTEGER NOT NULL,
  cpu INTEGER,
  probe_id INTEGER NOT NULL,
  ip INTEGER NOT NULL,
  is_return INTEGER NOT NULL,
  args TEXT NOT NULL,
  stack_id INTEGER
);
CREATE TABLE stack_frames(
  stack_id INTEGER NOT NULL,
  idx INTEGER NOT NULL,
  ip INTEGER NOT NULL,
  function TEXT NOT NULL,
  offset INTEGER NOT NULL,
  file TEXT NOT NULL,
  line INTEGER NOT NULL,
  PRIMARY KEY(stack_id, idx)
) WITHOUT ROWID;
CREATE TABLE aggregates(
  id INTEGER PRIMARY KEY,
  probe_id INTEGER NOT NULL,
  event TEXT NOT NULL,
  agg TEXT NOT NULL,
  func TEXT NOT NULL,
  no_value INTEGER NOT NULL
);
CREATE TABLE aggregate_rows(
  aggregate_id INTEGER NOT NULL,
  idx INTEGER NOT NULL,
  key TEXT NOT NULL,
  value,
  count INTEGER NOT NULL,
  PRIMARY KEY(aggregate_id, idx)
) WITHOUT ROWID;
CREATE TABLE event_blocks(
  id INTEGER PRIMARY KEY,
  first_index INTEGER NOT NULL,
  count INTEGER NOT NULL,
  first_ns INTEGER NOT NULL,
  last_ns INTEGER NOT NULL,
  data BLOB NOT NULL
);
CREATE TABLE hit_blocks(
  id INTEGER PRIMARY KEY,
  first_index INTEGER NOT NULL,
  count INTEGER NOT NULL,
  first_ns INTEGER NOT NULL,
  last_ns INTEGER NOT NULL,
  data BLOB NOT NULL
);
CREATE TABLE profile_snapshot(
  idx INTEGER PRIMARY KEY,
  data BLOB NOT NULL
);
CREATE TABLE profile_bins(
  level INTEGER NOT NULL,
  bin INTEGER NOT NULL,
  tid INTEGER NOT NULL,
  field INTEGER NOT NULL,
  reads INTEGER NOT NULL,
  writes INTEGER NOT NULL,
  PRIMARY KEY(level, bin, tid, field)
) WITHOUT ROWID;
CREATE TABLE aggregate_buckets(
  aggregate_id INTEGER NOT NULL,
  row_idx INTEGER NOT NULL,
  idx INTEGER NOT NULL,
  low INTEGER,
  high INTEGER,
  count INTEGER NOT NULL,
  PRIMARY KEY(aggregate_id, row_idx, idx)
) WITHOUT ROWID;
)sql";

// Removes `p` if it exists (never following a symlink); ENOENT is success.
absl::Status RemoveIfPresent(const std::string& p) {
  if (::unlink(p.c_str()) != 0) {
    const int err = errno;
    if (err != ENOENT) {
      return SyscallError(err, absl::StrCat("unlink(", p, ")"));
    }
  }
  return absl::OkStatus();
}

// Whether a regular file is at `path` (a recording to replace); refuses a symbolic link (a
// dangling one too) and anything but a regular file.
absl::StatusOr<bool> ExistingRecordingAt(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    const int err = errno;
    if (err != ENOENT) {
      return SyscallError(err, absl::StrCat("lstat(", path, ")"));
    }
    return false;
  }
  if (S_ISLNK(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": is a symbolic link; refusing to write a recording through it"));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": exists and is not a regular file; refusing to replace it"));
  }
  return true;
}

// Makes `path` a fresh empty regular file, mode 0600, created by us (O_EXCL|O_NOFOLLOW), and
// returns it open for writing.
absl::StatusOr<UniqueFd> CreateFreshFile(const std::string& path) {
  KW_ASSIGN_OR_RETURN(const bool exists, ExistingRecordingAt(path));
  if (exists) {
    KW_RETURN_IF_ERROR(RemoveIfPresent(path));
  }
  // A stale WAL beside a new database would be replayed into it.
  for (const char* suffix : {"-wal", "-shm", "-journal"}) {
    KW_RETURN_IF_ERROR(RemoveIfPresent(path + suffix));
  }
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!fd.valid()) {
    const int err = errno;
    return SyscallError(err, absl::StrCat("open(", path, ", O_CREAT|O_EXCL|O_NOFOLLOW)"));
  }
  if (::fchmod(fd.get(), 0600) != 0) {  // exactly 0600 whatever the umask
    const int err = errno;
    return SyscallError(err, absl::StrCat("fchmod(", path, ", 0600)"));
  }
  return fd;
}

// An unlinked file of `bytes` allocated bytes in the directory of `path` (so on its
// filesystem and under its quota), or an invalid fd when the filesystem cannot make one
// (no O_TMPFILE) or has no room: the reserve is best effort.
UniqueFd MakeReserve(const std::string& path, off_t bytes) {
  const size_t slash = path.rfind('/');
  const std::string dir =
      slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  UniqueFd fd(::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600));
  if (!fd.valid()) {
    return fd;
  }
  if (::fallocate(fd.get(), 0, 0, bytes) == 0) {
    return fd;
  }
  // No fallocate on this filesystem: write the bytes.
  static constexpr size_t kChunk = size_t{64} * 1024;
  static constexpr std::array<char, kChunk> kZeros{};
  for (off_t off = 0; off < bytes; off += static_cast<off_t>(kChunk)) {
    if (::pwrite(fd.get(), kZeros.data(), kChunk, off) != static_cast<ssize_t>(kChunk)) {
      return {};
    }
  }
  if (::fsync(fd.get()) != 0) {
    return {};
  }
  return fd;
}

// The path the open file `fd` has now ("/proc/self/fd/N"), or "" if unknown.
std::string CurrentPath(int fd) {
  std::array<char, 4096> buf{};
  const std::string link = absl::StrCat("/proc/self/fd/", fd);
  const ssize_t n = ::readlink(link.c_str(), buf.data(), buf.size() - 1);
  if (n <= 0) {
    return "";
  }
  return {buf.data(), static_cast<size_t>(n)};
}

void BindU64(sqlite3_stmt* s, int i, uint64_t v) {
  sqlite3_bind_int64(s, i, ToSqlInt(v));
}

void BindOptU64(sqlite3_stmt* s, int i, const std::optional<uint64_t>& v) {
  if (v.has_value()) {
    sqlite3_bind_int64(s, i, ToSqlInt(*v));
  } else {
    sqlite3_bind_null(s, i);
  }
}

void BindCpu(sqlite3_stmt* s, int i, uint32_t cpu) {
  if (cpu == kUnknownCpu) {
    sqlite3_bind_null(s, i);
  } else {
    sqlite3_bind_int64(s, i, cpu);
  }
}

void BindText(sqlite3_stmt* s, int i, absl::string_view t) {
  sqlite3_bind_text(s, i, t.data(), static_cast<int>(t.size()), SQLITE_TRANSIENT);
}

constexpr int kEventColumns = 15;

// Binds `e` to parameters base+1 ... base+kEventColumns.
void BindEvent(sqlite3_stmt* s, int base, const AccessEvent& e) {
  BindU64(s, base + 1, e.time_ns);
  sqlite3_bind_int64(s, base + 2, e.pid);
  sqlite3_bind_int64(s, base + 3, e.tid);
  BindCpu(s, base + 4, e.cpu);
  sqlite3_bind_int64(s, base + 5, e.watch_id);
  BindU64(s, base + 6, e.ip.value);
  if (e.trap_ip == e.ip) {
    sqlite3_bind_null(s, base + 7);
  } else {
    BindU64(s, base + 7, e.trap_ip.value);
  }
  BindU64(s, base + 8, e.addr.value);
  sqlite3_bind_int64(s, base + 9, e.len);
  BindU64(s, base + 10, e.access_addr.value);
  sqlite3_bind_int64(s, base + 11, e.access_size);
  sqlite3_bind_text(s, base + 12, AccessKindLetter(e.kind).data(), 1, SQLITE_STATIC);
  BindOptU64(s, base + 13, e.value);
  BindOptU64(s, base + 14, e.old_value);
  sqlite3_bind_int(s, base + 15, e.value_exact ? 1 : 0);
}

// Binds `h` to parameters base+1 ... base+9 (a row of `hits`).
void BindHit(sqlite3_stmt* s, int base, const HitRecord& h) {
  BindU64(s, base + 1, h.time_ns);
  sqlite3_bind_int64(s, base + 2, h.pid);
  sqlite3_bind_int64(s, base + 3, h.tid);
  BindCpu(s, base + 4, h.cpu);
  sqlite3_bind_int64(s, base + 5, h.probe_id);
  BindU64(s, base + 6, h.ip.value);
  sqlite3_bind_int(s, base + 7, h.is_return ? 1 : 0);
  BindText(s, base + 8, EncodeArgsJson(h.args));
  if (h.stack_id != 0) {
    sqlite3_bind_int64(s, base + 9, h.stack_id);
  } else {
    sqlite3_bind_null(s, base + 9);
  }
}

// "INSERT INTO events VALUES(?,...),(?,...)..." for `rows` rows.
std::string InsertEventsSql(size_t rows) {
  std::string sql = "INSERT INTO events VALUES";
  for (size_t r = 0; r < rows; ++r) {
    absl::StrAppend(&sql, r == 0 ? "" : ",", "(?");
    for (int c = 1; c < kEventColumns; ++c) {
      sql += ",?";
    }
    sql += ")";
  }
  return sql;
}

void BindOptI64(sqlite3_stmt* s, int i, const std::optional<int64_t>& v) {
  if (v.has_value()) {
    sqlite3_bind_int64(s, i, *v);
  } else {
    sqlite3_bind_null(s, i);
  }
}

// An aggregation's value as stored: INTEGER when the printed text is a 64-bit signed integer,
// REAL for avg's other values ("2.5"), TEXT for an unsigned one above 2^63 - 1; NULL for "".
void BindAggregateValue(sqlite3_stmt* s, int i, const std::string& value) {
  int64_t n = 0;
  double d = 0;
  if (value.empty()) {
    sqlite3_bind_null(s, i);
  } else if (absl::SimpleAtoi(value, &n)) {
    sqlite3_bind_int64(s, i, n);
  } else if (value.find_first_of(".e") != std::string::npos && absl::SimpleAtod(value, &d)) {
    sqlite3_bind_double(s, i, d);
  } else {
    BindText(s, i, value);
  }
}

// Steps a statement that returns no rows and resets it.
int StepDone(sqlite3_stmt* s) {
  const int rc = sqlite3_step(s);
  sqlite3_reset(s);
  return rc == SQLITE_DONE || rc == SQLITE_ROW ? SQLITE_OK : rc;
}

}  // namespace

TraceWriter::TraceWriter(std::string path, SqlitePtr db, size_t batch_size, UniqueFd file,
                         EventStorage storage)
    : path_(std::move(path)),
      db_(std::move(db)),
      batch_size_(std::max<size_t>(batch_size, 1)),
      file_(std::move(file)),
      storage_(storage) {
  events_.reserve(batch_size_);
}

absl::StatusOr<std::unique_ptr<TraceWriter>> TraceWriter::Create(const std::string& final_path,
                                                                 const SessionRecord& session,
                                                                 size_t batch_size,
                                                                 EventStorage storage) {
  KW_ASSIGN_OR_RETURN(const bool exists, ExistingRecordingAt(final_path));
  // An existing file is replaced only by a complete recording: until Finish, the new one is
  // written beside it.
  const std::string path = exists ? absl::StrCat(final_path, ".new-", ::getpid()) : final_path;
  KW_ASSIGN_OR_RETURN(UniqueFd file, CreateFreshFile(path));
  sqlite3* raw = nullptr;
  const int rc = sqlite3_open_v2(
      path.c_str(), &raw,
      SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_NOFOLLOW | SQLITE_OPEN_EXRESCODE,
      nullptr);
  SqlitePtr db(raw);
  if (rc != SQLITE_OK) {
    return SqliteError(db.get(), rc, absl::StrCat("opening ", path));
  }
  std::unique_ptr<TraceWriter> w(
      new TraceWriter(path, std::move(db), batch_size, std::move(file), storage));
  if (exists) {
    w->replaces_ = final_path;
  }
  KW_RETURN_IF_ERROR(w->Init(session));
  w->reserve_ = MakeReserve(path, kReserveBytes);
  return w;
}

absl::Status TraceWriter::Error(int rc, const char* what) {
  return SqliteError(db_.get(), rc, absl::StrCat(what, " ", path_));
}

absl::Status TraceWriter::Init(const SessionRecord& session) {
  sqlite3* db = db_.get();
  sqlite3_db_config(db, SQLITE_DBCONFIG_ENABLE_LOAD_EXTENSION, 0, nullptr);
  sqlite3_db_config(db, SQLITE_DBCONFIG_DEFENSIVE, 1, nullptr);
  const std::string context = absl::StrCat("creating ", path_);
  // Page size first: it is fixed once the first table exists.
  KW_RETURN_IF_ERROR(SqliteExec(db,
                                "PRAGMA page_size=4096;"
                                "PRAGMA secure_delete=OFF;"
                                "PRAGMA cache_size=-16384;",
                                context));
  KW_RETURN_IF_ERROR(SqliteExec(db, "BEGIN", context));
  KW_RETURN_IF_ERROR(SqliteExec(db, kSchemaSql, context));
  KW_RETURN_IF_ERROR(SqliteExec(db,
                                absl::StrCat("PRAGMA application_id=", kTraceApplicationId,
                                             ";PRAGMA user_version=", kTraceSchemaVersion, ";")
                                    .c_str(),
                                context));
  {
    KW_ASSIGN_OR_RETURN(
        SqliteStmtPtr s,
        SqlitePrepare(db,
                      "INSERT INTO session(command_line,pid,kernel,host,start_wall_ns,"
                      "start_mono_ns,kwatch_version,mode,backend,ns_pid) "
                      "VALUES(?,?,?,?,?,?,?,?,?,?)",
                      context));
    sqlite3_stmt* st = s.get();
    BindText(st, 1, session.command_line);
    sqlite3_bind_int64(st, 2, session.pid);
    BindText(st, 3, session.kernel);
    BindText(st, 4, session.host);
    BindU64(st, 5, session.start_wall_ns);
    BindU64(st, 6, session.start_mono_ns);
    BindText(st, 7, session.kwatch_version);
    BindText(st, 8, session.mode);
    BindText(st, 9, session.backend);
    if (session.ns_pid != 0) {
      sqlite3_bind_int64(st, 10, session.ns_pid);
    } else {
      sqlite3_bind_null(st, 10);
    }
    if (const int rc = StepDone(st); rc != SQLITE_OK) {
      return SqliteError(db, rc, context);
    }
  }
  KW_RETURN_IF_ERROR(SqliteExec(db, "COMMIT", context));
  // WAL: committed batches survive a killed writer; NORMAL: no fsync per commit.
  KW_ASSIGN_OR_RETURN(SqliteStmtPtr wal, SqlitePrepare(db, "PRAGMA journal_mode=WAL", context));
  if (sqlite3_step(wal.get()) != SQLITE_ROW || absl::string_view(reinterpret_cast<const char*>(
                                                   sqlite3_column_text(wal.get(), 0))) != "wal") {
    return absl::InternalError(absl::StrCat(context, ": could not switch to WAL mode"));
  }
  wal.reset();
  // OFF: commits and the WAL's restarts never fsync, so the pages of a small WAL are rewritten
  // in the page cache (the disk sees them about once per writeback) and each committed page
  // reaches the file once: write amplification ~1.1x instead of ~3x (issue 27). A killed
  // writer loses nothing committed; the checkpoint thread makes the file durable every
  // WalCheckpointer::kDefaultDurableEveryNs, and Finish syncs.
  KW_RETURN_IF_ERROR(SqliteExec(db, "PRAGMA synchronous=OFF", context));
  // Checkpoints after commits keep the WAL small; a thread of its own makes the file durable.
  sqlite3_busy_timeout(db, 5000);
  KW_ASSIGN_OR_RETURN(checkpointer_, WalCheckpointer::Start(path_));
  checkpointer_->Attach(db, kCheckpointPages);

  KW_ASSIGN_OR_RETURN(begin_, SqlitePrepare(db, "BEGIN", context));
  KW_ASSIGN_OR_RETURN(commit_, SqlitePrepare(db, "COMMIT", context));
  KW_ASSIGN_OR_RETURN(insert_event_, SqlitePrepare(db, InsertEventsSql(1), context));
  KW_ASSIGN_OR_RETURN(insert_events_,
                      SqlitePrepare(db, InsertEventsSql(kEventsPerInsert), context));
  KW_ASSIGN_OR_RETURN(
      insert_hit_,
      SqlitePrepare(db, "INSERT INTO hits VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9)", context));
  KW_ASSIGN_OR_RETURN(
      insert_frame_,
      SqlitePrepare(db, "INSERT INTO stack_frames VALUES(?1,?2,?3,?4,?5,?6,?7)", context));
  KW_ASSIGN_OR_RETURN(
      insert_site_,
      SqlitePrepare(db, "INSERT OR IGNORE INTO sites VALUES(?1,?2,?3,?4,?5,?6,?7)", context));
  KW_ASSIGN_OR_RETURN(insert_task_,
                      SqlitePrepare(db, "INSERT OR IGNORE INTO tasks VALUES(?1,?2,?3)", context));
  for (const char* table : {"event_blocks", "hit_blocks"}) {
    KW_ASSIGN_OR_RETURN(
        SqliteStmtPtr insert,
        SqlitePrepare(
            db,
            absl::StrCat("INSERT INTO ", table,
                         "(first_index,count,first_ns,last_ns,data) VALUES(?1,?2,?3,?4,?5)"),
            context));
    KW_ASSIGN_OR_RETURN(
        SqliteStmtPtr remove,
        SqlitePrepare(db, absl::StrCat("DELETE FROM ", table, " WHERE id=?1"), context));
    if (absl::string_view(table) == "event_blocks") {
      event_blocks_.insert = std::move(insert);
      event_blocks_.remove = std::move(remove);
    } else {
      hit_blocks_.insert = std::move(insert);
      hit_blocks_.remove = std::move(remove);
    }
  }
  if (storage_ == EventStorage::kBlocks) {
    KW_RETURN_IF_ERROR(SqliteExec(db, "UPDATE session SET event_blocks=1, hit_blocks=1", context));
  }
  KW_ASSIGN_OR_RETURN(delete_snapshot_, SqlitePrepare(db, "DELETE FROM profile_snapshot", context));
  KW_ASSIGN_OR_RETURN(insert_snapshot_,
                      SqlitePrepare(db, "INSERT INTO profile_snapshot VALUES(?1,?2)", context));
  KW_ASSIGN_OR_RETURN(upsert_bin_,
                      SqlitePrepare(db,
                                    "INSERT INTO profile_bins VALUES(?1,?2,?3,?4,?5,?6) "
                                    "ON CONFLICT(level,bin,tid,field) DO UPDATE SET "
                                    "reads=reads+excluded.reads, writes=writes+excluded.writes",
                                    context));
  KW_ASSIGN_OR_RETURN(update_summary_,
                      SqlitePrepare(db, "UPDATE session SET summary_events=?1", context));
  KW_ASSIGN_OR_RETURN(update_counts_,
                      SqlitePrepare(db,
                                    "UPDATE session SET event_count=?1, hit_count=?2, "
                                    "events_in_order=?3, hits_in_order=?4",
                                    context));
  return absl::OkStatus();
}

TraceWriter::~TraceWriter() {
  const bool healthy = !finished_ && error_.ok() && db_ != nullptr && Commit().ok();
  (void)StopCheckpointer();
  if (healthy) {
    // Cut short but closed cleanly: still one file, synced. Best effort.
    sqlite3_exec(db_.get(), "PRAGMA synchronous=NORMAL; PRAGMA journal_mode=DELETE", nullptr,
                 nullptr, nullptr);
  }
  // SQLite's locks are POSIX locks, which closing any fd of the file drops: close it last.
  db_.reset();
  file_.Reset();
}

absl::Status TraceWriter::StopCheckpointer() {
  if (checkpointer_ == nullptr) {
    return absl::OkStatus();
  }
  if (db_ != nullptr) {
    sqlite3_wal_hook(db_.get(), nullptr, nullptr);
  }
  absl::Status s = checkpointer_->Stop();
  checkpointer_.reset();
  return s;
}

absl::Status TraceWriter::Check() const {
  if (!error_.ok()) {
    return error_;
  }
  if (finished_) {
    return absl::FailedPreconditionError(absl::StrCat(path_, ": recording already finished"));
  }
  return absl::OkStatus();
}

absl::Status TraceWriter::Fail(absl::Status s) {
  if (error_.ok()) {
    error_ = s;
  }
  return s;
}

absl::Status TraceWriter::AddWatch(const WatchRecord& w) {
  KW_RETURN_IF_ERROR(Check());
  sqlite3* db = db_.get();
  const std::string context = absl::StrCat("writing watch ", w.id, " to ", path_);
  KW_ASSIGN_OR_RETURN(SqliteStmtPtr ws,
                      SqlitePrepare(db, "INSERT INTO watches VALUES(?,?,?,?,?,?,?,?)", context));
  KW_ASSIGN_OR_RETURN(
      SqliteStmtPtr fs,
      SqlitePrepare(db, "INSERT INTO fields VALUES(?,?,?,?,?,?,?,?,?,?,?)", context));
  if (const int rc = StepDone(begin_.get()); rc != SQLITE_OK) {
    return WriteFailure(SqliteError(db, rc, context), 0);
  }
  int rc = SQLITE_OK;
  sqlite3_stmt* s = ws.get();
  sqlite3_bind_int64(s, 1, w.id);
  BindText(s, 2, w.expr);
  BindU64(s, 3, w.address.value);
  BindU64(s, 4, w.length);
  BindText(s, 5, w.kind);
  BindText(s, 6, w.backend);
  BindText(s, 7, w.coverage);
  BindText(s, 8, w.type_name);
  rc = StepDone(s);
  for (size_t i = 0; rc == SQLITE_OK && i < w.fields.size(); ++i) {
    const symbols::FieldLayout& f = w.fields[i];
    s = fs.get();
    sqlite3_bind_int64(s, 1, w.id);
    sqlite3_bind_int64(s, 2, static_cast<int64_t>(i));
    BindText(s, 3, f.path);
    BindText(s, 4, f.type_name);
    BindU64(s, 5, f.offset);
    BindU64(s, 6, f.size);
    sqlite3_bind_int64(s, 7, f.bit_offset);
    sqlite3_bind_int64(s, 8, f.bit_size);
    sqlite3_bind_int64(s, 9, f.depth);
    sqlite3_bind_int(s, 10, f.is_leaf ? 1 : 0);
    sqlite3_bind_int(s, 11, f.is_union ? 1 : 0);
    rc = StepDone(s);
  }
  if (rc == SQLITE_OK) {
    rc = StepDone(commit_.get());
  }
  if (rc != SQLITE_OK) {
    absl::Status st = SqliteError(db, rc, context);
    sqlite3_exec(db, "ROLLBACK", nullptr, nullptr, nullptr);
    // A duplicate id is the caller's mistake, not a broken file.
    if ((rc & 0xff) == SQLITE_CONSTRAINT) {
      return absl::InvalidArgumentError(st.message());
    }
    return WriteFailure(st, 0);
  }
  if (summary_ != nullptr) {
    summary_->OnWatch(w);
  }
  return absl::OkStatus();
}

void TraceWriter::SetSummarySource(std::unique_ptr<SummarySource> source) {
  KW_CHECK(events_committed_ == 0 && events_.empty());
  summary_ = std::move(source);
}

absl::Status TraceWriter::WriteSummary() {
  ProfileSummaryUpdate u = summary_->TakeUpdate();
  summary_pending_ = 0;
  summary_written_ = true;
  if (const int rc = StepDone(delete_snapshot_.get()); rc != SQLITE_OK) {
    return Error(rc, "writing the profile to");
  }
  sqlite3_stmt* s = insert_snapshot_.get();
  for (size_t off = 0, idx = 0; off < u.snapshot.size(); off += kSnapshotChunkBytes, ++idx) {
    const size_t n = std::min(kSnapshotChunkBytes, u.snapshot.size() - off);
    sqlite3_bind_int64(s, 1, static_cast<int64_t>(idx));
    sqlite3_bind_blob(s, 2, u.snapshot.data() + off, static_cast<int>(n), SQLITE_STATIC);
    if (const int rc = StepDone(s); rc != SQLITE_OK) {
      return Error(rc, "writing the profile to");
    }
  }
  s = upsert_bin_.get();
  for (const ProfileBinCell& c : u.cells) {
    sqlite3_bind_int64(s, 1, c.level);
    sqlite3_bind_int64(s, 2, c.bin);
    sqlite3_bind_int64(s, 3, c.tid);
    sqlite3_bind_int64(s, 4, c.field);
    BindU64(s, 5, c.reads);
    BindU64(s, 6, c.writes);
    if (const int rc = StepDone(s); rc != SQLITE_OK) {
      return Error(rc, "writing the profile to");
    }
  }
  s = update_summary_.get();
  if (u.snapshot.empty()) {
    sqlite3_bind_null(s, 1);  // no profile to read: the report replays the events
  } else {
    BindU64(s, 1, events_committed_ + events_.size());
  }
  if (const int rc = StepDone(s); rc != SQLITE_OK) {
    return Error(rc, "writing the profile to");
  }
  return absl::OkStatus();
}

namespace {

std::string EncodeBlock(absl::Span<const AccessEvent> events) {
  return EncodeEventBlock(events);
}

std::string EncodeBlock(absl::Span<const HitRecord> hits) {
  return EncodeHitBlock(hits);
}

// How many of `rest`'s first records make its next block.
size_t BlockLength(absl::Span<const AccessEvent> rest) {
  return std::min(rest.size(), kBlockEvents);
}

size_t BlockLength(absl::Span<const HitRecord> rest) {
  size_t n = 0;
  size_t bytes = 0;
  while (n < rest.size() && n < kBlockEvents && (n == 0 || bytes < kHitBlockBytes)) {
    bytes += HitBlockBytes(rest[n++]);
  }
  return n;
}

}  // namespace

template <typename Record>
absl::Status TraceWriter::WriteBlocks(BlockTable<Record>& table, const std::vector<Record>& batch,
                                      uint64_t committed, const char* what) {
  // The last block while small, and in time order with this batch, takes this batch's first
  // records: blocks stay thousands of records long at low rates too.
  const bool merge = !table.tail.empty() && table.tail.back().time_ns <= batch.front().time_ns;
  std::vector<Record> merged;
  absl::Span<const Record> all = batch;
  uint64_t index = committed + 1;
  if (merge) {
    sqlite3_bind_int64(table.remove.get(), 1, table.tail_id);
    if (const int rc = StepDone(table.remove.get()); rc != SQLITE_OK) {
      return Error(rc, what);
    }
    merged.reserve(table.tail.size() + batch.size());
    merged = table.tail;
    merged.insert(merged.end(), batch.begin(), batch.end());
    all = merged;
    index = table.tail_index;
  }
  sqlite3_stmt* s = table.insert.get();
  std::vector<Record> last;
  for (size_t off = 0; off < all.size();) {
    const absl::Span<const Record> block = all.subspan(off, BlockLength(all.subspan(off)));
    const std::string data = EncodeBlock(block);
    BindU64(s, 1, index + off);
    BindU64(s, 2, block.size());
    BindU64(s, 3, block.front().time_ns);
    BindU64(s, 4, block.back().time_ns);
    sqlite3_bind_blob(s, 5, data.data(), static_cast<int>(data.size()), SQLITE_STATIC);
    if (const int rc = StepDone(s); rc != SQLITE_OK) {
      return Error(rc, what);
    }
    if (off + block.size() >= all.size() && block.size() < kBlockEvents / 8) {
      last.assign(block.begin(), block.end());
      table.tail_id = sqlite3_last_insert_rowid(db_.get());
      table.tail_index = index + off;
    }
    off += block.size();
  }
  // Only once committed does the tail move on (TakeTail); the caller clears it on a failure.
  table.pending_tail = std::move(last);
  return absl::OkStatus();
}

template <typename Record>
void TraceWriter::TakeTail(BlockTable<Record>& table, const std::vector<Record>& batch) {
  if (!batch.empty()) {
    table.tail = std::move(table.pending_tail);
    table.pending_tail.clear();
  }
}

absl::Status TraceWriter::AddProbe(const ProbeRecord& p) {
  KW_RETURN_IF_ERROR(Check());
  sqlite3* db = db_.get();
  const std::string context = absl::StrCat("writing probe ", p.id, " to ", path_);
  KW_ASSIGN_OR_RETURN(SqliteStmtPtr ps,
                      SqlitePrepare(db, "INSERT INTO probes VALUES(?,?,?,?,?,?,?,?)", context));
  sqlite3_stmt* s = ps.get();
  sqlite3_bind_int64(s, 1, p.id);
  BindText(s, 2, p.event);
  BindText(s, 3, p.spec);
  BindU64(s, 4, p.address.value);
  BindText(s, 5, p.function);
  BindText(s, 6, p.file);
  sqlite3_bind_int64(s, 7, p.line);
  sqlite3_bind_int(s, 8, p.is_return ? 1 : 0);
  if (const int rc = StepDone(s); rc != SQLITE_OK) {
    absl::Status st = SqliteError(db, rc, context);
    if ((rc & 0xff) == SQLITE_CONSTRAINT) {
      return absl::InvalidArgumentError(st.message());
    }
    return WriteFailure(st, 0);
  }
  return absl::OkStatus();
}

absl::Status TraceWriter::AddAggregates(const std::vector<AggregateRecord>& aggregates) {
  KW_RETURN_IF_ERROR(Check());
  if (aggregates.empty()) {
    return absl::OkStatus();
  }
  sqlite3* db = db_.get();
  const std::string context = absl::StrCat("writing aggregations to ", path_);
  KW_ASSIGN_OR_RETURN(SqliteStmtPtr as,
                      SqlitePrepare(db, "INSERT INTO aggregates VALUES(?,?,?,?,?,?)", context));
  KW_ASSIGN_OR_RETURN(SqliteStmtPtr rs,
                      SqlitePrepare(db, "INSERT INTO aggregate_rows VALUES(?,?,?,?,?)", context));
  KW_ASSIGN_OR_RETURN(
      SqliteStmtPtr bs,
      SqlitePrepare(db, "INSERT INTO aggregate_buckets VALUES(?,?,?,?,?,?)", context));
  int rc = StepDone(begin_.get());
  // Numbered after those already stored: the ids keep the order of the calls.
  auto next = SqliteQueryInt(db, "SELECT ifnull(max(id) + 1, 0) FROM aggregates", context);
  if (!next.ok()) {
    sqlite3_exec(db, "ROLLBACK", nullptr, nullptr, nullptr);
    return WriteFailure(next.status(), 0);
  }
  for (size_t a = 0; rc == SQLITE_OK && a < aggregates.size(); ++a) {
    const AggregateRecord& agg = aggregates[a];
    const int64_t id = *next + static_cast<int64_t>(a);
    sqlite3_stmt* s = as.get();
    sqlite3_bind_int64(s, 1, id);
    sqlite3_bind_int64(s, 2, agg.probe_id);
    BindText(s, 3, agg.event);
    BindText(s, 4, agg.agg);
    BindText(s, 5, agg.func);
    BindU64(s, 6, agg.no_value);
    rc = StepDone(s);
    for (size_t r = 0; rc == SQLITE_OK && r < agg.rows.size(); ++r) {
      const AggregateRowRecord& row = agg.rows[r];
      s = rs.get();
      sqlite3_bind_int64(s, 1, id);
      sqlite3_bind_int64(s, 2, static_cast<int64_t>(r));
      BindText(s, 3, EncodeArgsJson(row.key));
      BindAggregateValue(s, 4, row.value);
      BindU64(s, 5, row.count);
      rc = StepDone(s);
      for (size_t b = 0; rc == SQLITE_OK && b < row.buckets.size(); ++b) {
        const AggregateBucketRecord& bucket = row.buckets[b];
        s = bs.get();
        sqlite3_bind_int64(s, 1, id);
        sqlite3_bind_int64(s, 2, static_cast<int64_t>(r));
        sqlite3_bind_int64(s, 3, static_cast<int64_t>(b));
        BindOptI64(s, 4, bucket.low);
        BindOptI64(s, 5, bucket.high);
        BindU64(s, 6, bucket.count);
        rc = StepDone(s);
      }
    }
  }
  if (rc == SQLITE_OK) {
    rc = StepDone(commit_.get());
  }
  if (rc != SQLITE_OK) {
    absl::Status st = SqliteError(db, rc, context);
    sqlite3_exec(db, "ROLLBACK", nullptr, nullptr, nullptr);
    return WriteFailure(st, 0);
  }
  return absl::OkStatus();
}

absl::Status TraceWriter::AddSite(const SiteRecord& s) {
  KW_RETURN_IF_ERROR(Check());
  if (site_ips_.insert(s.ip.value).second) {
    sites_.push_back(s);
  }
  return absl::OkStatus();
}

absl::Status TraceWriter::AddStack(const StackRecord& stack) {
  KW_RETURN_IF_ERROR(Check());
  if (stack_ids_.insert(stack.id).second) {
    stacks_.push_back(stack);
  }
  return absl::OkStatus();
}

absl::Status TraceWriter::AddTask(const TaskRecord& t) {
  KW_RETURN_IF_ERROR(Check());
  if (task_keys_.insert({t.tid, t.comm}).second) {
    tasks_.push_back(t);
  }
  return absl::OkStatus();
}

absl::Status TraceWriter::Append(const AccessEvent& e) {
  if (!error_.ok() || finished_) {
    return Check();
  }
  events_.push_back(e);
  if (events_.size() + hits_.size() >= batch_size_) {
    return Commit();
  }
  return absl::OkStatus();
}

absl::Status TraceWriter::AppendHit(HitRecord&& h) {
  if (!error_.ok() || finished_) {
    return Check();
  }
  hits_.push_back(std::move(h));
  if (events_.size() + hits_.size() >= batch_size_) {
    return Commit();
  }
  return absl::OkStatus();
}

absl::Status TraceWriter::Flush() {
  KW_RETURN_IF_ERROR(Check());
  return Commit();
}

absl::Status TraceWriter::Commit() {
  const size_t dropped = pending();
  if (absl::Status s = CheckLocation(); !s.ok()) {
    events_.clear();
    hits_.clear();
    sites_.clear();
    tasks_.clear();
    stacks_.clear();
    return WriteFailure(s, dropped);
  }
  if (events_.empty() && hits_.empty() && sites_.empty() && tasks_.empty() && stacks_.empty()) {
    return absl::OkStatus();
  }
  absl::Status s = WriteBatch();
  if (s.ok() && checkpointer_ != nullptr) {
    s = checkpointer_->error();
    if (s.ok() && checkpointer_->wal_pages() >= kRestartPages) {
      // Past the bound by a sixteenth: wait for the reader or the durable point (a loaded
      // machine can make every try without waiting find it busy) rather than grow on.
      s = RestartWal(checkpointer_->wal_pages() >= kRestartPages + kRestartPages / 16);
    }
  }
  events_.clear();
  hits_.clear();
  sites_.clear();
  tasks_.clear();
  stacks_.clear();
  if (!s.ok()) {
    sqlite3_exec(db_.get(), "ROLLBACK", nullptr, nullptr, nullptr);
    return WriteFailure(s, dropped);
  }
  return absl::OkStatus();
}

absl::Status TraceWriter::CheckLocation() {
  if (!file_.valid()) {
    return absl::OkStatus();
  }
  struct stat fst {};
  struct stat pst {};
  // The path first: a removal between the two calls then shows in the file's link count
  // (fstat after stat), not as a file renamed away.
  const bool at_path = ::stat(path_.c_str(), &pst) == 0;
  if (::fstat(file_.get(), &fst) != 0) {
    const int err = errno;
    return SyscallError(err, absl::StrCat("fstat(", path_, ")"));
  }
  if (fst.st_nlink == 0) {
    location_lost_ = true;
    return absl::DataLossError(
        absl::StrCat(path_,
                     ": the recording's file was removed while recording (its directory "
                     "deleted?); the recording is lost"));
  }
  if (!at_path || pst.st_dev != fst.st_dev || pst.st_ino != fst.st_ino) {
    moved_to_ = CurrentPath(file_.get());
    return absl::FailedPreconditionError(absl::StrCat(
        path_, ": the recording's file or directory was renamed or replaced while recording",
        moved_to_.empty() ? "" : absl::StrCat("; the recording is now ", moved_to_)));
  }
  return absl::OkStatus();
}

absl::Status TraceWriter::WriteFailure(const absl::Status& s, size_t dropped) {
  if (!error_.ok()) {
    return error_;
  }
  std::string message(s.message());
  if (location_lost_) {
    absl::StrAppend(&message, " (", events_committed_, " events and ", hits_committed_,
                    " probe hits had been written into it)");
    (void)StopCheckpointer();
  } else {
    absl::StrAppend(&message, "; recording stopped with ", events_committed_, " events and ",
                    hits_committed_, " probe hits committed, ", dropped,
                    " lost with the failed batch");
    MarkCutShort(message, dropped);
  }
  error_ = absl::Status(s.code(), message);
  return error_;
}

void TraceWriter::MarkCutShort(const std::string& reason, uint64_t dropped) {
  // The writer is dead from here on: no more checkpoints in the background.
  (void)StopCheckpointer();
  // Room for this last small commit on a full disk.
  reserve_.Reset();
  sqlite3* db = db_.get();
  if (db == nullptr) {
    return;
  }
  sqlite3_exec(db, "ROLLBACK", nullptr, nullptr, nullptr);
  sqlite3_stmt* raw = nullptr;
  if (sqlite3_prepare_v2(db,
                         "UPDATE session SET end_wall_ns=?1, end_mono_ns=?2, exit_reason=?3, "
                         "lost_count=?4, complete=0",
                         -1, &raw, nullptr) != SQLITE_OK) {
    return;
  }
  SqliteStmtPtr stmt(raw);
  BindU64(raw, 1, WallClockNs());
  BindU64(raw, 2, MonotonicClockNs());
  BindText(raw, 3, absl::StrCat("recording cut short: ", reason));
  BindU64(raw, 4, dropped);
  (void)StepDone(raw);  // best effort: the recording is readable without it
  stmt.reset();
  if (!moved_to_.empty()) {
    // The file was renamed, perhaps without path-wal: fold the WAL into the file itself.
    sqlite3_exec(db, "PRAGMA wal_checkpoint(TRUNCATE)", nullptr, nullptr, nullptr);
  }
}

absl::Status TraceWriter::RestartWal(bool wait) {
  // The checkpoints after commits keep the WAL short, but a reader holding an old snapshot
  // (kwatch-gui --follow, sqlite3) keeps it from restarting, and a durable point's checkpoint
  // may be in the way. A RESTART checkpoint from here copies what is left and restarts the WAL.
  // Without waiting (unless `wait`): if a reader or the durable point is in the way, it returns
  // busy and the next commit tries again.
  sqlite3* db = db_.get();
  sqlite3_busy_timeout(db, wait ? 5000 : 0);
  const int rc =
      sqlite3_wal_checkpoint_v2(db, nullptr, SQLITE_CHECKPOINT_RESTART, nullptr, nullptr);
  sqlite3_busy_timeout(db, 5000);
  if (rc != SQLITE_OK && (rc & 0xff) != SQLITE_BUSY) {
    return Error(rc, "checkpointing");
  }
  return absl::OkStatus();
}

absl::Status TraceWriter::WriteBatch() {
  // Sort each batch by time, so that rowid order is time order as long as batches do not
  // overlap in time.
  auto by_time = [](const auto& a, const auto& b) { return a.time_ns < b.time_ns; };
  if (!std::is_sorted(events_.begin(), events_.end(), by_time)) {
    std::stable_sort(events_.begin(), events_.end(), by_time);
  }
  if (!std::is_sorted(hits_.begin(), hits_.end(), by_time)) {
    std::stable_sort(hits_.begin(), hits_.end(), by_time);
  }
  bool events_in_order = events_in_order_;
  bool hits_in_order = hits_in_order_;
  if (!events_.empty() && events_committed_ > 0 && events_.front().time_ns < max_event_time_) {
    events_in_order = false;
  }
  if (!hits_.empty() && hits_committed_ > 0 && hits_.front().time_ns < max_hit_time_) {
    hits_in_order = false;
  }

  if (const int rc = StepDone(begin_.get()); rc != SQLITE_OK) {
    return Error(rc, "writing to");
  }
  sqlite3_stmt* s = insert_site_.get();
  for (const SiteRecord& site : sites_) {
    BindU64(s, 1, site.ip.value);
    BindText(s, 2, site.function);
    BindU64(s, 3, site.offset);
    BindText(s, 4, site.file);
    sqlite3_bind_int64(s, 5, site.line);
    BindText(s, 6, site.disassembly);
    BindText(s, 7, site.inlined);
    if (const int rc = StepDone(s); rc != SQLITE_OK) {
      return Error(rc, "writing sites to");
    }
  }
  s = insert_frame_.get();
  for (const StackRecord& stack : stacks_) {
    for (size_t f = 0; f < stack.frames.size(); ++f) {
      const StackFrameRecord& frame = stack.frames[f];
      sqlite3_bind_int64(s, 1, stack.id);
      sqlite3_bind_int64(s, 2, static_cast<int64_t>(f));
      BindU64(s, 3, frame.ip.value);
      BindText(s, 4, frame.function);
      BindU64(s, 5, frame.offset);
      BindText(s, 6, frame.file);
      sqlite3_bind_int64(s, 7, frame.line);
      if (const int rc = StepDone(s); rc != SQLITE_OK) {
        return Error(rc, "writing stacks to");
      }
    }
  }
  s = insert_task_.get();
  for (const TaskRecord& t : tasks_) {
    sqlite3_bind_int64(s, 1, t.pid);
    sqlite3_bind_int64(s, 2, t.tid);
    BindText(s, 3, t.comm);
    if (const int rc = StepDone(s); rc != SQLITE_OK) {
      return Error(rc, "writing tasks to");
    }
  }
  // Most events go kEventsPerInsert at a time (one statement step per chunk); the rest one by one.
  size_t i = storage_ == EventStorage::kBlocks ? events_.size() : 0;
  if (storage_ == EventStorage::kBlocks && !events_.empty()) {
    KW_RETURN_IF_ERROR(WriteBlocks(event_blocks_, events_, events_committed_, "writing events to"));
  }
  for (; i + kEventsPerInsert <= events_.size(); i += kEventsPerInsert) {
    s = insert_events_.get();
    for (size_t j = 0; j < kEventsPerInsert; ++j) {
      BindEvent(s, static_cast<int>(j * kEventColumns), events_[i + j]);
    }
    if (const int rc = StepDone(s); rc != SQLITE_OK) {
      return Error(rc, "writing events to");
    }
  }
  s = insert_event_.get();
  for (; i < events_.size(); ++i) {
    BindEvent(s, 0, events_[i]);
    if (const int rc = StepDone(s); rc != SQLITE_OK) {
      return Error(rc, "writing events to");
    }
  }
  if (summary_ != nullptr && !events_.empty()) {
    summary_->OnEvents(events_);
    summary_pending_ += events_.size();
    if (summary_->WantsUpdate()) {
      KW_RETURN_IF_ERROR(WriteSummary());
    }
  }
  if (storage_ == EventStorage::kBlocks && !hits_.empty()) {
    KW_RETURN_IF_ERROR(WriteBlocks(hit_blocks_, hits_, hits_committed_, "writing probe hits to"));
  }
  if (storage_ == EventStorage::kRows) {
    s = insert_hit_.get();
    for (const HitRecord& h : hits_) {
      BindHit(s, 0, h);
      if (const int rc = StepDone(s); rc != SQLITE_OK) {
        return Error(rc, "writing probe hits to");
      }
    }
  }
  const uint64_t events_total = events_committed_ + events_.size();
  const uint64_t hits_total = hits_committed_ + hits_.size();
  s = update_counts_.get();
  BindU64(s, 1, events_total);
  BindU64(s, 2, hits_total);
  sqlite3_bind_int(s, 3, events_in_order ? 1 : 0);
  sqlite3_bind_int(s, 4, hits_in_order ? 1 : 0);
  if (const int rc = StepDone(s); rc != SQLITE_OK) {
    return Error(rc, "writing to");
  }
  if (const int rc = StepDone(commit_.get()); rc != SQLITE_OK) {
    return Error(rc, "committing to");
  }
  // Committed: only now does the in-memory state move on.
  if (!events_.empty()) {
    max_event_time_ = std::max(max_event_time_, events_.back().time_ns);
  }
  if (!hits_.empty()) {
    max_hit_time_ = std::max(max_hit_time_, hits_.back().time_ns);
  }
  events_committed_ = events_total;
  if (storage_ == EventStorage::kBlocks) {
    TakeTail(event_blocks_, events_);
    TakeTail(hit_blocks_, hits_);
  }
  hits_committed_ = hits_total;
  events_in_order_ = events_in_order;
  hits_in_order_ = hits_in_order;
  return absl::OkStatus();
}

absl::Status TraceWriter::Finish(const SessionEnd& end) {
  KW_RETURN_IF_ERROR(Check());
  KW_RETURN_IF_ERROR(Commit());
  // From here on, the room kept for a failure helps fold the WAL into the file.
  reserve_.Reset();
  sqlite3* db = db_.get();
  const std::string context = absl::StrCat("finishing ", path_);
  auto fail = [&](const absl::Status& s) {
    sqlite3_exec(db, "ROLLBACK", nullptr, nullptr, nullptr);
    return WriteFailure(s, 0);
  };
  if (const int rc = StepDone(begin_.get()); rc != SQLITE_OK) {
    return fail(SqliteError(db, rc, context));
  }
  // The profile as of the last event.
  if (summary_ != nullptr && (summary_pending_ > 0 || !summary_written_)) {
    if (absl::Status s = WriteSummary(); !s.ok()) {
      return fail(s);
    }
  }
  // Recordings whose batches overlap in time get an index, so that reading in time order
  // needs no sort.
  if (!events_in_order_) {
    if (absl::Status s = SqliteExec(db, "CREATE INDEX events_by_time ON events(time_ns)", context);
        !s.ok()) {
      return fail(s);
    }
  }
  if (!hits_in_order_) {
    if (absl::Status s = SqliteExec(db, "CREATE INDEX hits_by_time ON hits(time_ns)", context);
        !s.ok()) {
      return fail(s);
    }
  }
  {
    auto stmt = SqlitePrepare(db,
                              "UPDATE session SET end_wall_ns=?1, end_mono_ns=?2, exit_status=?3, "
                              "exit_reason=?4, lost_count=?5, complete=1",
                              context);
    if (!stmt.ok()) {
      return fail(stmt.status());
    }
    sqlite3_stmt* s = stmt->get();
    BindU64(s, 1, end.end_wall_ns != 0 ? end.end_wall_ns : WallClockNs());
    BindU64(s, 2, end.end_mono_ns != 0 ? end.end_mono_ns : MonotonicClockNs());
    if (end.exit_status.has_value()) {
      sqlite3_bind_int64(s, 3, *end.exit_status);
    } else {
      sqlite3_bind_null(s, 3);
    }
    BindText(s, 4, end.exit_reason);
    BindU64(s, 5, end.lost_count);
    if (const int rc = StepDone(s); rc != SQLITE_OK) {
      return fail(SqliteError(db, rc, context));
    }
  }
  if (const int rc = StepDone(commit_.get()); rc != SQLITE_OK) {
    return fail(SqliteError(db, rc, context));
  }
  finished_ = true;
  begin_.reset();
  commit_.reset();
  insert_event_.reset();
  insert_events_.reset();
  insert_hit_.reset();
  insert_site_.reset();
  insert_frame_.reset();
  insert_task_.reset();
  update_counts_.reset();
  delete_snapshot_.reset();
  insert_snapshot_.reset();
  upsert_bin_.reset();
  update_summary_.reset();
  event_blocks_ = {};
  hit_blocks_ = {};
  // Complete and committed. Now fold the WAL into the database and leave WAL mode.
  // A failure from here on leaves a complete recording whose last batches are in path-wal.
  auto fold_failed = [&](const absl::Status& s) {
    db_.reset();
    TakeFinalName(/*with_wal=*/true);
    finish_warning_ = absl::StrCat(s.message(),
                                   "; the recording is complete, but its last batches "
                                   "stay in ",
                                   path_, "-wal: keep that file (and ", path_, "-shm) beside it",
                                   finish_warning_.empty() ? "" : "; ", finish_warning_);
    return absl::OkStatus();
  };
  if (absl::Status s = StopCheckpointer(); !s.ok()) {
    return fold_failed(s);
  }
  // The last checkpoint syncs the WAL and the file: a finished recording is on disk.
  if (absl::Status s = SqliteExec(db, "PRAGMA synchronous=NORMAL", context); !s.ok()) {
    return fold_failed(s);
  }
  if (absl::Status s = SqliteExec(db, "PRAGMA wal_checkpoint(TRUNCATE)", context); !s.ok()) {
    return fold_failed(s);
  }
  KW_ASSIGN_OR_RETURN(SqliteStmtPtr mode, SqlitePrepare(db, "PRAGMA journal_mode=DELETE", context));
  const int rc = sqlite3_step(mode.get());
  if (rc != SQLITE_ROW) {
    return fold_failed(SqliteError(db, rc, context));
  }
  const auto* text = reinterpret_cast<const char*>(sqlite3_column_text(mode.get(), 0));
  if (text == nullptr || absl::string_view(text) != "delete") {
    mode.reset();
    return fold_failed(absl::UnavailableError(
        absl::StrCat(context, ": still in WAL mode (another process has it open)")));
  }
  mode.reset();
  sqlite3* raw = db_.release();
  if (const int crc = sqlite3_close(raw); crc != SQLITE_OK) {
    absl::Status s = SqliteError(raw, crc, context);
    sqlite3_close_v2(raw);
    return Fail(s);
  }
  TakeFinalName(/*with_wal=*/false);
  return absl::OkStatus();
}

namespace {

absl::Status Decode(absl::string_view data, uint64_t count, std::vector<AccessEvent>* out) {
  return DecodeEventBlock(data, count, out);
}

absl::Status Decode(absl::string_view data, uint64_t count, std::vector<HitRecord>* out) {
  return DecodeHitBlock(data, count, out);
}

void BindRow(sqlite3_stmt* s, const AccessEvent& e) {
  BindEvent(s, 1, e);
}

void BindRow(sqlite3_stmt* s, const HitRecord& h) {
  BindHit(s, 1, h);
}

// Writes the records of the blocks in `table` as rows by `insert_sql` (rowid: the record's
// number, then its columns), and empties `table`. Returns how many.
template <typename Record>
absl::StatusOr<uint64_t> BlocksToRows(sqlite3* db, const TraceReader& reader, const char* table,
                                      const char* insert_sql, const std::string& context) {
  KW_ASSIGN_OR_RETURN(
      SqliteStmtPtr read,
      SqlitePrepare(
          db, absl::StrCat("SELECT first_index,count,data FROM ", table, " ORDER BY first_index"),
          context));
  KW_ASSIGN_OR_RETURN(SqliteStmtPtr insert, SqlitePrepare(db, insert_sql, context));
  std::vector<Record> records;
  uint64_t n = 0;
  int rc = SQLITE_OK;
  while ((rc = sqlite3_step(read.get())) == SQLITE_ROW) {
    const uint64_t first = FromSqlInt(sqlite3_column_int64(read.get(), 0));
    const uint64_t count = FromSqlInt(sqlite3_column_int64(read.get(), 1));
    const absl::string_view data(static_cast<const char*>(sqlite3_column_blob(read.get(), 2)),
                                 static_cast<size_t>(sqlite3_column_bytes(read.get(), 2)));
    records.clear();
    if (absl::Status s = Decode(data, count, &records); !s.ok()) {
      return absl::DataLossError(
          absl::StrCat("not a kwatch recording or corrupted: ", reader.path(), ": ", s.message()));
    }
    for (size_t i = 0; i < records.size(); ++i) {
      sqlite3_stmt* s = insert.get();
      BindU64(s, 1, first + i);
      BindRow(s, records[i]);
      if (const int irc = StepDone(s); irc != SQLITE_OK) {
        return SqliteError(db, irc, context);
      }
      ++n;
    }
  }
  if (rc != SQLITE_DONE) {
    return SqliteError(db, rc, context);
  }
  read.reset();
  insert.reset();
  KW_RETURN_IF_ERROR(SqliteExec(db, absl::StrCat("DELETE FROM ", table).c_str(), context));
  return n;
}

}  // namespace

absl::StatusOr<uint64_t> ExportEventRows(const TraceReader& reader, const std::string& out) {
  KW_RETURN_IF_ERROR(reader.CopyTo(out));
  sqlite3* raw = nullptr;
  const int rc = sqlite3_open_v2(
      out.c_str(), &raw, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOFOLLOW | SQLITE_OPEN_EXRESCODE,
      nullptr);
  SqlitePtr db(raw);
  const std::string context = absl::StrCat("writing ", out);
  if (rc != SQLITE_OK) {
    return SqliteError(raw, rc, context);
  }
  sqlite3_db_config(raw, SQLITE_DBCONFIG_DEFENSIVE, 1, nullptr);
  KW_ASSIGN_OR_RETURN(const int64_t version, SqliteQueryInt(raw, "PRAGMA user_version", context));
  if (version < 7) {
    return uint64_t{0};  // the events are rows already
  }
  KW_ASSIGN_OR_RETURN(const int64_t event_blocks,
                      SqliteQueryInt(raw, "SELECT event_blocks FROM session", context));
  int64_t hit_blocks = 0;
  if (version >= 8) {
    KW_ASSIGN_OR_RETURN(hit_blocks, SqliteQueryInt(raw, "SELECT hit_blocks FROM session", context));
  }
  if (event_blocks == 0 && hit_blocks == 0) {
    return uint64_t{0};
  }
  KW_RETURN_IF_ERROR(SqliteExec(raw, "PRAGMA journal_mode=MEMORY; BEGIN", context));
  uint64_t n = 0;
  if (event_blocks != 0) {
    KW_ASSIGN_OR_RETURN(
        n, BlocksToRows<AccessEvent>(
               raw, reader, "event_blocks",
               "INSERT INTO events(rowid,time_ns,pid,tid,cpu,watch_id,ip,trap_ip,addr,len,"
               "access_addr,access_size,kind,value,old_value,value_exact) "
               "VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
               context));
    KW_RETURN_IF_ERROR(SqliteExec(raw, "UPDATE session SET event_blocks=0", context));
    KW_ASSIGN_OR_RETURN(const int64_t in_order,
                        SqliteQueryInt(raw, "SELECT events_in_order FROM session", context));
    if (in_order == 0) {
      KW_RETURN_IF_ERROR(
          SqliteExec(raw, "CREATE INDEX IF NOT EXISTS events_by_time ON events(time_ns)", context));
    }
  }
  if (hit_blocks != 0) {
    KW_RETURN_IF_ERROR(BlocksToRows<HitRecord>(raw, reader, "hit_blocks",
                                               "INSERT INTO hits(rowid,time_ns,pid,tid,cpu,"
                                               "probe_id,ip,is_return,args,stack_id) "
                                               "VALUES(?,?,?,?,?,?,?,?,?,?)",
                                               context)
                           .status());
    KW_RETURN_IF_ERROR(SqliteExec(raw, "UPDATE session SET hit_blocks=0", context));
    KW_ASSIGN_OR_RETURN(const int64_t in_order,
                        SqliteQueryInt(raw, "SELECT hits_in_order FROM session", context));
    if (in_order == 0) {
      KW_RETURN_IF_ERROR(
          SqliteExec(raw, "CREATE INDEX IF NOT EXISTS hits_by_time ON hits(time_ns)", context));
    }
  }
  KW_RETURN_IF_ERROR(SqliteExec(raw, "COMMIT; VACUUM", context));
  if (const int crc = sqlite3_close(db.release()); crc != SQLITE_OK) {
    return SqliteError(nullptr, crc, context);
  }
  return n;
}

void TraceWriter::TakeFinalName(bool with_wal) {
  if (replaces_.empty()) {
    return;
  }
  // The old recording's WAL files would be replayed into the new one.
  std::string trouble;
  for (const char* suffix : {"-wal", "-shm", "-journal"}) {
    if (absl::Status s = RemoveIfPresent(replaces_ + suffix); !s.ok()) {
      trouble = absl::StrCat(s.message());
    }
  }
  std::vector<std::pair<std::string, std::string>> moves;
  if (with_wal) {
    for (const char* suffix : {"-wal", "-shm"}) {
      if (::access((path_ + suffix).c_str(), F_OK) == 0) {
        moves.emplace_back(path_ + suffix, replaces_ + suffix);
      }
    }
  }
  moves.emplace_back(path_, replaces_);  // the database last: it names the recording
  if (trouble.empty()) {
    for (const auto& [from, to] : moves) {
      if (::rename(from.c_str(), to.c_str()) != 0) {
        const int err = errno;
        trouble =
            std::string(SyscallError(err, absl::StrCat("rename(", from, ", ", to, ")")).message());
        break;
      }
    }
  }
  if (!trouble.empty()) {
    finish_warning_ = absl::StrCat("the recording is complete in ", path_,
                                   " but could not replace ", replaces_, ": ", trouble);
    return;
  }
  path_ = replaces_;
  replaces_.clear();
}

}  // namespace kwatch::core::store
