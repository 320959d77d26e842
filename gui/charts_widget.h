#pragma once

#include <cstddef>

#include <QChart>
#include <QChartView>
#include <QWidget>

#include "gui/site_table_model.h"
#include "gui/thread_model.h"
#include "gui/timeline_model.h"

namespace kwatch::gui {

// Three Qt Charts side by side, redrawn whenever their model resets: accesses over time for
// the selection (reads and writes), the top accessing sites (stacked bars), and the
// per-thread breakdown (the kTopThreads busiest threads). An empty selection leaves a chart
// without axes and says so in its title. Holds no data of its own.
class ChartsWidget : public QWidget {
  Q_OBJECT

 public:
  static constexpr int kTopSites = 8;
  static constexpr size_t kTopThreads = 32;

  explicit ChartsWidget(QWidget* parent = nullptr);

  void SetModels(TimelineModel* timeline, SiteTableModel* sites, ThreadModel* threads);

  QChart* timeline_chart() const { return timeline_view_->chart(); }
  QChart* sites_chart() const { return sites_view_->chart(); }
  QChart* threads_chart() const { return threads_view_->chart(); }

 private:
  void RebuildTimeline();
  void RebuildSites();
  void RebuildThreads();

  TimelineModel* timeline_ = nullptr;
  SiteTableModel* sites_ = nullptr;
  ThreadModel* threads_ = nullptr;
  QChartView* timeline_view_;
  QChartView* sites_view_;
  QChartView* threads_view_;
};

}  // namespace kwatch::gui
