#include "core/store/wal_checkpointer.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/base/syscall_status.h"
#include "core/base/unique_fd.h"

namespace kwatch::core::store {
namespace {

int WalHook(void* arg, sqlite3* /*db*/, const char* /*schema*/, int pages) {
  static_cast<WalCheckpointer*>(arg)->Request(pages);
  return SQLITE_OK;
}

}  // namespace

absl::StatusOr<std::unique_ptr<WalCheckpointer>> WalCheckpointer::Start(const std::string& path,
                                                                        uint64_t durable_every_ns) {
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
  // Checkpoints copy pages without fsync; Durable() syncs on its own schedule.
  if (const int src = sqlite3_exec(raw, "PRAGMA synchronous=OFF", nullptr, nullptr, nullptr);
      src != SQLITE_OK) {
    return SqliteError(raw, src, absl::StrCat("opening ", path, " to checkpoint it"));
  }
  // A connection notices WAL mode only once it has read the database.
  if (const int qrc =
          sqlite3_exec(raw, "SELECT count(*) FROM sqlite_schema", nullptr, nullptr, nullptr);
      qrc != SQLITE_OK) {
    return SqliteError(raw, qrc, absl::StrCat("opening ", path, " to checkpoint it"));
  }
  std::unique_ptr<WalCheckpointer> c(new WalCheckpointer(path, std::move(db), durable_every_ns));
  c->thread_ = std::thread([p = c.get()] { p->Run(); });
  return c;
}

WalCheckpointer::~WalCheckpointer() {
  (void)Stop();
}

void WalCheckpointer::Attach(sqlite3* writer_db, int every_pages) {
  writer_db_ = writer_db;
  every_pages_ = every_pages;
  sqlite3_wal_hook(writer_db, &WalHook, this);
}

void WalCheckpointer::Request(int wal_pages) {
  // Called after every commit: checkpoint when the WAL first reaches every_pages, then again
  // each time it has grown by a quarter of that (a reader may keep it from restarting). A
  // shorter WAL than last time means it restarted.
  wal_pages_ = wal_pages;
  dirty_.store(true, std::memory_order_relaxed);
  if (wal_pages < last_request_pages_) {
    last_request_pages_ = 0;
  }
  if (wal_pages < every_pages_ ||
      (last_request_pages_ != 0 && wal_pages - last_request_pages_ < every_pages_ / 4)) {
    return;
  }
  last_request_pages_ = wal_pages;
  // On the writer's connection (synchronous=OFF): page copies, no fsync. PASSIVE: a reader in
  // the way only leaves frames for the next time.
  const int rc =
      sqlite3_wal_checkpoint_v2(writer_db_, nullptr, SQLITE_CHECKPOINT_PASSIVE, nullptr, nullptr);
  std::lock_guard<std::mutex> lock(mu_);
  ++checkpoints_;
  // Busy or a full disk: the frames stay in the WAL (committed) and the WAL does not restart;
  // on a full disk the next commit fails, and says so.
  if (rc != SQLITE_OK && (rc & 0xff) != SQLITE_BUSY && (rc & 0xff) != SQLITE_FULL && error_.ok()) {
    error_ = SqliteError(writer_db_, rc, absl::StrCat("checkpointing ", path_));
  }
}

absl::Status WalCheckpointer::error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

int WalCheckpointer::checkpoints() const {
  std::lock_guard<std::mutex> lock(mu_);
  return checkpoints_;
}

int WalCheckpointer::durable_points() const {
  std::lock_guard<std::mutex> lock(mu_);
  return durable_points_;
}

absl::Status WalCheckpointer::Durable() {
  const int rc =
      sqlite3_wal_checkpoint_v2(db_.get(), nullptr, SQLITE_CHECKPOINT_PASSIVE, nullptr, nullptr);
  if (rc != SQLITE_OK && (rc & 0xff) != SQLITE_BUSY && (rc & 0xff) != SQLITE_FULL) {
    return SqliteError(db_.get(), rc, absl::StrCat("checkpointing ", path_));
  }
  // The WAL first: what the database holds now came from it.
  for (const std::string& file : {path_ + "-wal", path_}) {
    const UniqueFd fd(::open(file.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
    if (!fd.valid()) {
      const int err = errno;
      if (err == ENOENT) {
        continue;  // no WAL (yet)
      }
      return SyscallError(err, absl::StrCat("open(", file, ") to sync it"));
    }
    if (::fdatasync(fd.get()) != 0) {
      const int err = errno;
      return SyscallError(err, absl::StrCat("fdatasync(", file, ")"));
    }
  }
  return absl::OkStatus();
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
  const auto every = std::chrono::nanoseconds(durable_every_ns_);
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    if (cv_.wait_for(lock, every, [this] { return stop_; })) {
      return;
    }
    if (!dirty_.exchange(false, std::memory_order_relaxed)) {
      continue;  // nothing committed since the last durable point
    }
    lock.unlock();
    absl::Status s = Durable();
    lock.lock();
    ++checkpoints_;
    ++durable_points_;
    if (!s.ok() && error_.ok()) {
      error_ = std::move(s);
    }
  }
}

}  // namespace kwatch::core::store
