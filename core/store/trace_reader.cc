#include "core/store/trace_reader.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <queue>
#include <string>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"
#include "core/base/syscall_status.h"
#include "core/base/unique_fd.h"
#include "core/store/args_json.h"
#include "core/store/event_blocks.h"
#include "core/store/hit_blocks.h"
#include "core/store/recording_limits.h"

namespace kwatch::core::store {
namespace {

std::string ColumnText(sqlite3_stmt* s, int i) {
  const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(s, i));
  if (p == nullptr) {
    return {};
  }
  return {p, static_cast<size_t>(sqlite3_column_bytes(s, i))};
}

// "<path>: refused: <what> is <n> <unit>; kwatch reads at most <max> (...)".
absl::Status Refused(const std::string& path, absl::string_view what, uint64_t n,
                     absl::string_view unit, uint64_t max) {
  return absl::ResourceExhaustedError(
      absl::StrCat(path, ": refused: ", what, " is ", n, " ", unit, "; kwatch reads at most ", max,
                   " (a limit against crafted recordings: docs/recording.md, \"Limits\")"));
}

// Where a string of a recording comes from, for an error: "watches.expr of watch 3".
struct TextOrigin {
  const char* column = "";        // "watches.expr"
  const char* row = nullptr;      // "watch", "site", ... (nullptr: the session's one row)
  uint64_t key = 0;               // the row's id (sites: the address)
  size_t max = kMaxRecordedText;  // bytes
};

// Column i as text, refused (ResourceExhausted) beyond origin.max bytes.
absl::StatusOr<std::string> LimitedText(sqlite3_stmt* s, int i, const std::string& path,
                                        const TextOrigin& origin) {
  const auto n = static_cast<size_t>(sqlite3_column_bytes(s, i));
  if (n > origin.max) {
    std::string what = origin.column;
    if (origin.row != nullptr) {
      absl::StrAppend(&what, " of ", origin.row, " ",
                      std::strcmp(origin.row, "site") == 0 ? absl::StrFormat("0x%x", origin.key)
                                                           : absl::StrCat(origin.key));
    }
    return Refused(path, what, n, "bytes", origin.max);
  }
  return ColumnText(s, i);
}

uint64_t ColumnU64(sqlite3_stmt* s, int i) {
  return FromSqlInt(sqlite3_column_int64(s, i));
}

bool IsNull(sqlite3_stmt* s, int i) {
  return sqlite3_column_type(s, i) == SQLITE_NULL;
}

uint32_t ColumnCpu(sqlite3_stmt* s, int i) {
  return IsNull(s, i) ? kUnknownCpu : static_cast<uint32_t>(sqlite3_column_int64(s, i));
}

// Lower time bound as a stored value: times are below 2^63, so unsigned order is signed order.
int64_t FromBound(const std::optional<uint64_t>& from) {
  if (!from.has_value()) {
    return std::numeric_limits<int64_t>::min();
  }
  return static_cast<int64_t>(std::min<uint64_t>(*from, std::numeric_limits<int64_t>::max()));
}
int64_t ToBound(const std::optional<uint64_t>& to) {
  if (!to.has_value()) {
    return std::numeric_limits<int64_t>::max();
  }
  return static_cast<int64_t>(std::min<uint64_t>(*to, std::numeric_limits<int64_t>::max()));
}

// The most rows of the aggregation tables a reader loads (docs/recording.md, "Limits").
struct AggregateLimit {
  const char* table;
  const char* what;
  size_t max;
};
constexpr std::array<AggregateLimit, 3> kAggregateLimits = {{
    {"aggregates", "the number of aggregations", kMaxRecordedAggregates},
    {"aggregate_rows", "the number of aggregation rows", kMaxRecordedAggregateRows},
    {"aggregate_buckets", "the number of histogram buckets", kMaxRecordedAggregateBuckets},
}};

// aggregates.func: what AggregationSpec's functions are named.
constexpr std::array<absl::string_view, 7> kAggregateFuncs = {"count", "sum",  "min",  "max",
                                                              "avg",   "hist", "lhist"};

bool IsCorruption(int rc) {
  const int primary = rc & 0xff;
  return primary == SQLITE_CORRUPT || primary == SQLITE_NOTADB;
}

absl::Status NotARecording(const std::string& path, absl::string_view why) {
  return absl::DataLossError(
      absl::StrCat("not a kwatch recording or corrupted: ", path, ": ", why));
}

uint32_t Be32(const unsigned char* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

// A SQLite file shorter than its header says was truncated (e.g. copied while incomplete).
// SQLite itself would read the missing pages as zeros and report damage only when a query
// reaches them; this names the cause at once. Skipped while a WAL file exists: a writer
// killed in a checkpoint can leave the header ahead of the file, with the pages in the WAL.
absl::Status CheckNotTruncated(const std::string& path, uint64_t size) {
  struct stat wal {};
  if (::stat((path + "-wal").c_str(), &wal) == 0) {
    return absl::OkStatus();
  }
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY));
  if (!fd.valid()) {
    const int err = errno;
    return SyscallError(err, absl::StrCat("open(", path, ")"));
  }
  std::array<unsigned char, 100> h{};
  const ssize_t n = ::pread(fd.get(), h.data(), h.size(), 0);
  static constexpr absl::string_view kMagic("SQLite format 3\0", 16);  // with its NUL
  if (n <= 0 ||
      std::memcmp(h.data(), kMagic.data(), std::min(static_cast<size_t>(n), kMagic.size())) != 0) {
    return absl::OkStatus();  // not SQLite: SQLite's own checks decide
  }
  if (n < static_cast<ssize_t>(h.size())) {
    return NotARecording(path, absl::StrCat("truncated: ", n, " bytes, not even a header"));
  }
  const uint32_t raw_page_size = (uint32_t{h[16]} << 8) | h[17];
  const uint64_t page_size = raw_page_size == 1 ? 65536 : raw_page_size;
  const uint32_t change_counter = Be32(h.data() + 24);
  const uint64_t pages = Be32(h.data() + 28);
  const uint32_t valid_for = Be32(h.data() + 92);
  if (valid_for == change_counter && pages > 0 && size < pages * page_size) {
    return NotARecording(
        path, absl::StrCat("truncated: ", size, " bytes, its header says ", pages * page_size));
  }
  return absl::OkStatus();
}

// A writer killed inside a transaction in rollback-journal mode (kwatch: while Finish switches
// the file out of WAL mode, after the recording is complete) leaves a hot journal, path-journal,
// holding the pages as they were before that transaction. SQLite rolls it back at the next
// open, which needs write access: a read-only reader gets "attempt to write a readonly
// database" instead. So a reader allowed to write the file opens it read-write once, which
// rolls the journal back (the file as it was before the interrupted transaction: a complete
// recording still in WAL mode); one that is not says who can recover it and how.
absl::Status RollBackInterruptedWrite(const std::string& path) {
  const std::string journal = path + "-journal";
  struct stat js {};
  if (::stat(journal.c_str(), &js) != 0 || js.st_size == 0) {
    return absl::OkStatus();  // no journal, or an empty (not hot) one
  }
  if (::access(path.c_str(), W_OK) != 0 || ::access(journal.c_str(), W_OK) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, ": ", journal,
        " holds a write that was interrupted (kwatch killed while finishing the recording); "
        "opening the recording once with write access rolls it back, which this user cannot: "
        "run `kwatch report ",
        path, "` as the file's owner (or `sqlite3 ", path, " 'PRAGMA quick_check'`)"));
  }
  sqlite3* raw = nullptr;
  int rc = sqlite3_open_v2(
      path.c_str(), &raw,
      SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_NOFOLLOW | SQLITE_OPEN_EXRESCODE,
      nullptr);
  SqlitePtr db(raw);
  if (rc == SQLITE_OK) {
    // The first read of the schema takes the shared lock that finds the journal hot and rolls
    // it back.
    rc = sqlite3_exec(raw, "PRAGMA schema_version", nullptr, nullptr, nullptr);
  }
  if (rc != SQLITE_OK) {
    if (IsCorruption(rc)) {
      return NotARecording(path, sqlite3_errmsg(raw));
    }
    return SqliteError(
        raw, rc, absl::StrCat("rolling back the interrupted write in ", journal, " of ", path));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<TraceReader>> TraceReader::Open(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT) {
      return absl::NotFoundError(absl::StrCat(path, ": no such recording"));
    }
    return SyscallError(err, absl::StrCat("stat(", path, ")"));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a kwatch recording: ", path, " (not a regular file)"));
  }
  KW_RETURN_IF_ERROR(RollBackInterruptedWrite(path));
  KW_RETURN_IF_ERROR(CheckNotTruncated(path, static_cast<uint64_t>(st.st_size)));
  sqlite3* raw = nullptr;
  const int rc =
      sqlite3_open_v2(path.c_str(), &raw,
                      SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_EXRESCODE, nullptr);
  SqlitePtr db(raw);
  if (rc != SQLITE_OK) {
    return SqliteError(db.get(), rc, absl::StrCat("opening ", path));
  }
  // The file is untrusted input.
  sqlite3_db_config(raw, SQLITE_DBCONFIG_ENABLE_LOAD_EXTENSION, 0, nullptr);
  sqlite3_db_config(raw, SQLITE_DBCONFIG_DEFENSIVE, 1, nullptr);
  sqlite3_db_config(raw, SQLITE_DBCONFIG_TRUSTED_SCHEMA, 0, nullptr);
  sqlite3_db_config(raw, SQLITE_DBCONFIG_ENABLE_TRIGGER, 0, nullptr);
  sqlite3_db_config(raw, SQLITE_DBCONFIG_ENABLE_VIEW, 0, nullptr);
  sqlite3_db_config(raw, SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 1, nullptr);
  sqlite3_busy_timeout(raw, 2000);
  std::unique_ptr<TraceReader> r(new TraceReader(path, std::move(db)));
  KW_RETURN_IF_ERROR(r->Load());
  return r;
}

absl::Status TraceReader::ReadError(int rc) const {
  if (IsCorruption(rc)) {
    return NotARecording(path_, sqlite3_errmsg(db_.get()));
  }
  if ((rc & 0xff) == SQLITE_TOOBIG) {
    return absl::ResourceExhaustedError(absl::StrCat(
        path_, ": refused: it holds a value of more than ", kMaxRecordedValue,
        " bytes; kwatch reads at most ", kMaxRecordedText, " per name and ",
        kMaxRecordedCommandLine,
        " of command line (a limit against crafted recordings: docs/recording.md, \"Limits\")"));
  }
  return SqliteError(db_.get(), rc, absl::StrCat("reading ", path_));
}

absl::StatusOr<SqliteStmtPtr> TraceReader::Prepare(const std::string& sql) const {
  sqlite3_stmt* raw = nullptr;
  const int rc =
      sqlite3_prepare_v2(db_.get(), sql.c_str(), static_cast<int>(sql.size()), &raw, nullptr);
  SqliteStmtPtr stmt(raw);
  if (rc != SQLITE_OK) {
    return ReadError(rc);
  }
  return stmt;
}

absl::Status TraceReader::Load() {
  sqlite3* db = db_.get();
  // No value larger than the largest a recording may hold is ever loaded into memory: SQLite
  // fails the read (SQLITE_TOOBIG) before allocating it. The per-column limits come after.
  sqlite3_limit(db, SQLITE_LIMIT_LENGTH, static_cast<int>(kMaxRecordedValue));
  if (const int rc = sqlite3_exec(db,
                                  "PRAGMA trusted_schema=OFF; PRAGMA query_only=ON;"
                                  "PRAGMA cell_size_check=ON;",
                                  nullptr, nullptr, nullptr);
      rc != SQLITE_OK) {
    return ReadError(rc);
  }
  // The header first: the first read tells a SQLite file from anything else.
  auto app_id = SqliteQueryInt(db, "PRAGMA application_id", path_);
  if (!app_id.ok()) {
    return NotARecording(path_, sqlite3_errmsg(db));
  }
  if (*app_id != kTraceApplicationId) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "not a kwatch recording: %s (a SQLite database with application_id "
        "0x%08x, not 0x%08x 'kwdb')",
        path_, static_cast<uint32_t>(*app_id), static_cast<uint32_t>(kTraceApplicationId)));
  }
  auto version = SqliteQueryInt(db, "PRAGMA user_version", path_);
  if (!version.ok()) {
    return NotARecording(path_, sqlite3_errmsg(db));
  }
  if (*version > kTraceSchemaVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat(path_, ": recorded by a newer kwatch (schema ", *version,
                     "); this kwatch reads schema <= ", kTraceSchemaVersion));
  }
  if (*version < 1) {
    return NotARecording(path_, absl::StrCat("schema version ", *version));
  }
  schema_ = static_cast<int>(*version);
  for (absl::Status s :
       {LoadSession(), LoadWatches(), LoadSites(), LoadTasks(), LoadProbes(), LoadAggregates()}) {
    if (!s.ok()) {
      // Missing tables or columns, or damage: either way not something we can read.
      if (s.code() == absl::StatusCode::kDataLoss ||
          s.code() == absl::StatusCode::kResourceExhausted) {
        return s;
      }
      return NotARecording(path_, s.message());
    }
  }
  return absl::OkStatus();
}

absl::Status TraceReader::LoadSession() {
  KW_ASSIGN_OR_RETURN(
      SqliteStmtPtr stmt,
      Prepare(absl::StrCat(
          "SELECT command_line,pid,kernel,host,start_wall_ns,start_mono_ns,kwatch_version,"
          "mode,backend,end_wall_ns,end_mono_ns,exit_status,exit_reason,lost_count,complete,",
          schema_ >= 4 ? "ns_pid" : "NULL", ",", schema_ >= 7 ? "event_blocks" : "0", ",",
          schema_ >= 8 ? "hit_blocks" : "0", " FROM session")));
  sqlite3_stmt* s = stmt.get();
  const int rc = sqlite3_step(s);
  if (rc == SQLITE_DONE) {
    return NotARecording(path_, "no session record");
  }
  if (rc != SQLITE_ROW) {
    return ReadError(rc);
  }
  KW_ASSIGN_OR_RETURN(
      session_.command_line,
      LimitedText(s, 0, path_, {"session.command_line", nullptr, 0, kMaxRecordedCommandLine}));
  session_.pid = static_cast<pid_t>(sqlite3_column_int64(s, 1));
  KW_ASSIGN_OR_RETURN(session_.kernel, LimitedText(s, 2, path_, {"session.kernel"}));
  KW_ASSIGN_OR_RETURN(session_.host, LimitedText(s, 3, path_, {"session.host"}));
  session_.start_wall_ns = ColumnU64(s, 4);
  session_.start_mono_ns = ColumnU64(s, 5);
  KW_ASSIGN_OR_RETURN(session_.kwatch_version,
                      LimitedText(s, 6, path_, {"session.kwatch_version"}));
  KW_ASSIGN_OR_RETURN(session_.mode, LimitedText(s, 7, path_, {"session.mode"}));
  KW_ASSIGN_OR_RETURN(session_.backend, LimitedText(s, 8, path_, {"session.backend"}));
  complete_ = sqlite3_column_int64(s, 14) != 0;
  session_.ns_pid = static_cast<pid_t>(sqlite3_column_int64(s, 15));  // NULL: 0
  event_blocks_ = sqlite3_column_int64(s, 16) != 0;
  hit_blocks_ = sqlite3_column_int64(s, 17) != 0;
  if (complete_) {
    SessionEnd end;
    end.end_wall_ns = ColumnU64(s, 9);
    end.end_mono_ns = ColumnU64(s, 10);
    if (!IsNull(s, 11)) {
      end.exit_status = static_cast<int>(sqlite3_column_int64(s, 11));
    }
    KW_ASSIGN_OR_RETURN(end.exit_reason, LimitedText(s, 12, path_, {"session.exit_reason"}));
    end.lost_count = ColumnU64(s, 13);
    end_ = std::move(end);
  } else if (!IsNull(s, 12)) {
    KW_ASSIGN_OR_RETURN(cut_reason_, LimitedText(s, 12, path_, {"session.exit_reason"}));
  }
  return absl::OkStatus();
}

absl::Status TraceReader::LoadWatches() {
  KW_ASSIGN_OR_RETURN(SqliteStmtPtr ws,
                      Prepare("SELECT id,expr,address,length,kind,backend,coverage,type_name "
                              "FROM watches ORDER BY id"));
  absl::flat_hash_map<int64_t, size_t> by_id;
  int rc = SQLITE_OK;
  while ((rc = sqlite3_step(ws.get())) == SQLITE_ROW) {
    sqlite3_stmt* s = ws.get();
    const int64_t id = sqlite3_column_int64(s, 0);
    if (id < 0 || id >= kMaxRecordedWatches) {
      return absl::ResourceExhaustedError(
          absl::StrCat(path_, ": refused: a watch has id ", id, "; kwatch numbers watches 0 to ",
                       kMaxRecordedWatches - 1,
                       " (a limit against crafted recordings: docs/recording.md, \"Limits\")"));
    }
    const auto key = static_cast<uint64_t>(id);
    WatchRecord w;
    w.id = static_cast<uint32_t>(id);
    KW_ASSIGN_OR_RETURN(w.expr, LimitedText(s, 1, path_, {"watches.expr", "watch", key}));
    w.address = RemoteAddr{ColumnU64(s, 2)};
    w.length = ColumnU64(s, 3);
    KW_ASSIGN_OR_RETURN(w.kind, LimitedText(s, 4, path_, {"watches.kind", "watch", key}));
    KW_ASSIGN_OR_RETURN(w.backend, LimitedText(s, 5, path_, {"watches.backend", "watch", key}));
    KW_ASSIGN_OR_RETURN(w.coverage, LimitedText(s, 6, path_, {"watches.coverage", "watch", key}));
    KW_ASSIGN_OR_RETURN(w.type_name, LimitedText(s, 7, path_, {"watches.type_name", "watch", key}));
    by_id[id] = watches_.size();
    watches_.push_back(std::move(w));
  }
  if (rc != SQLITE_DONE) {
    return ReadError(rc);
  }
  // Schema 2 and older have no union flag: their unions' members count apart, as then.
  KW_ASSIGN_OR_RETURN(
      SqliteStmtPtr fs,
      Prepare(absl::StrCat("SELECT watch_id,path,type_name,offset,size,bit_offset,"
                           "bit_size,depth,is_leaf,",
                           schema_ >= 3 ? "is_union" : "0", " FROM fields ORDER BY watch_id,idx")));
  size_t fields = 0;
  uint64_t name_bytes = 0;  // of the leaves' report names: expression + path
  while ((rc = sqlite3_step(fs.get())) == SQLITE_ROW) {
    sqlite3_stmt* s = fs.get();
    auto it = by_id.find(sqlite3_column_int64(s, 0));
    if (it == by_id.end()) {
      return NotARecording(path_, "a field of a watch that does not exist");
    }
    if (++fields > kMaxRecordedFields) {
      return absl::ResourceExhaustedError(
          absl::StrCat(path_, ": refused: its watches have more than ", kMaxRecordedFields,
                       " fields, the most kwatch reads (a limit against crafted recordings: "
                       "docs/recording.md, \"Limits\")"));
    }
    WatchRecord& w = watches_[it->second];
    symbols::FieldLayout f;
    KW_ASSIGN_OR_RETURN(f.path, LimitedText(s, 1, path_, {"fields.path", "watch", w.id}));
    KW_ASSIGN_OR_RETURN(f.type_name, LimitedText(s, 2, path_, {"fields.type_name", "watch", w.id}));
    f.offset = ColumnU64(s, 3);
    f.size = ColumnU64(s, 4);
    f.bit_offset = static_cast<uint32_t>(sqlite3_column_int64(s, 5));
    f.bit_size = static_cast<uint32_t>(sqlite3_column_int64(s, 6));
    f.depth = static_cast<int>(sqlite3_column_int64(s, 7));
    f.is_leaf = sqlite3_column_int64(s, 8) != 0;
    f.is_union = sqlite3_column_int64(s, 9) != 0;
    if (f.is_leaf) {
      name_bytes += w.expr.size() + f.path.size();
      if (name_bytes > kMaxRecordedFieldNames) {
        return absl::ResourceExhaustedError(absl::StrCat(
            path_, ": refused: the names of its fields (expression + path) take more than ",
            kMaxRecordedFieldNames,
            " bytes, the most kwatch reads (a limit against crafted recordings: "
            "docs/recording.md, \"Limits\")"));
      }
    }
    w.fields.push_back(std::move(f));
  }
  return rc == SQLITE_DONE ? absl::OkStatus() : ReadError(rc);
}

absl::Status TraceReader::LoadSites() {
  KW_ASSIGN_OR_RETURN(SqliteStmtPtr stmt,
                      Prepare(absl::StrCat("SELECT ip,function,offset,file,line,disassembly,",
                                           schema_ >= 3 ? "inlined" : "''", " FROM sites")));
  int rc = SQLITE_OK;
  while ((rc = sqlite3_step(stmt.get())) == SQLITE_ROW) {
    sqlite3_stmt* s = stmt.get();
    SiteRecord site;
    site.ip = RemoteAddr{ColumnU64(s, 0)};
    const uint64_t ip = site.ip.value;
    KW_ASSIGN_OR_RETURN(site.function, LimitedText(s, 1, path_, {"sites.function", "site", ip}));
    site.offset = ColumnU64(s, 2);
    KW_ASSIGN_OR_RETURN(site.file, LimitedText(s, 3, path_, {"sites.file", "site", ip}));
    site.line = static_cast<int>(sqlite3_column_int64(s, 4));
    KW_ASSIGN_OR_RETURN(site.disassembly,
                        LimitedText(s, 5, path_, {"sites.disassembly", "site", ip}));
    KW_ASSIGN_OR_RETURN(site.inlined, LimitedText(s, 6, path_, {"sites.inlined", "site", ip}));
    sites_.push_back(std::move(site));
  }
  if (rc != SQLITE_DONE) {
    return ReadError(rc);
  }
  std::sort(sites_.begin(), sites_.end(),
            [](const SiteRecord& a, const SiteRecord& b) { return a.ip < b.ip; });
  return absl::OkStatus();
}

absl::Status TraceReader::LoadTasks() {
  // Recordings made before kernel sessions were recorded have no tasks table.
  KW_ASSIGN_OR_RETURN(SqliteStmtPtr exists,
                      Prepare("SELECT 1 FROM sqlite_master WHERE type='table' AND name='tasks'"));
  const int first = sqlite3_step(exists.get());
  if (first == SQLITE_DONE) {
    return absl::OkStatus();
  }
  if (first != SQLITE_ROW) {
    return ReadError(first);
  }
  KW_ASSIGN_OR_RETURN(SqliteStmtPtr stmt, Prepare("SELECT pid,tid,comm FROM tasks ORDER BY tid"));
  int rc = SQLITE_OK;
  while ((rc = sqlite3_step(stmt.get())) == SQLITE_ROW) {
    sqlite3_stmt* s = stmt.get();
    TaskRecord t;
    t.pid = static_cast<pid_t>(sqlite3_column_int64(s, 0));
    t.tid = static_cast<pid_t>(sqlite3_column_int64(s, 1));
    KW_ASSIGN_OR_RETURN(
        t.comm, LimitedText(s, 2, path_, {"tasks.comm", "task", static_cast<uint64_t>(t.tid)}));
    tasks_.push_back(std::move(t));
  }
  if (rc != SQLITE_DONE) {
    return ReadError(rc);
  }
  return absl::OkStatus();
}

absl::Status TraceReader::LoadProbes() {
  KW_ASSIGN_OR_RETURN(
      SqliteStmtPtr stmt,
      Prepare("SELECT id,event,spec,address,function,file,line,is_return FROM probes ORDER BY id"));
  int rc = SQLITE_OK;
  while ((rc = sqlite3_step(stmt.get())) == SQLITE_ROW) {
    sqlite3_stmt* s = stmt.get();
    ProbeRecord p;
    p.id = static_cast<uint32_t>(sqlite3_column_int64(s, 0));
    KW_ASSIGN_OR_RETURN(p.event, LimitedText(s, 1, path_, {"probes.event", "probe", p.id}));
    KW_ASSIGN_OR_RETURN(p.spec, LimitedText(s, 2, path_, {"probes.spec", "probe", p.id}));
    p.address = RemoteAddr{ColumnU64(s, 3)};
    KW_ASSIGN_OR_RETURN(p.function, LimitedText(s, 4, path_, {"probes.function", "probe", p.id}));
    KW_ASSIGN_OR_RETURN(p.file, LimitedText(s, 5, path_, {"probes.file", "probe", p.id}));
    p.line = static_cast<int>(sqlite3_column_int64(s, 6));
    p.is_return = sqlite3_column_int64(s, 7) != 0;
    probes_.push_back(std::move(p));
  }
  return rc == SQLITE_DONE ? absl::OkStatus() : ReadError(rc);
}

absl::StatusOr<std::vector<StackRecord>> TraceReader::Stacks() const {
  std::vector<StackRecord> stacks;
  if (schema_ < 6) {
    return stacks;  // no stacks were recorded before schema 6
  }
  KW_ASSIGN_OR_RETURN(SqliteStmtPtr count, Prepare("SELECT count(*) FROM stack_frames"));
  if (const int rc = sqlite3_step(count.get()); rc != SQLITE_ROW) {
    return ReadError(rc);
  }
  if (const uint64_t n = ColumnU64(count.get(), 0); n > kMaxRecordedStackFrames) {
    return Refused(path_, "the number of stack frames", n, "rows", kMaxRecordedStackFrames);
  }
  KW_ASSIGN_OR_RETURN(SqliteStmtPtr stmt,
                      Prepare("SELECT stack_id,idx,ip,function,offset,file,line FROM stack_frames "
                              "ORDER BY stack_id, idx"));
  int rc = SQLITE_OK;
  while ((rc = sqlite3_step(stmt.get())) == SQLITE_ROW) {
    sqlite3_stmt* s = stmt.get();
    const uint64_t id = ColumnU64(s, 0);
    const uint64_t idx = ColumnU64(s, 1);
    if (id == 0 || id > 0xffffffffULL) {
      return NotARecording(path_, absl::StrCat("a stack frame names stack ", id));
    }
    if (stacks.empty() || stacks.back().id != id) {
      stacks.push_back(StackRecord{static_cast<uint32_t>(id), {}});
    }
    StackRecord& stack = stacks.back();
    if (idx != stack.frames.size()) {
      return NotARecording(path_, absl::StrCat("stack ", id, " lacks frame ", stack.frames.size()));
    }
    StackFrameRecord f;
    f.ip = RemoteAddr{ColumnU64(s, 2)};
    KW_ASSIGN_OR_RETURN(f.function,
                        LimitedText(s, 3, path_, {"stack_frames.function", "stack", id}));
    f.offset = ColumnU64(s, 4);
    KW_ASSIGN_OR_RETURN(f.file, LimitedText(s, 5, path_, {"stack_frames.file", "stack", id}));
    f.line = static_cast<int>(sqlite3_column_int64(s, 6));
    stack.frames.push_back(std::move(f));
  }
  if (rc != SQLITE_DONE) {
    return ReadError(rc);
  }
  return stacks;
}

absl::Status TraceReader::LoadAggregates() {
  if (schema_ < 5) {
    return absl::OkStatus();  // no aggregations were recorded before schema 5
  }
  // Counted before anything is loaded.
  for (const AggregateLimit& limit : kAggregateLimits) {
    KW_ASSIGN_OR_RETURN(SqliteStmtPtr count,
                        Prepare(absl::StrCat("SELECT count(*) FROM ", limit.table)));
    if (const int rc = sqlite3_step(count.get()); rc != SQLITE_ROW) {
      return ReadError(rc);
    }
    const uint64_t n = ColumnU64(count.get(), 0);
    if (n > limit.max) {
      return Refused(path_, limit.what, n, "rows", limit.max);
    }
  }
  KW_ASSIGN_OR_RETURN(
      SqliteStmtPtr stmt,
      Prepare("SELECT id,probe_id,event,agg,func,no_value FROM aggregates ORDER BY id"));
  absl::flat_hash_map<int64_t, size_t> by_id;
  int rc = SQLITE_OK;
  while ((rc = sqlite3_step(stmt.get())) == SQLITE_ROW) {
    sqlite3_stmt* s = stmt.get();
    const int64_t id = sqlite3_column_int64(s, 0);
    const auto key = static_cast<uint64_t>(id);
    AggregateRecord a;
    a.probe_id = static_cast<uint32_t>(sqlite3_column_int64(s, 1));
    KW_ASSIGN_OR_RETURN(a.event,
                        LimitedText(s, 2, path_, {"aggregates.event", "aggregation", key}));
    KW_ASSIGN_OR_RETURN(a.agg, LimitedText(s, 3, path_, {"aggregates.agg", "aggregation", key}));
    KW_ASSIGN_OR_RETURN(a.func, LimitedText(s, 4, path_, {"aggregates.func", "aggregation", key}));
    if (std::find(kAggregateFuncs.begin(), kAggregateFuncs.end(), a.func) ==
        kAggregateFuncs.end()) {
      return NotARecording(path_, absl::StrCat("aggregation ", id, " has an unknown function"));
    }
    a.no_value = ColumnU64(s, 5);
    by_id[id] = aggregates_.size();
    aggregates_.push_back(std::move(a));
  }
  if (rc != SQLITE_DONE) {
    return ReadError(rc);
  }
  KW_RETURN_IF_ERROR(LoadAggregateRows(by_id));
  return LoadAggregateBuckets(by_id);
}

absl::Status TraceReader::LoadAggregateRows(const absl::flat_hash_map<int64_t, size_t>& by_id) {
  KW_ASSIGN_OR_RETURN(SqliteStmtPtr stmt,
                      Prepare("SELECT aggregate_id,idx,key,value,count FROM aggregate_rows "
                              "ORDER BY aggregate_id,idx"));
  size_t key_bytes = 0;
  int rc = SQLITE_OK;
  while ((rc = sqlite3_step(stmt.get())) == SQLITE_ROW) {
    sqlite3_stmt* s = stmt.get();
    const int64_t id = sqlite3_column_int64(s, 0);
    const auto it = by_id.find(id);
    if (it == by_id.end()) {
      continue;  // a row of no aggregation
    }
    AggregateRecord& a = aggregates_[it->second];
    if (sqlite3_column_int64(s, 1) != static_cast<int64_t>(a.rows.size())) {
      return NotARecording(path_, absl::StrCat("the rows of aggregation ", id,
                                               " are not numbered "
                                               "0, 1, 2, ..."));
    }
    const auto n = static_cast<size_t>(sqlite3_column_bytes(s, 2));
    if (n > kMaxRecordedAggregateKey) {
      return Refused(path_, absl::StrCat("the key of a row of aggregation ", id), n, "bytes",
                     kMaxRecordedAggregateKey);
    }
    key_bytes += n;
    if (key_bytes > kMaxRecordedAggregateKeys) {
      return Refused(path_, "the keys of all aggregation rows", key_bytes, "bytes",
                     kMaxRecordedAggregateKeys);
    }
    AggregateRowRecord row;
    const std::string key = ColumnText(s, 2);
    auto parsed = DecodeArgsJson(key);
    if (!parsed.ok()) {
      return NotARecording(path_,
                           absl::StrCat("aggregation ", id, ": ", parsed.status().message()));
    }
    row.key = *std::move(parsed);
    if (!a.histogram()) {
      // A number as kwatch printed it, whatever the file holds: what the report prints unquoted
      // in JSON must be one.
      switch (sqlite3_column_type(s, 3)) {
        case SQLITE_INTEGER:
          row.value = absl::StrCat(sqlite3_column_int64(s, 3));
          break;
        case SQLITE_FLOAT:
          if (const double d = sqlite3_column_double(s, 3); std::isfinite(d)) {
            row.value = absl::StrFormat("%.6g", d);
          }
          break;
        case SQLITE_TEXT: {
          const std::string text = ColumnText(s, 3);
          uint64_t u = 0;
          if (!text.empty() && text.size() <= 20 && absl::SimpleAtoi(text, &u) &&
              std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; })) {
            row.value = text;
          }
          break;
        }
        default:
          break;
      }
      if (row.value.empty()) {
        return NotARecording(path_, absl::StrCat("a row of aggregation ", id, " has no number"));
      }
    }
    row.count = ColumnU64(s, 4);
    a.rows.push_back(std::move(row));
  }
  return rc == SQLITE_DONE ? absl::OkStatus() : ReadError(rc);
}

absl::Status TraceReader::LoadAggregateBuckets(const absl::flat_hash_map<int64_t, size_t>& by_id) {
  KW_ASSIGN_OR_RETURN(SqliteStmtPtr stmt,
                      Prepare("SELECT aggregate_id,row_idx,idx,low,high,count FROM "
                              "aggregate_buckets ORDER BY aggregate_id,row_idx,idx"));
  int rc = SQLITE_OK;
  while ((rc = sqlite3_step(stmt.get())) == SQLITE_ROW) {
    sqlite3_stmt* s = stmt.get();
    const int64_t id = sqlite3_column_int64(s, 0);
    const auto it = by_id.find(id);
    if (it == by_id.end() || !aggregates_[it->second].histogram()) {
      continue;  // a bucket of no histogram
    }
    AggregateRecord& a = aggregates_[it->second];
    const int64_t r = sqlite3_column_int64(s, 1);
    if (r < 0 || static_cast<uint64_t>(r) >= a.rows.size()) {
      continue;  // of no row
    }
    AggregateRowRecord& row = a.rows[static_cast<size_t>(r)];
    if (sqlite3_column_int64(s, 2) != static_cast<int64_t>(row.buckets.size())) {
      return NotARecording(
          path_, absl::StrCat("the buckets of aggregation ", id, " are not numbered 0, 1, 2, ..."));
    }
    AggregateBucketRecord b;
    if (!IsNull(s, 3)) {
      b.low = sqlite3_column_int64(s, 3);
    }
    if (!IsNull(s, 4)) {
      b.high = sqlite3_column_int64(s, 4);
    }
    b.count = ColumnU64(s, 5);
    row.buckets.push_back(b);
  }
  return rc == SQLITE_DONE ? absl::OkStatus() : ReadError(rc);
}

const SiteRecord* TraceReader::FindSite(RemoteAddr ip) const {
  auto it = std::lower_bound(sites_.begin(), sites_.end(), ip,
                             [](const SiteRecord& s, RemoteAddr a) { return s.ip < a; });
  return it != sites_.end() && it->ip == ip ? &*it : nullptr;
}

absl::StatusOr<bool> TraceReader::InOrder(const char* column) const {
  KW_ASSIGN_OR_RETURN(SqliteStmtPtr stmt,
                      Prepare(absl::StrCat("SELECT ", column, " FROM session")));
  const int rc = sqlite3_step(stmt.get());
  if (rc == SQLITE_DONE) {
    return NotARecording(path_, "no session record");
  }
  if (rc != SQLITE_ROW) {
    return ReadError(rc);
  }
  return sqlite3_column_int64(stmt.get(), 0) != 0;
}

absl::StatusOr<int64_t> TraceReader::FirstRowidAtLeast(const char* table, const char* expr,
                                                       uint64_t value) const {
  KW_ASSIGN_OR_RETURN(SqliteStmtPtr min_stmt,
                      Prepare(absl::StrCat("SELECT min(rowid) FROM ", table)));
  KW_ASSIGN_OR_RETURN(SqliteStmtPtr max_stmt,
                      Prepare(absl::StrCat("SELECT max(rowid) FROM ", table)));
  KW_ASSIGN_OR_RETURN(SqliteStmtPtr probe,
                      Prepare(absl::StrCat("SELECT rowid,", expr, " FROM ", table,
                                           " WHERE rowid >= ?1 ORDER BY rowid LIMIT 1")));
  int rc = sqlite3_step(min_stmt.get());
  if (rc != SQLITE_ROW) {
    return ReadError(rc);
  }
  if (IsNull(min_stmt.get(), 0)) {
    return 0;  // empty
  }
  rc = sqlite3_step(max_stmt.get());
  if (rc != SQLITE_ROW) {
    return ReadError(rc);
  }
  int64_t lo = sqlite3_column_int64(min_stmt.get(), 0);
  int64_t hi = sqlite3_column_int64(max_stmt.get(), 0);
  const int64_t from = FromBound(value);
  // Invariant: rows below lo have expr below value; the answer is in [lo, hi + 1].
  if (hi == std::numeric_limits<int64_t>::max()) {
    return lo;  // cannot form hi + 1; scan from the start
  }
  ++hi;
  while (lo < hi) {
    // hi - lo in unsigned: rowids of a damaged file may span more than INT64_MAX.
    const int64_t mid =
        lo + static_cast<int64_t>((static_cast<uint64_t>(hi) - static_cast<uint64_t>(lo)) / 2);
    sqlite3_reset(probe.get());
    sqlite3_bind_int64(probe.get(), 1, mid);
    rc = sqlite3_step(probe.get());
    if (rc == SQLITE_DONE) {
      hi = mid;
      continue;
    }
    if (rc != SQLITE_ROW) {
      return ReadError(rc);
    }
    const int64_t rowid = sqlite3_column_int64(probe.get(), 0);
    if (sqlite3_column_int64(probe.get(), 1) < from) {
      lo = rowid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

namespace {

absl::Status DecodeBlock(absl::string_view data, uint64_t count, std::vector<AccessEvent>* out) {
  return DecodeEventBlock(data, count, out);
}

absl::Status DecodeBlock(absl::string_view data, uint64_t count, std::vector<HitRecord>* out) {
  return DecodeHitBlock(data, count, out);
}

}  // namespace

template <typename Record, typename Wanted, typename Fn>
absl::Status TraceReader::ForEachInBlocks(const char* table, const BlockBounds& b, bool in_order,
                                          Wanted wanted, Fn fn) const {
  const int64_t from = FromBound(b.from_ns);
  const int64_t to = ToBound(b.to_ns);
  const uint64_t first_index = b.first_index.value_or(0);
  const uint64_t last_index = b.last_index.value_or(UINT64_MAX);
  std::vector<Record> records;
  auto decode = [&](sqlite3_stmt* s, int col, uint64_t count) -> absl::Status {
    records.clear();
    const void* p = sqlite3_column_blob(s, col);
    const absl::string_view data(static_cast<const char*>(p),
                                 static_cast<size_t>(sqlite3_column_bytes(s, col)));
    if (absl::Status st = DecodeBlock(data, count, &records); !st.ok()) {
      return NotARecording(path_, st.message());
    }
    return absl::OkStatus();
  };
  // Whether record `r`, number `index`, is wanted.
  auto in_bounds = [&](const Record& r, uint64_t index) {
    const auto t = static_cast<int64_t>(r.time_ns);
    return t >= from && t <= to && index >= first_index && index <= last_index && wanted(r);
  };
  if (in_order) {
    // Block order is time order: start at the first block that reaches both lower bounds.
    int64_t start = std::numeric_limits<int64_t>::min();
    if (b.from_ns.has_value()) {
      KW_ASSIGN_OR_RETURN(start, FirstRowidAtLeast(table, "last_ns", *b.from_ns));
    }
    if (b.first_index.has_value()) {
      KW_ASSIGN_OR_RETURN(const int64_t by_index,
                          FirstRowidAtLeast(table, "first_index+count-1", first_index));
      start = std::max(start, by_index);
    }
    KW_ASSIGN_OR_RETURN(SqliteStmtPtr stmt,
                        Prepare(absl::StrCat("SELECT first_index,count,first_ns,data FROM ", table,
                                             " WHERE id >= ?1 ORDER BY id")));
    sqlite3_stmt* s = stmt.get();
    sqlite3_bind_int64(s, 1, start);
    int rc = SQLITE_OK;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
      const uint64_t index = ColumnU64(s, 0);
      if (sqlite3_column_int64(s, 2) > to || index > last_index) {
        return absl::OkStatus();
      }
      KW_RETURN_IF_ERROR(decode(s, 3, ColumnU64(s, 1)));
      for (size_t i = 0; i < records.size(); ++i) {
        const Record& r = records[i];
        if (static_cast<int64_t>(r.time_ns) > to || index + i > last_index) {
          return absl::OkStatus();
        }
        if (in_bounds(r, index + i) && !fn(r)) {
          return absl::OkStatus();
        }
      }
    }
    return rc == SQLITE_DONE ? absl::OkStatus() : ReadError(rc);
  }
  // Blocks that overlap in time: merged, in time order, ties in recording order.
  struct Meta {
    int64_t id;
    uint64_t first_index;
    uint64_t count;
    int64_t first_ns;
    int64_t last_ns;
  };
  std::vector<Meta> metas;
  {
    KW_ASSIGN_OR_RETURN(SqliteStmtPtr stmt,
                        Prepare(absl::StrCat("SELECT id,first_index,count,first_ns,last_ns FROM ",
                                             table, " ORDER BY first_ns, id")));
    int rc = SQLITE_OK;
    while ((rc = sqlite3_step(stmt.get())) == SQLITE_ROW) {
      sqlite3_stmt* s = stmt.get();
      metas.push_back(Meta{sqlite3_column_int64(s, 0), ColumnU64(s, 1), ColumnU64(s, 2),
                           sqlite3_column_int64(s, 3), sqlite3_column_int64(s, 4)});
    }
    if (rc != SQLITE_DONE) {
      return ReadError(rc);
    }
  }
  KW_ASSIGN_OR_RETURN(SqliteStmtPtr load,
                      Prepare(absl::StrCat("SELECT data FROM ", table, " WHERE id = ?1")));
  struct Open {
    std::vector<Record> records;
    uint64_t first_index = 0;
    size_t pos = 0;
  };
  std::vector<Open> open;
  // (time, index, slot in open): the next record of each open block; smallest first.
  using Next = std::tuple<int64_t, uint64_t, size_t>;
  std::priority_queue<Next, std::vector<Next>, std::greater<>> heap;
  std::vector<size_t> free_slots;
  size_t next = 0;
  for (;;) {
    while (next < metas.size() &&
           (heap.empty() || metas[next].first_ns <= std::get<0>(heap.top()))) {
      const Meta& m = metas[next++];
      if (m.first_ns > to) {
        next = metas.size();  // sorted by first_ns: none later starts in range
        break;
      }
      if (m.last_ns < from || m.first_index > last_index ||
          m.first_index + m.count <= first_index) {
        continue;
      }
      sqlite3_reset(load.get());
      sqlite3_bind_int64(load.get(), 1, m.id);
      if (const int rc = sqlite3_step(load.get()); rc != SQLITE_ROW) {
        return rc == SQLITE_DONE
                   ? NotARecording(path_, absl::StrCat("a block of ", table, " vanished"))
                   : ReadError(rc);
      }
      KW_RETURN_IF_ERROR(decode(load.get(), 0, m.count));
      size_t slot = 0;
      if (free_slots.empty()) {
        slot = open.size();
        open.emplace_back();
      } else {
        slot = free_slots.back();
        free_slots.pop_back();
      }
      open[slot] = Open{std::move(records), m.first_index, 0};
      records = {};
      heap.emplace(static_cast<int64_t>(open[slot].records[0].time_ns), m.first_index, slot);
    }
    if (heap.empty()) {
      return absl::OkStatus();
    }
    const auto [t, index, slot] = heap.top();
    heap.pop();
    if (t > to) {
      return absl::OkStatus();
    }
    Open& o = open[slot];
    if (in_bounds(o.records[o.pos], index) && !fn(o.records[o.pos])) {
      return absl::OkStatus();
    }
    if (++o.pos < o.records.size()) {
      heap.emplace(static_cast<int64_t>(o.records[o.pos].time_ns), o.first_index + o.pos, slot);
    } else {
      o.records = {};
      free_slots.push_back(slot);
    }
  }
}

absl::Status TraceReader::ForEachEvent(const EventFilter& filter,
                                       absl::FunctionRef<bool(const AccessEvent&)> fn) const {
  KW_ASSIGN_OR_RETURN(const bool in_order, InOrder("events_in_order"));
  if (event_blocks_) {
    const BlockBounds bounds{filter.from_ns, filter.to_ns, filter.first_index, filter.last_index};
    return ForEachInBlocks<AccessEvent>(
        "event_blocks", bounds, in_order,
        [&filter](const AccessEvent& e) {
          return (!filter.tid.has_value() || e.tid == *filter.tid) &&
                 (!filter.watch_id.has_value() || e.watch_id == *filter.watch_id);
        },
        fn);
  }
  std::string sql =
      "SELECT time_ns,pid,tid,cpu,watch_id,ip,trap_ip,addr,len,access_addr,access_size,kind,"
      "value,old_value,value_exact FROM events ";
  int64_t start = std::numeric_limits<int64_t>::min();
  const int64_t first_index =
      filter.first_index.has_value()
          ? static_cast<int64_t>(std::min<uint64_t>(*filter.first_index, INT64_MAX))
          : std::numeric_limits<int64_t>::min();
  const int64_t last_index =
      filter.last_index.has_value()
          ? static_cast<int64_t>(std::min<uint64_t>(*filter.last_index, INT64_MAX))
          : std::numeric_limits<int64_t>::max();
  if (in_order) {
    // Rowid order is time order: start at the first row in range, no sort and no index.
    if (filter.from_ns.has_value()) {
      KW_ASSIGN_OR_RETURN(start, FirstRowidAtOrAfter("events", *filter.from_ns));
    }
    start = std::max(start, first_index);
    sql += "WHERE rowid >= ?1 AND rowid <= ?2 ORDER BY rowid";
  } else {
    // Uses events_by_time when Finish created it; else SQLite sorts (in temporary files).
    start = FromBound(filter.from_ns);
    sql += "WHERE time_ns >= ?1 AND rowid <= ?2 AND rowid >= ?3 ORDER BY time_ns, rowid";
  }
  KW_ASSIGN_OR_RETURN(SqliteStmtPtr stmt, Prepare(sql));
  sqlite3_stmt* s = stmt.get();
  sqlite3_bind_int64(s, 1, start);
  sqlite3_bind_int64(s, 2, last_index);
  if (!in_order) {
    sqlite3_bind_int64(s, 3, first_index);
  }
  const int64_t to = ToBound(filter.to_ns);
  AccessEvent e;
  int rc = SQLITE_OK;
  while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
    const int64_t t = sqlite3_column_int64(s, 0);
    if (t > to) {
      return absl::OkStatus();  // time order: nothing later matches
    }
    e.tid = static_cast<pid_t>(sqlite3_column_int64(s, 2));
    e.watch_id = static_cast<uint32_t>(sqlite3_column_int64(s, 4));
    if ((filter.tid.has_value() && e.tid != *filter.tid) ||
        (filter.watch_id.has_value() && e.watch_id != *filter.watch_id)) {
      continue;
    }
    e.time_ns = FromSqlInt(t);
    e.pid = static_cast<pid_t>(sqlite3_column_int64(s, 1));
    e.cpu = ColumnCpu(s, 3);
    e.ip = RemoteAddr{ColumnU64(s, 5)};
    e.trap_ip = IsNull(s, 6) ? e.ip : RemoteAddr{ColumnU64(s, 6)};
    e.addr = RemoteAddr{ColumnU64(s, 7)};
    e.len = static_cast<uint32_t>(sqlite3_column_int64(s, 8));
    e.access_addr = RemoteAddr{ColumnU64(s, 9)};
    e.access_size = static_cast<uint32_t>(sqlite3_column_int64(s, 10));
    const auto* kind = sqlite3_column_text(s, 11);
    switch (kind != nullptr ? kind[0] : 0) {
      case 'r':
        e.kind = AccessKind::kRead;
        break;
      case 'w':
        e.kind = AccessKind::kWrite;
        break;
      case 'x':
        e.kind = AccessKind::kExec;
        break;
      default:
        return NotARecording(path_, "an event of unknown kind");
    }
    e.value = IsNull(s, 12) ? std::nullopt : std::optional<uint64_t>(ColumnU64(s, 12));
    e.old_value = IsNull(s, 13) ? std::nullopt : std::optional<uint64_t>(ColumnU64(s, 13));
    e.value_exact = sqlite3_column_int64(s, 14) != 0;
    if (!fn(e)) {
      return absl::OkStatus();
    }
  }
  return rc == SQLITE_DONE ? absl::OkStatus() : ReadError(rc);
}

TraceReader::ReadSnapshot::~ReadSnapshot() {
  if (r_ != nullptr) {
    sqlite3_exec(r_->db_.get(), "COMMIT", nullptr, nullptr, nullptr);
  }
}

absl::Status TraceReader::CopyTo(const std::string& out) const {
  UniqueFd fd(::open(out.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!fd.valid()) {
    const int err = errno;
    return SyscallError(err, absl::StrCat("open(", out, ", O_CREAT|O_EXCL)"));
  }
  fd.Reset();
  sqlite3* raw = nullptr;
  int rc = sqlite3_open_v2(out.c_str(), &raw,
                           SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOFOLLOW | SQLITE_OPEN_EXRESCODE,
                           nullptr);
  SqlitePtr dest(raw);
  if (rc != SQLITE_OK) {
    return SqliteError(raw, rc, absl::StrCat("opening ", out));
  }
  sqlite3_backup* b = sqlite3_backup_init(raw, "main", db_.get(), "main");
  if (b == nullptr) {
    return SqliteError(raw, sqlite3_errcode(raw), absl::StrCat("copying ", path_, " to ", out));
  }
  rc = sqlite3_backup_step(b, -1);
  sqlite3_backup_finish(b);
  if (rc != SQLITE_DONE) {
    return SqliteError(raw, rc, absl::StrCat("copying ", path_, " to ", out));
  }
  return absl::OkStatus();
}

absl::StatusOr<TraceReader::ReadSnapshot> TraceReader::HoldSnapshot() const {
  if (const int rc = sqlite3_exec(db_.get(), "BEGIN", nullptr, nullptr, nullptr); rc != SQLITE_OK) {
    return ReadError(rc);
  }
  // The transaction's snapshot is taken at its first read.
  if (const int rc =
          sqlite3_exec(db_.get(), "SELECT count(*) FROM session", nullptr, nullptr, nullptr);
      rc != SQLITE_OK) {
    sqlite3_exec(db_.get(), "COMMIT", nullptr, nullptr, nullptr);
    return ReadError(rc);
  }
  return ReadSnapshot(this);
}

absl::StatusOr<uint64_t> TraceReader::BinnedEvents() const {
  if (schema_ < 7) {
    return 0;
  }
  KW_ASSIGN_OR_RETURN(SqliteStmtPtr head, Prepare("SELECT summary_events FROM session"));
  const int rc = sqlite3_step(head.get());
  if (rc == SQLITE_DONE) {
    return NotARecording(path_, "no session record");
  }
  if (rc != SQLITE_ROW) {
    return ReadError(rc);
  }
  return IsNull(head.get(), 0) ? 0 : ColumnU64(head.get(), 0);
}

absl::StatusOr<std::optional<StoredProfileSummary>> TraceReader::ProfileSummary() const {
  if (schema_ < 7) {
    return std::nullopt;
  }
  KW_ASSIGN_OR_RETURN(SqliteStmtPtr head,
                      Prepare("SELECT summary_events, events_in_order FROM session"));
  int rc = sqlite3_step(head.get());
  if (rc == SQLITE_DONE) {
    return NotARecording(path_, "no session record");
  }
  if (rc != SQLITE_ROW) {
    return ReadError(rc);
  }
  if (IsNull(head.get(), 0) || sqlite3_column_int64(head.get(), 1) == 0) {
    return std::nullopt;
  }
  StoredProfileSummary out;
  out.events = ColumnU64(head.get(), 0);
  KW_ASSIGN_OR_RETURN(SqliteStmtPtr size,
                      Prepare("SELECT count(*), ifnull(sum(length(data)), 0) FROM "
                              "profile_snapshot"));
  if (rc = sqlite3_step(size.get()); rc != SQLITE_ROW) {
    return ReadError(rc);
  }
  const uint64_t bytes = ColumnU64(size.get(), 1);
  if (bytes > kMaxRecordedSnapshot) {
    return Refused(path_, "the profile snapshot (profile_snapshot)", bytes, "bytes",
                   kMaxRecordedSnapshot);
  }
  out.snapshot.reserve(bytes);
  KW_ASSIGN_OR_RETURN(SqliteStmtPtr chunks,
                      Prepare("SELECT idx, data FROM profile_snapshot ORDER BY idx"));
  int64_t expect = 0;
  while ((rc = sqlite3_step(chunks.get())) == SQLITE_ROW) {
    if (sqlite3_column_int64(chunks.get(), 0) != expect++) {
      return NotARecording(path_, "the chunks of profile_snapshot are not numbered 0, 1, 2, ...");
    }
    const void* p = sqlite3_column_blob(chunks.get(), 1);
    const auto n = static_cast<size_t>(sqlite3_column_bytes(chunks.get(), 1));
    if (out.snapshot.size() + n > bytes) {
      return NotARecording(path_, "profile_snapshot changed while read");
    }
    out.snapshot.append(static_cast<const char*>(p), n);
  }
  if (rc != SQLITE_DONE) {
    return ReadError(rc);
  }
  return out;
}

absl::Status TraceReader::ForEachProfileBin(
    uint32_t level, int64_t bin_lo, int64_t bin_hi,
    absl::FunctionRef<void(const ProfileBinCell&)> fn) const {
  KW_ASSIGN_OR_RETURN(SqliteStmtPtr stmt,
                      Prepare("SELECT bin, tid, field, reads, writes FROM profile_bins WHERE "
                              "level = ?1 AND bin >= ?2 AND bin < ?3"));
  sqlite3_stmt* s = stmt.get();
  sqlite3_bind_int64(s, 1, level);
  sqlite3_bind_int64(s, 2, bin_lo);
  sqlite3_bind_int64(s, 3, bin_hi);
  ProfileBinCell c;
  c.level = level;
  int rc = SQLITE_OK;
  while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
    c.bin = sqlite3_column_int64(s, 0);
    c.tid = static_cast<pid_t>(sqlite3_column_int64(s, 1));
    const int64_t field = sqlite3_column_int64(s, 2);
    if (field < 0 || field > INT32_MAX) {
      return NotARecording(path_, absl::StrCat("profile_bins names field ", field));
    }
    c.field = static_cast<uint32_t>(field);
    c.reads = ColumnU64(s, 3);
    c.writes = ColumnU64(s, 4);
    fn(c);
  }
  return rc == SQLITE_DONE ? absl::OkStatus() : ReadError(rc);
}

absl::Status TraceReader::ForEachHit(const HitFilter& filter,
                                     absl::FunctionRef<bool(const HitRecord&)> fn) const {
  KW_ASSIGN_OR_RETURN(const bool in_order, InOrder("hits_in_order"));
  if (hit_blocks_) {
    const BlockBounds bounds{filter.from_ns, filter.to_ns, std::nullopt, std::nullopt};
    return ForEachInBlocks<HitRecord>(
        "hit_blocks", bounds, in_order,
        [&filter](const HitRecord& h) {
          return (!filter.tid.has_value() || h.tid == *filter.tid) &&
                 (!filter.probe_id.has_value() || h.probe_id == *filter.probe_id);
        },
        fn);
  }
  // Schema 1 had no pid per hit: read as 0.
  std::string sql =
      absl::StrCat("SELECT time_ns,tid,cpu,probe_id,ip,is_return,args,", schema_ >= 2 ? "pid" : "0",
                   ",", schema_ >= 6 ? "ifnull(stack_id, 0)" : "0", " FROM hits ");
  int64_t start = std::numeric_limits<int64_t>::min();
  if (in_order) {
    if (filter.from_ns.has_value()) {
      KW_ASSIGN_OR_RETURN(start, FirstRowidAtOrAfter("hits", *filter.from_ns));
    }
    sql += "WHERE rowid >= ?1 ORDER BY rowid";
  } else {
    start = FromBound(filter.from_ns);
    sql += "WHERE time_ns >= ?1 ORDER BY time_ns, rowid";
  }
  KW_ASSIGN_OR_RETURN(SqliteStmtPtr stmt, Prepare(sql));
  sqlite3_stmt* s = stmt.get();
  sqlite3_bind_int64(s, 1, start);
  const int64_t to = ToBound(filter.to_ns);
  HitRecord h;
  int rc = SQLITE_OK;
  while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
    const int64_t t = sqlite3_column_int64(s, 0);
    if (t > to) {
      return absl::OkStatus();
    }
    h.tid = static_cast<pid_t>(sqlite3_column_int64(s, 1));
    h.probe_id = static_cast<uint32_t>(sqlite3_column_int64(s, 3));
    if ((filter.tid.has_value() && h.tid != *filter.tid) ||
        (filter.probe_id.has_value() && h.probe_id != *filter.probe_id)) {
      continue;
    }
    h.time_ns = FromSqlInt(t);
    h.cpu = ColumnCpu(s, 2);
    h.ip = RemoteAddr{ColumnU64(s, 4)};
    h.is_return = sqlite3_column_int64(s, 5) != 0;
    h.pid = static_cast<pid_t>(sqlite3_column_int64(s, 7));
    h.stack_id = static_cast<uint32_t>(sqlite3_column_int64(s, 8));
    if (const auto n = static_cast<size_t>(sqlite3_column_bytes(s, 6)); n > kMaxRecordedArgs) {
      return Refused(path_, absl::StrFormat("the arguments (hits.args) of a hit at %d ns", t), n,
                     "bytes", kMaxRecordedArgs);
    }
    const auto* args = reinterpret_cast<const char*>(sqlite3_column_text(s, 6));
    auto parsed = DecodeArgsJson(
        args == nullptr ? absl::string_view("{}")
                        : absl::string_view(args, static_cast<size_t>(sqlite3_column_bytes(s, 6))));
    if (!parsed.ok()) {
      return NotARecording(path_, parsed.status().message());
    }
    h.args = *std::move(parsed);
    if (!fn(h)) {
      return absl::OkStatus();
    }
  }
  return rc == SQLITE_DONE ? absl::OkStatus() : ReadError(rc);
}

absl::StatusOr<uint64_t> TraceReader::CountRows(absl::string_view table,
                                                absl::string_view id_column,
                                                const std::optional<uint64_t>& from_ns,
                                                const std::optional<uint64_t>& to_ns,
                                                const std::optional<pid_t>& tid,
                                                const std::optional<uint32_t>& id) const {
  std::string sql = absl::StrCat("SELECT count(*) FROM ", table);
  const bool filtered = from_ns || to_ns || tid || id;
  if (filtered) {
    absl::StrAppend(&sql,
                    " WHERE time_ns BETWEEN ?1 AND ?2 AND (?3 IS NULL OR tid = ?3) AND "
                    "(?4 IS NULL OR ",
                    id_column, " = ?4)");
  }
  KW_ASSIGN_OR_RETURN(SqliteStmtPtr stmt, Prepare(sql));
  sqlite3_stmt* s = stmt.get();
  if (filtered) {
    sqlite3_bind_int64(s, 1, FromBound(from_ns));
    sqlite3_bind_int64(s, 2, ToBound(to_ns));
    if (tid) {
      sqlite3_bind_int64(s, 3, *tid);
    }
    if (id) {
      sqlite3_bind_int64(s, 4, *id);
    }
  }
  const int rc = sqlite3_step(s);
  if (rc != SQLITE_ROW) {
    return ReadError(rc);
  }
  return static_cast<uint64_t>(sqlite3_column_int64(s, 0));
}

absl::StatusOr<uint64_t> TraceReader::SumOfCounts(const char* table) const {
  KW_ASSIGN_OR_RETURN(SqliteStmtPtr stmt,
                      Prepare(absl::StrCat("SELECT ifnull(sum(count), 0) FROM ", table)));
  const int rc = sqlite3_step(stmt.get());
  if (rc != SQLITE_ROW) {
    return ReadError(rc);
  }
  return ColumnU64(stmt.get(), 0);
}

absl::StatusOr<uint64_t> TraceReader::CountEvents(const EventFilter& filter) const {
  if (event_blocks_) {
    if (!filter.from_ns && !filter.to_ns && !filter.tid && !filter.watch_id &&
        !filter.first_index && !filter.last_index) {
      return SumOfCounts("event_blocks");
    }
    uint64_t n = 0;
    KW_RETURN_IF_ERROR(ForEachEvent(filter, [&](const AccessEvent&) {
      ++n;
      return true;
    }));
    return n;
  }
  return CountRows("events", "watch_id", filter.from_ns, filter.to_ns, filter.tid, filter.watch_id);
}

absl::StatusOr<uint64_t> TraceReader::CountHits(const HitFilter& filter) const {
  if (hit_blocks_) {
    if (!filter.from_ns && !filter.to_ns && !filter.tid && !filter.probe_id) {
      return SumOfCounts("hit_blocks");
    }
    uint64_t n = 0;
    KW_RETURN_IF_ERROR(ForEachHit(filter, [&](const HitRecord&) {
      ++n;
      return true;
    }));
    return n;
  }
  return CountRows("hits", "probe_id", filter.from_ns, filter.to_ns, filter.tid, filter.probe_id);
}

}  // namespace kwatch::core::store
