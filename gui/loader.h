#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <optional>

#include <QMetaType>
#include <QObject>
#include <QString>
#include <QThread>

#include "absl/status/status.h"
#include "gui/snapshot.h"

namespace kwatch::gui {

// What a load produced: a snapshot, or an error for people.
struct LoadResult {
  enum class Kind : uint8_t { kMain = 0, kDetail = 1, kZoom = 2 };
  Kind kind = Kind::kMain;
  uint64_t generation = 0;  // the submitter's tag, returned as given
  SnapshotPtr snapshot;     // kMain, kDetail: null on error
  ZoomPtr zoom;             // kZoom: null on error
  absl::StatusCode code = absl::StatusCode::kOk;
  QString error;  // "" on success
};

// Loads recordings on a worker thread of its own. Submit() queues a job; a job of the same
// kind that has not started yet is replaced (only the newest request matters). Results come
// back through Finished, delivered on the thread that owns the Loader (queued). The
// destructor waits for the job in progress (a load takes at most a few seconds) and drops
// the queued ones.
class Loader : public QObject {
  Q_OBJECT

 public:
  explicit Loader(QObject* parent = nullptr);
  ~Loader() override;
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  void Submit(LoadResult::Kind kind, uint64_t generation, LoadRequest request);

 Q_SIGNALS:
  void Finished(kwatch::gui::LoadResult result);

 private:
  struct Job {
    uint64_t generation = 0;
    LoadRequest request;
  };
  void Drain();  // on the worker thread

  QThread thread_;
  QObject* worker_;  // lives on thread_; deleted after it stops
  std::mutex mu_;
  std::array<std::optional<Job>, 3> pending_;  // by Kind
  bool stopping_ = false;
};

}  // namespace kwatch::gui

Q_DECLARE_METATYPE(kwatch::gui::LoadResult)
