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
    pending_[0].reset();
    pending_[1].reset();
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
      if (pending_[0].has_value()) {
        job = std::move(*pending_[0]);
        pending_[0].reset();
      } else if (pending_[1].has_value()) {
        kind = LoadResult::Kind::kDetail;
        job = std::move(*pending_[1]);
        pending_[1].reset();
      } else {
        return;
      }
    }
    LoadResult result;
    result.kind = kind;
    result.generation = job.generation;
    absl::StatusOr<SnapshotPtr> snap = LoadSnapshot(job.request);
    if (snap.ok()) {
      result.snapshot = std::move(*snap);
    } else {
      result.code = snap.status().code();
      result.error = QString::fromStdString(std::string{snap.status().message()});
    }
    Q_EMIT Finished(std::move(result));
  }
}

}  // namespace kwatch::gui
