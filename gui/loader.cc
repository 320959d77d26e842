#include "gui/loader.h"

#include <utility>

namespace kwatch::gui {

Loader::Loader(QObject* parent) : QObject(parent), worker_(new QObject) {
  qRegisterMetaType<kwatch::gui::LoadResult>();
  thread_.setObjectName(QStringLiteral("kwatch-gui loader"));
  worker_->moveToThread(&thread_);
  thread_.start();
}

Loader::~Loader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    for (std::optional<Job>& job : pending_) {
      job.reset();
    }
  }
  thread_.quit();
  thread_.wait();
  delete worker_;
}

void Loader::Submit(LoadResult::Kind kind, uint64_t generation, LoadRequest request) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_[static_cast<int>(kind)] = Job{generation, std::move(request)};
  }
  // Qt owns the functor's slot object (invokeMethodImpl deletes it once run).
  // NOLINTNEXTLINE(clang-analyzer-cplusplus.NewDeleteLeaks)
  QMetaObject::invokeMethod(
      worker_, [this] { Drain(); }, Qt::QueuedConnection);
}

void Loader::Drain() {
  for (;;) {
    LoadResult::Kind kind = LoadResult::Kind::kMain;
    Job job;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) {
        return;
      }
      size_t k = 0;
      while (k < pending_.size() && !pending_[k].has_value()) {
        ++k;
      }
      if (k == pending_.size()) {
        return;
      }
      kind = static_cast<LoadResult::Kind>(k);
      job = std::move(*pending_[k]);
      pending_[k].reset();
    }
    LoadResult result;
    result.kind = kind;
    result.generation = job.generation;
    absl::Status status;
    if (kind == LoadResult::Kind::kZoom) {
      absl::StatusOr<ZoomPtr> zoom = LoadZoom(job.request);
      if (zoom.ok()) {
        result.zoom = std::move(*zoom);
      } else {
        status = zoom.status();
      }
    } else {
      absl::StatusOr<SnapshotPtr> snap = LoadSnapshot(job.request);
      if (snap.ok()) {
        result.snapshot = std::move(*snap);
      } else {
        status = snap.status();
      }
    }
    if (!status.ok()) {
      result.code = status.code();
      result.error = QString::fromStdString(std::string{status.message()});
    }
    Q_EMIT Finished(std::move(result));
  }
}

}  // namespace kwatch::gui
