#include "core/store/wal_checkpointer.h"

#include <sqlite3.h>

#include <utility>

#include "absl/strings/str_cat.h"

namespace kwatch::core::store {
namespace {

int WalHook(void* arg, sqlite3* /*db*/, const char* /*schema*/, int pages) {
  static_cast<WalCheckpointer*>(arg)->Request(pages);
  return SQLITE_OK;
}

}  // namespace

absl::StatusOr<std::unique_ptr<WalCheckpointer>> WalCheckpointer::Start(const std::string& path) {
  sqlite3* raw = nullptr;
  const int rc = sqlite3_open_v2(
      path.c_str(), &raw,
      SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_NOFOLLOW | SQLITE_OPEN_EXRESCODE,
      nullptr);
  SqlitePtr db(raw);
  if (rc != SQLITE_OK) {
    return SqliteError(db.get(), rc, absl::StrCat("opening ", path, " to checkpoint it"));
  }
  sqlite3_db_config(raw, SQLITE_DBCONFIG_ENABLE_LOAD_EXTENSION, 0, nullptr);
  sqlite3_db_config(raw, SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 1, nullptr);
  sqlite3_busy_timeout(raw, 1000);
  // A connection notices WAL mode only once it has read the database.
  if (const int qrc =
          sqlite3_exec(raw, "SELECT count(*) FROM sqlite_schema", nullptr, nullptr, nullptr);
      qrc != SQLITE_OK) {
    return SqliteError(raw, qrc, absl::StrCat("opening ", path, " to checkpoint it"));
  }
  std::unique_ptr<WalCheckpointer> c(new WalCheckpointer(path, std::move(db)));
  c->thread_ = std::thread([p = c.get()] { p->Run(); });
  return c;
}

WalCheckpointer::~WalCheckpointer() {
  (void)Stop();
}

void WalCheckpointer::Attach(sqlite3* writer_db, int every_pages) {
  every_pages_ = every_pages;
  sqlite3_wal_hook(writer_db, &WalHook, this);
}

void WalCheckpointer::Request(int wal_pages) {
  // Called after every commit: ask when the WAL first reaches every_pages, then again each
  // time it has grown by a quarter of that (a checkpoint per commit would cost two fsyncs
  // per batch). A shorter WAL than last time means it restarted.
  wal_pages_ = wal_pages;
  if (wal_pages < last_request_pages_) {
    last_request_pages_ = 0;
  }
  if (wal_pages < every_pages_ ||
      (last_request_pages_ != 0 && wal_pages - last_request_pages_ < every_pages_ / 4)) {
    return;
  }
  last_request_pages_ = wal_pages;
  {
    std::lock_guard<std::mutex> lock(mu_);
    requested_ = true;
  }
  cv_.notify_one();
}

absl::Status WalCheckpointer::error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

int WalCheckpointer::checkpoints() const {
  std::lock_guard<std::mutex> lock(mu_);
  return checkpoints_;
}

absl::Status WalCheckpointer::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) {
    thread_.join();
  }
  db_.reset();
  return error();
}

void WalCheckpointer::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [this] { return stop_ || requested_; });
    if (stop_) {
      return;
    }
    requested_ = false;
    lock.unlock();
    // PASSIVE: never blocks the writer, and copies only what no reader still needs.
    const int rc =
        sqlite3_wal_checkpoint_v2(db_.get(), nullptr, SQLITE_CHECKPOINT_PASSIVE, nullptr, nullptr);
    absl::Status s;
    if (rc != SQLITE_OK && (rc & 0xff) != SQLITE_BUSY) {
      s = SqliteError(db_.get(), rc, absl::StrCat("checkpointing ", path_));
    }
    lock.lock();
    ++checkpoints_;
    if (!s.ok() && error_.ok()) {
      error_ = std::move(s);
    }
  }
}

}  // namespace kwatch::core::store
