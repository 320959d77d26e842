#include "core/store/sqlite_handle.h"

#include <sqlite3.h>

#include <cerrno>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"
#include "core/base/syscall_status.h"

namespace kwatch::core::store {

void SqliteCloser::operator()(sqlite3* db) const {
  sqlite3_close_v2(db);
}

void SqliteStmtFinalizer::operator()(sqlite3_stmt* stmt) const {
  sqlite3_finalize(stmt);
}

namespace {

// The failed operation named by an extended SQLITE_IOERR code, "" if none.
const char* IoOperation(int rc) {
  switch (rc) {
    case SQLITE_IOERR_READ:
      return "read";
    case SQLITE_IOERR_SHORT_READ:
      return "short read";
    case SQLITE_IOERR_WRITE:
      return "write";
    case SQLITE_IOERR_FSYNC:
    case SQLITE_IOERR_DIR_FSYNC:
      return "fsync";
    case SQLITE_IOERR_TRUNCATE:
      return "truncate";
    case SQLITE_IOERR_FSTAT:
      return "fstat";
    case SQLITE_IOERR_DELETE:
      return "unlink";
    case SQLITE_IOERR_SHMOPEN:
    case SQLITE_IOERR_SHMSIZE:
    case SQLITE_IOERR_SHMMAP:
      return "shared-memory file";
    case SQLITE_IOERR_LOCK:
    case SQLITE_IOERR_RDLOCK:
    case SQLITE_IOERR_UNLOCK:
      return "lock";
    default:
      return "";
  }
}

}  // namespace

absl::Status SqliteError(sqlite3* db, int rc, absl::string_view context) {
  const int primary = rc & 0xff;
  std::string msg = absl::StrCat(context, ": ");
  // sqlite3_errmsg describes the last failure on `db`; rc may come from elsewhere (e.g. a
  // finished statement), so fall back to the generic text when they disagree.
  if (db != nullptr && (sqlite3_errcode(db) & 0xff) == primary) {
    absl::StrAppend(&msg, sqlite3_errmsg(db));
  } else {
    absl::StrAppend(&msg, sqlite3_errstr(rc));
  }
  const int err = db != nullptr ? sqlite3_system_errno(db) : 0;
  if (primary == SQLITE_IOERR || primary == SQLITE_FULL || primary == SQLITE_CANTOPEN ||
      primary == SQLITE_PERM) {
    std::string detail = IoOperation(rc);
    if (err != 0) {
      absl::StrAppend(&detail, detail.empty() ? "" : ": ", ErrnoText(err));
    } else if (primary == SQLITE_FULL) {
      // SQLite's unix VFS turns a write's ENOSPC into SQLITE_FULL and forgets the errno.
      absl::StrAppend(&detail, detail.empty() ? "" : ": ", "ENOSPC: ", ErrnoText(ENOSPC));
    }
    if (!detail.empty()) {
      absl::StrAppend(&msg, " (", detail, ")");
    }
  }
  absl::StatusCode code = absl::StatusCode::kInternal;
  switch (primary) {
    case SQLITE_FULL:
      code = absl::StatusCode::kResourceExhausted;
      break;
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
      code = absl::StatusCode::kDataLoss;
      break;
    case SQLITE_CANTOPEN:
      code = err == ENOENT ? absl::StatusCode::kNotFound : absl::StatusCode::kPermissionDenied;
      break;
    case SQLITE_READONLY:
    case SQLITE_PERM:
    case SQLITE_AUTH:
      code = absl::StatusCode::kPermissionDenied;
      break;
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      code = absl::StatusCode::kUnavailable;
      break;
    default:
      break;
  }
  return {code, msg};
}

absl::StatusOr<SqliteStmtPtr> SqlitePrepare(sqlite3* db, absl::string_view sql,
                                            absl::string_view context) {
  sqlite3_stmt* raw = nullptr;
  const int rc = sqlite3_prepare_v3(db, sql.data(), static_cast<int>(sql.size()),
                                    SQLITE_PREPARE_PERSISTENT, &raw, nullptr);
  SqliteStmtPtr stmt(raw);
  if (rc != SQLITE_OK) {
    return SqliteError(db, rc, context);
  }
  return stmt;
}

absl::Status SqliteExec(sqlite3* db, const char* sql, absl::string_view context) {
  const int rc = sqlite3_exec(db, sql, nullptr, nullptr, nullptr);
  if (rc != SQLITE_OK) {
    return SqliteError(db, rc, context);
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> SqliteQueryInt(sqlite3* db, const char* sql, absl::string_view context) {
  KW_ASSIGN_OR_RETURN(SqliteStmtPtr stmt, SqlitePrepare(db, sql, context));
  const int rc = sqlite3_step(stmt.get());
  if (rc == SQLITE_DONE) {
    return absl::InternalError(absl::StrCat(context, ": no result row"));
  }
  if (rc != SQLITE_ROW) {
    return SqliteError(db, rc, context);
  }
  return sqlite3_column_int64(stmt.get(), 0);
}

}  // namespace kwatch::core::store
