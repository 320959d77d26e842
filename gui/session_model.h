#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <vector>

#include <QObject>
#include <QString>
#include <QTimer>

#include "gui/aggregate_model.h"
#include "gui/cache_line_model.h"
#include "gui/field_tree_model.h"
#include "gui/heatmap_model.h"
#include "gui/loader.h"
#include "gui/selection.h"
#include "gui/site_table_model.h"
#include "gui/snapshot.h"
#include "gui/thread_model.h"
#include "gui/timeline_model.h"

namespace kwatch::gui {

// One open recording and what the user selected in it: loads snapshots off the GUI thread
// (Loader), keeps the selection (object, fields, time range, thread) and the view settings,
// and feeds every item model from them. Widgets only call the setters and show the models.
//
// The whole recording's snapshot ("main") feeds the field tree, the heatmap and the
// timeline; a selection with a time range or a thread gets its own slice of the recording
// ("detail", loaded in the background) for the sites table, the per-thread breakdown and the
// cache lines, which keep showing the previous data until it arrives (DetailLoaded).
// Follow mode polls the file while the recording grows: each poll reads only the events
// committed since the last one and adds them to a copy of the shown profile (an incremental
// snapshot), until the recording is complete (then loads it once whole). A view range
// (SetViewRange: the heatmap zoomed in) loads that window's grid from the recording's finer
// profile_bins (LoadZoom) and shows it in the heatmap, again after each follow update and thread
// change. Lives on the GUI thread.
class SessionModel : public QObject {
  Q_OBJECT

 public:
  explicit SessionModel(QObject* parent = nullptr);
  ~SessionModel() override;
  Q_DISABLE_COPY_MOVE(SessionModel)

  // Starts loading `path` (what was shown stays until it loads). `follow`: poll every
  // follow_interval_ms() while the recording is incomplete; a missing file is waited for and
  // a failed load retried (LoadFailed once per distinct message).
  void Open(const QString& path, bool follow = false);
  // Runs the event loop until no load is in flight (true) or `timeout_ms` passed (false).
  // For headless use (exports, benchmarks); a window never needs it.
  bool WaitIdle(int timeout_ms) const;
  void SetFollowInterval(int ms) { follow_timer_.setInterval(ms); }
  // Follow mode on or off for the open recording (the toolbar's Follow).
  void SetFollow(bool on);
  // The heatmap's visible time range, ns after the session start, [from, to); nullopt: the
  // whole recording at the snapshot's resolution. `columns`: the grid's columns.
  void SetViewRange(std::optional<std::pair<uint64_t, uint64_t>> range, uint32_t columns = 240);
  const std::optional<std::pair<uint64_t, uint64_t>>& view_range() const { return view_; }
  bool zoom_pending() const { return zoom_in_flight_; }
  int follow_interval_ms() const { return follow_timer_.interval(); }

  void SetObject(uint32_t obj);
  // Global field indices (any order); empty: the whole object.
  void SetFieldSelection(std::vector<uint32_t> fields);
  // Nanoseconds after the session start, [from_ns, to_ns); unset: unbounded.
  void SetTimeSelection(std::optional<uint64_t> from_ns, std::optional<uint64_t> to_ns);
  void ClearSelection();  // fields and time range
  void SetThreadFilter(std::optional<pid_t> tid);
  void SetMode(AccessMode mode);
  void SetScale(Scale scale);

  const QString& path() const { return path_; }
  bool following() const { return follow_; }
  bool loading() const { return main_in_flight_; }
  bool detail_pending() const { return detail_in_flight_; }
  const QString& error() const { return error_; }
  const SnapshotPtr& main_snapshot() const { return main_; }
  // The snapshot behind the sites, threads and cache lines (main when no slice is needed).
  const SnapshotPtr& detail_snapshot() const { return detail_; }
  const Selection& selection() const { return sel_; }
  // Threads of the recording (tid, accesses to the current object), in order of appearance.
  std::vector<std::pair<pid_t, uint64_t>> Threads() const;
  // One line for the status bar: file, events, span, complete or cut short, load time.
  QString Summary() const;

  FieldTreeModel* fields() { return &fields_; }
  HeatmapModel* heatmap() { return &heatmap_; }
  TimelineModel* timeline() { return &timeline_; }
  SiteTableModel* sites() { return &sites_; }
  ThreadModel* threads() { return &threads_; }
  CacheLineModel* cache_lines() { return &lines_; }
  // The recording's aggregations (from the main snapshot).
  HistogramListModel* histograms() { return &histograms_; }
  AggregateTableModel* scalar_aggregates() { return &scalar_aggregates_; }

 Q_SIGNALS:
  void LoadStarted(const QString& path);
  // A new main snapshot is shown (every model was reset).
  void Loaded();
  // The load failed; what was shown before stays. The message is for people.
  void LoadFailed(const QString& message);
  // Sites, threads and cache lines now reflect the selection.
  void DetailLoaded();
  void SelectionChanged();
  // Follow mode: waiting for a missing file, or the recording completed.
  void FollowStatus(const QString& message);
  // Follow mode switched on or off (SetFollow, Open, the recording completed).
  void FollowChanged(bool on);
  // The heatmap shows the grid of view_range() (or, after SetViewRange(nullopt), the whole).
  void ZoomLoaded();

 private:
  void OnFinished(const LoadResult& r);
  void OnFollowTick();
  void SubmitMain(bool follow_reload);
  void UpdateSelectionModels();  // timeline now; detail models now or after a slice load
  void ApplyDetail();
  void SubmitZoom();

  Loader loader_;
  QTimer follow_timer_;
  QString path_;
  bool follow_ = false;
  uint64_t main_generation_ = 0;
  uint64_t detail_generation_ = 0;
  bool main_in_flight_ = false;
  bool detail_in_flight_ = false;
  uint64_t zoom_generation_ = 0;
  bool zoom_in_flight_ = false;
  std::optional<std::pair<uint64_t, uint64_t>> view_;
  uint32_t zoom_columns_ = 240;
  QString error_;
  SnapshotPtr main_;
  SnapshotPtr detail_;
  Selection sel_;

  FieldTreeModel fields_;
  HeatmapModel heatmap_;
  TimelineModel timeline_;
  SiteTableModel sites_;
  ThreadModel threads_;
  CacheLineModel lines_;
  HistogramListModel histograms_;
  AggregateTableModel scalar_aggregates_;
};

}  // namespace kwatch::gui
