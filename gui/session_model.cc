#include "gui/session_model.h"

#include <algorithm>
#include <utility>

#include <QElapsedTimer>
#include <QEventLoop>
#include <QFileInfo>

#include "gui/display_text.h"
#include "watch/profile/duration.h"

namespace kwatch::gui {

SessionModel::SessionModel(QObject* parent) : QObject(parent) {
  follow_timer_.setInterval(1000);
  connect(&loader_, &Loader::Finished, this, &SessionModel::OnFinished);
  connect(&follow_timer_, &QTimer::timeout, this, &SessionModel::OnFollowTick);
}

SessionModel::~SessionModel() = default;

void SessionModel::Open(const QString& path, bool follow) {
  path_ = path;
  error_.clear();
  ++main_generation_;
  ++zoom_generation_;
  zoom_in_flight_ = false;
  view_.reset();
  heatmap_.SetZoom(nullptr);
  SubmitMain(false);
  follow_ = !follow;  // SetFollow reports the change
  SetFollow(follow);
}

void SessionModel::SetFollow(bool on) {
  if (on) {
    follow_timer_.start();
  } else {
    follow_timer_.stop();
  }
  if (on != follow_) {
    follow_ = on;
    Q_EMIT FollowChanged(on);
  }
}

void SessionModel::SetViewRange(std::optional<std::pair<uint64_t, uint64_t>> range,
                                uint32_t columns) {
  if (range.has_value() && range->first >= range->second) {
    range.reset();
  }
  zoom_columns_ = std::max<uint32_t>(columns, 1);
  view_ = range;
  ++zoom_generation_;
  if (!view_.has_value()) {
    zoom_in_flight_ = false;
    if (heatmap_.zoom() != nullptr) {
      heatmap_.SetZoom(nullptr);
    }
    Q_EMIT ZoomLoaded();
    return;
  }
  SubmitZoom();
}

void SessionModel::SubmitZoom() {
  if (!view_.has_value() || !main_) {
    return;  // submitted once the recording has loaded
  }
  LoadRequest req;
  req.path = path_.toStdString();
  req.from_ns = view_->first;
  req.to_ns = view_->second;
  req.tid = sel_.tid;
  req.columns = zoom_columns_;
  req.read_sources = false;
  zoom_in_flight_ = true;
  loader_.Submit(LoadResult::Kind::kZoom, zoom_generation_, std::move(req));
}

bool SessionModel::WaitIdle(int timeout_ms) const {
  QElapsedTimer elapsed;
  elapsed.start();
  QEventLoop loop;
  QTimer tick;
  tick.setInterval(10);
  connect(&tick, &QTimer::timeout, &loop, &QEventLoop::quit);
  tick.start();
  while (main_in_flight_ || detail_in_flight_ || zoom_in_flight_) {
    if (elapsed.elapsed() > timeout_ms) {
      return false;
    }
    loop.exec();
  }
  return true;
}

void SessionModel::SubmitMain(bool follow_reload) {
  LoadRequest req;
  req.path = path_.toStdString();
  if (follow_reload && main_ && main_->request.path == req.path) {
    req.known_events = main_->recorded_events;
    req.known_complete = main_->complete;
    req.base = main_;  // read only what is newer
  }
  main_in_flight_ = true;
  loader_.Submit(LoadResult::Kind::kMain, main_generation_, std::move(req));
  if (!follow_reload) {
    Q_EMIT LoadStarted(path_);
  }
}

void SessionModel::OnFollowTick() {
  if (!main_in_flight_) {
    SubmitMain(true);
  }
}

void SessionModel::OnFinished(const LoadResult& r) {
  if (r.kind == LoadResult::Kind::kZoom) {
    if (r.generation != zoom_generation_) {
      return;  // the view changed since
    }
    zoom_in_flight_ = false;
    if (!r.zoom) {
      error_ = r.error;
      Q_EMIT LoadFailed(error_);
      return;
    }
    heatmap_.SetZoom(r.zoom);
    Q_EMIT ZoomLoaded();
    return;
  }
  if (r.kind == LoadResult::Kind::kDetail) {
    if (r.generation != detail_generation_) {
      return;  // the selection changed since
    }
    detail_in_flight_ = false;
    if (!r.snapshot) {
      error_ = r.error;
      Q_EMIT LoadFailed(error_);
      return;
    }
    detail_ = r.snapshot;
    ApplyDetail();
    Q_EMIT DetailLoaded();
    return;
  }
  if (r.generation != main_generation_) {
    return;  // another file was opened since
  }
  main_in_flight_ = false;
  if (!r.snapshot) {
    if (follow_ && r.code == absl::StatusCode::kNotFound) {
      Q_EMIT FollowStatus(QStringLiteral("Waiting for %1 to appear…").arg(path_));
      return;
    }
    if (follow_) {
      // A file kwatch is still creating may not look like a recording yet: keep polling,
      // and say so once per distinct error.
      if (r.error != error_) {
        error_ = r.error;
        Q_EMIT LoadFailed(error_);
      }
      return;
    }
    error_ = r.error;
    Q_EMIT LoadFailed(error_);
    return;
  }
  const bool reload = main_ && main_->request.path == r.snapshot->request.path;
  if (r.snapshot->unchanged) {
    if (follow_ && main_ && main_->complete) {
      SetFollow(false);
    }
    return;
  }
  error_.clear();
  main_ = r.snapshot;
  const watch::profile::StorageProfile& p = *main_->profile;
  if (!reload || sel_.object >= p.objects().size()) {
    sel_ = Selection{};
  }
  fields_.SetSnapshot(main_);
  heatmap_.SetThread(sel_.tid);
  heatmap_.SetSnapshot(main_);
  heatmap_.SetObject(sel_.object);
  histograms_.SetSnapshot(main_);
  scalar_aggregates_.SetSnapshot(main_);
  if (follow_ && main_->complete) {
    SetFollow(false);
    Q_EMIT FollowStatus(QStringLiteral("The recording is complete."));
  }
  Q_EMIT Loaded();
  UpdateSelectionModels();
  if (view_.has_value()) {
    ++zoom_generation_;
    SubmitZoom();  // the window again, with what is new
  }
}

void SessionModel::UpdateSelectionModels() {
  timeline_.SetData(main_, sel_);
  ++detail_generation_;
  if (!main_) {
    return;
  }
  if (sel_.needs_slice()) {
    LoadRequest req;
    req.path = path_.toStdString();
    req.from_ns = sel_.from_ns;
    req.to_ns = sel_.to_ns;
    req.tid = sel_.tid;
    req.read_sources = false;
    detail_in_flight_ = true;
    loader_.Submit(LoadResult::Kind::kDetail, detail_generation_, std::move(req));
  } else {
    detail_in_flight_ = false;
    detail_ = main_;
    ApplyDetail();
    Q_EMIT DetailLoaded();
  }
  Q_EMIT SelectionChanged();
}

void SessionModel::ApplyDetail() {
  sites_.SetData(detail_, main_, sel_);
  threads_.SetData(detail_, sel_);
  lines_.SetData(detail_, main_, sel_);
}

void SessionModel::SetObject(uint32_t obj) {
  if (!main_ || obj >= main_->profile->objects().size()) {
    return;
  }
  const std::optional<pid_t> tid = sel_.tid;
  sel_ = Selection{};
  sel_.object = obj;
  sel_.tid = tid;
  heatmap_.SetObject(obj);
  UpdateSelectionModels();
}

void SessionModel::SetFieldSelection(std::vector<uint32_t> fields) {
  std::sort(fields.begin(), fields.end());
  fields.erase(std::unique(fields.begin(), fields.end()), fields.end());
  if (main_) {
    const auto [first, last] = main_->profile->FieldRange(sel_.object);
    if (fields.size() == last - first) {
      fields.clear();  // all of them: the whole object (per-event site counts)
    }
  }
  sel_.fields = std::move(fields);
  // Only the field set changed: the current slice still applies.
  timeline_.SetData(main_, sel_);
  if (!detail_in_flight_ && detail_) {
    ApplyDetail();
    Q_EMIT DetailLoaded();
  }
  Q_EMIT SelectionChanged();
}

void SessionModel::SetTimeSelection(std::optional<uint64_t> from_ns,
                                    std::optional<uint64_t> to_ns) {
  if (from_ns == sel_.from_ns && to_ns == sel_.to_ns) {
    return;
  }
  sel_.from_ns = from_ns;
  sel_.to_ns = to_ns;
  UpdateSelectionModels();
}

void SessionModel::ClearSelection() {
  sel_.fields.clear();
  sel_.from_ns.reset();
  sel_.to_ns.reset();
  UpdateSelectionModels();
}

void SessionModel::SetThreadFilter(std::optional<pid_t> tid) {
  if (tid == sel_.tid) {
    return;
  }
  sel_.tid = tid;
  heatmap_.SetThread(tid);
  UpdateSelectionModels();
  if (view_.has_value()) {
    ++zoom_generation_;
    SubmitZoom();
  }
}

void SessionModel::SetMode(AccessMode mode) {
  heatmap_.SetMode(mode);
}

void SessionModel::SetScale(Scale scale) {
  heatmap_.SetScale(scale);
}

std::vector<std::pair<pid_t, uint64_t>> SessionModel::Threads() const {
  std::vector<std::pair<pid_t, uint64_t>> out;
  if (!main_) {
    return out;
  }
  const watch::profile::StorageProfile& p = *main_->profile;
  if (p.objects().empty()) {
    return out;  // no watch: no thread counted
  }
  const auto [first, last] =
      p.FieldRange(std::min<uint32_t>(sel_.object, static_cast<uint32_t>(p.objects().size() - 1)));
  for (uint32_t t = 0; t < p.threads().size(); ++t) {
    uint64_t n = 0;
    for (const auto& [f, c] : p.ThreadFields(t)) {  // only what the thread touched
      if (f >= first && f < last) {
        n += c.total();
      }
    }
    out.emplace_back(p.threads()[t].tid, n);
  }
  return out;
}

QString SessionModel::Summary() const {
  if (!main_) {
    return path_.isEmpty() ? QStringLiteral("No recording open")
                           : QStringLiteral("Loading %1…").arg(path_);
  }
  const watch::profile::StorageProfile& p = *main_->profile;
  QString state;
  if (main_->complete && main_->end.has_value()) {
    state = QStringLiteral("complete: %1").arg(DisplayText(main_->end->exit_reason));
    if (main_->end->exit_status.has_value()) {
      state += QStringLiteral(" (status %1)").arg(*main_->end->exit_status);
    }
    if (main_->end->lost_count > 0) {
      state += QStringLiteral(", %1 events lost").arg(main_->end->lost_count);
    }
  } else {
    state = follow_ ? QStringLiteral("recording…") : QStringLiteral("CUT SHORT");
  }
  return QStringLiteral("%1 — %2 events, %3 threads, %4, backend %5, %6 — loaded in %7 s")
      .arg(QFileInfo(path_).fileName())
      .arg(p.events())
      .arg(p.threads().size())
      .arg(QString::fromStdString(watch::profile::FormatDuration(main_->SpanNs())),
           DisplayText(main_->session.backend), state)
      .arg(main_->load_seconds, 0, 'f', 2);
}

}  // namespace kwatch::gui
