#pragma once

#include <cstdint>
#include <cstring>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

// SQLite's handles, forward-declared so that users of the store need not include sqlite3.h.
struct sqlite3;
struct sqlite3_stmt;

namespace kwatch::core::store {

// Closes a connection (sqlite3_close_v2). Defined out of line.
struct SqliteCloser {
  void operator()(sqlite3* db) const;
};
using SqlitePtr = std::unique_ptr<sqlite3, SqliteCloser>;

// Finalizes a prepared statement. Defined out of line.
struct SqliteStmtFinalizer {
  void operator()(sqlite3_stmt* stmt) const;
};
using SqliteStmtPtr = std::unique_ptr<sqlite3_stmt, SqliteStmtFinalizer>;

// A Status for SQLite result code `rc` on `db`: "<context>: <sqlite message>", plus the errno
// text when SQLite saw a failing system call. SQLITE_FULL → ResourceExhausted, SQLITE_CORRUPT
// and SQLITE_NOTADB → DataLoss, SQLITE_CANTOPEN → NotFound or PermissionDenied (by errno),
// SQLITE_READONLY/PERM → PermissionDenied, SQLITE_BUSY/LOCKED → Unavailable, others Internal.
// `db` may be null (then the generic text for `rc` is used).
absl::Status SqliteError(sqlite3* db, int rc, absl::string_view context);

// Prepares one statement; errors name `context`.
absl::StatusOr<SqliteStmtPtr> SqlitePrepare(sqlite3* db, absl::string_view sql,
                                            absl::string_view context);

// Runs SQL text (one or more statements, no results wanted).
absl::Status SqliteExec(sqlite3* db, const char* sql, absl::string_view context);

// Runs a statement returning one integer (e.g. "PRAGMA user_version").
absl::StatusOr<int64_t> SqliteQueryInt(sqlite3* db, const char* sql, absl::string_view context);

// SQLite integers are signed 64-bit. Addresses and memory values are stored as the same 64
// bits reinterpreted (kernel addresses and large values read back negative in `sqlite3`).
inline int64_t ToSqlInt(uint64_t v) {
  int64_t out = 0;
  std::memcpy(&out, &v, sizeof(out));
  return out;
}
inline uint64_t FromSqlInt(int64_t v) {
  uint64_t out = 0;
  std::memcpy(&out, &v, sizeof(out));
  return out;
}

}  // namespace kwatch::core::store
