#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/store/sqlite_handle.h"

namespace kwatch::core::store {

// Checkpoints a WAL-mode database from a background thread with its own connection, so that
// the writing thread never waits for a checkpoint's page copies and fsyncs.
//
// Attach() makes the writer's connection request a checkpoint after a commit that leaves at
// least `every_pages` pages in the WAL, and again each time the WAL has grown by a quarter of
// that. Checkpoints are PASSIVE: they never block the writer, and the WAL restarts from its
// beginning at the first commit after a checkpoint caught up. A writer that commits faster
// than that keeps the WAL growing; it can watch wal_pages() and restart the WAL itself.
//
// Owns the thread and its connection; Stop() (or the destructor) joins and closes them. Must
// be stopped before the writer's connection leaves WAL mode. error() is thread-safe; the
// other methods are called on the writer's thread.
class WalCheckpointer {
 public:
  static absl::StatusOr<std::unique_ptr<WalCheckpointer>> Start(const std::string& path);
  ~WalCheckpointer();
  WalCheckpointer(const WalCheckpointer&) = delete;
  WalCheckpointer& operator=(const WalCheckpointer&) = delete;

  // Installs the WAL hook on `writer_db`, replacing SQLite's autocheckpoint. Detach with
  // sqlite3_wal_hook(writer_db, nullptr, nullptr) before this object dies.
  void Attach(sqlite3* writer_db, int every_pages);

  // The WAL hook: a commit left `wal_pages` pages in the WAL. Returns at once.
  void Request(int wal_pages);

  // WAL length after the last commit, in pages.
  int wal_pages() const { return wal_pages_; }

  // The first checkpoint failure so far (busy does not count), naming the path.
  absl::Status error() const;

  // Stops and joins the thread and closes its connection; returns error(). Idempotent.
  absl::Status Stop();

  // Checkpoints run so far.
  int checkpoints() const;

 private:
  WalCheckpointer(std::string path, SqlitePtr db) : path_(std::move(path)), db_(std::move(db)) {}
  void Run();

  const std::string path_;
  SqlitePtr db_;  // used only by the thread while it runs
  int every_pages_ = 0;
  int wal_pages_ = 0;           // writer's thread only
  int last_request_pages_ = 0;  // WAL length at the last request (writer's thread only)

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool requested_ = false;  // guarded by mu_
  bool stop_ = false;       // guarded by mu_
  absl::Status error_;      // guarded by mu_
  int checkpoints_ = 0;     // guarded by mu_
  std::thread thread_;
};

}  // namespace kwatch::core::store
