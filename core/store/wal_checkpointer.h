#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/store/sqlite_handle.h"

namespace kwatch::core::store {

// Keeps the WAL of a recording small and makes the recording durable at intervals.
//
// Attach() makes the writer's connection checkpoint (PASSIVE) right after a commit that leaves
// at least `every_pages` pages in the WAL, and again each time it has grown by a quarter of
// that; the WAL then restarts from its beginning at the next commit. The writer runs with
// synchronous=OFF, so such a checkpoint only copies pages within the page cache (no fsync: well
// under a millisecond for a few hundred KiB), and a small WAL is rewritten in place while its
// pages are still dirty: each page reaches the disk about once per writeback, not once per
// commit (write amplification, issue 27). A reader holding an old snapshot keeps the WAL from
// restarting; the writer can watch wal_pages() and restart it itself.
//
// Durability: every `durable_every_ns` (when something was committed since), a background
// thread with its own connection checkpoints and fsyncs the WAL and the database, so that
// what was committed before such a point is on disk. A process killed at any moment loses
// nothing committed (the page cache holds it); an OS crash or power loss can lose what came
// after the last durable point.
//
// Owns the thread and its connection; Stop() (or the destructor) joins and closes them. Must
// be stopped before the writer's connection leaves WAL mode. error() and the counters are
// thread-safe; the other methods are called on the writer's thread.
class WalCheckpointer {
 public:
  static constexpr uint64_t kDefaultDurableEveryNs = 30'000'000'000ULL;  // the kernel's
                                                                         // dirty_expire

  static absl::StatusOr<std::unique_ptr<WalCheckpointer>> Start(
      const std::string& path, uint64_t durable_every_ns = kDefaultDurableEveryNs);
  ~WalCheckpointer();
  WalCheckpointer(const WalCheckpointer&) = delete;
  WalCheckpointer& operator=(const WalCheckpointer&) = delete;

  // Installs the WAL hook on `writer_db` (synchronous=OFF), replacing SQLite's autocheckpoint.
  // Detach with sqlite3_wal_hook(writer_db, nullptr, nullptr) before this object dies.
  void Attach(sqlite3* writer_db, int every_pages);

  // The WAL hook: a commit left `wal_pages` pages in the WAL; checkpoints when it is time.
  void Request(int wal_pages);

  // WAL length after the last commit, in pages.
  int wal_pages() const { return wal_pages_; }

  // The first checkpoint failure so far (busy does not count), naming the path.
  absl::Status error() const;

  // Stops and joins the thread and closes its connection; returns error(). Idempotent.
  absl::Status Stop();

  // Checkpoints run so far (by the writer and at durable points), and durable points.
  int checkpoints() const;
  int durable_points() const;

 private:
  WalCheckpointer(std::string path, SqlitePtr db, uint64_t durable_every_ns)
      : path_(std::move(path)), db_(std::move(db)), durable_every_ns_(durable_every_ns) {}
  void Run();
  // Checkpoints, then fsyncs the WAL and the database (in that order).
  absl::Status Durable();

  const std::string path_;
  SqlitePtr db_;  // used only by the thread while it runs
  const uint64_t durable_every_ns_;
  sqlite3* writer_db_ = nullptr;  // the writer's connection (Attach)
  int every_pages_ = 0;
  int wal_pages_ = 0;           // writer's thread only
  int last_request_pages_ = 0;  // WAL length at the last request (writer's thread only)

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<bool> dirty_{false};  // a commit since the last durable point
  int durable_points_ = 0;          // guarded by mu_
  bool stop_ = false;               // guarded by mu_
  absl::Status error_;              // guarded by mu_
  int checkpoints_ = 0;             // guarded by mu_
  std::thread thread_;
};

}  // namespace kwatch::core::store
