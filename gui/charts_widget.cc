#include "gui/charts_widget.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include <QBarCategoryAxis>
#include <QBarSet>
#include <QHBoxLayout>
#include <QHorizontalStackedBarSeries>
#include <QLineSeries>
#include <QStackedBarSeries>
#include <QValueAxis>

#include "watch/profile/duration.h"

namespace kwatch::gui {

namespace {

const QColor kReadColor(52, 120, 200);
const QColor kWriteColor(222, 84, 44);

QChartView* MakeView(const QString& title, QWidget* parent) {
  auto* chart = new QChart;
  chart->setTitle(title);
  chart->setAnimationOptions(QChart::NoAnimation);
  chart->legend()->setAlignment(Qt::AlignBottom);
  chart->setMargins(QMargins(4, 4, 4, 4));
  auto* view = new QChartView(chart, parent);
  view->setRenderHint(QPainter::Antialiasing);
  view->setMinimumSize(260, 200);
  return view;
}

void ClearChart(QChart* chart) {
  chart->removeAllSeries();
  for (QAbstractAxis* axis : chart->axes()) {
    chart->removeAxis(axis);
    delete axis;
  }
}

QBarSet* MakeSet(const QString& name, const QColor& color) {
  auto* set = new QBarSet(name);
  set->setColor(color);
  set->setBorderColor(color.darker(120));
  return set;
}

// A value axis from 0 to a little above `max`, with integer labels.
QValueAxis* CountAxis(double max, const QString& title) {
  auto* axis = new QValueAxis;
  axis->setRange(0, std::max(1.0, max * 1.05));
  axis->setLabelFormat(QStringLiteral("%d"));
  axis->setTitleText(title);
  axis->applyNiceNumbers();
  return axis;
}

}  // namespace

ChartsWidget::ChartsWidget(QWidget* parent)
    : QWidget(parent),
      timeline_view_(MakeView(tr("Accesses over time (selection)"), this)),
      sites_view_(MakeView(tr("Top accessing sites"), this)),
      threads_view_(MakeView(tr("Per thread"), this)) {
  auto* layout = new QHBoxLayout(this);
  layout->setContentsMargins(0, 0, 0, 0);
  layout->setSpacing(4);
  layout->addWidget(timeline_view_, 4);
  layout->addWidget(sites_view_, 4);
  layout->addWidget(threads_view_, 3);
}

void ChartsWidget::SetModels(TimelineModel* timeline, SiteTableModel* sites, ThreadModel* threads) {
  timeline_ = timeline;
  sites_ = sites;
  threads_ = threads;
  connect(timeline_, &QAbstractItemModel::modelReset, this, &ChartsWidget::RebuildTimeline);
  connect(sites_, &QAbstractItemModel::modelReset, this, &ChartsWidget::RebuildSites);
  connect(threads_, &QAbstractItemModel::modelReset, this, &ChartsWidget::RebuildThreads);
  RebuildTimeline();
  RebuildSites();
  RebuildThreads();
}

void ChartsWidget::RebuildTimeline() {
  QChart* chart = timeline_chart();
  ClearChart(chart);
  chart->setTitle(tr("Accesses over time (selection)"));
  if (timeline_->total_reads() + timeline_->total_writes() == 0) {
    chart->setTitle(tr("Accesses over time: none in the selection"));
    return;
  }
  auto* reads = new QLineSeries;
  reads->setName(tr("reads"));
  reads->setColor(kReadColor);
  auto* writes = new QLineSeries;
  writes->setName(tr("writes"));
  writes->setColor(kWriteColor);
  double max = 0;
  double t_min = 0;
  double t_max = 1e-9;
  const int rows = timeline_->rowCount();
  const double w = static_cast<double>(timeline_->bucket_ns()) / 1e9;
  for (int r = 0; r < rows; ++r) {
    // A step line: each column's count held over its width.
    const double t0 = static_cast<double>(timeline_->StartNs(r)) / 1e9;
    const auto rd = static_cast<double>(timeline_->ReadsAt(r));
    const auto wr = static_cast<double>(timeline_->WritesAt(r));
    reads->append(t0, rd);
    reads->append(t0 + w, rd);
    writes->append(t0, wr);
    writes->append(t0 + w, wr);
    max = std::max({max, rd, wr});
    if (r == 0) {
      t_min = t0;
    }
    t_max = t0 + w;
  }
  chart->addSeries(reads);
  chart->addSeries(writes);
  auto* x = new QValueAxis;
  x->setRange(t_min, std::max(t_max, t_min + 1e-9));
  x->setTitleText(tr("seconds after start"));
  x->setLabelFormat(QStringLiteral("%.3g"));
  x->setTickCount(5);
  x->applyNiceNumbers();
  chart->addAxis(x, Qt::AlignBottom);
  QValueAxis* y = CountAxis(max, tr("per %1").arg(QString::fromStdString(
                                     watch::profile::FormatDuration(timeline_->bucket_ns()))));
  chart->addAxis(y, Qt::AlignLeft);
  for (QLineSeries* s : {reads, writes}) {
    s->attachAxis(x);
    s->attachAxis(y);
  }
}

void ChartsWidget::RebuildSites() {
  QChart* chart = sites_chart();
  ClearChart(chart);
  chart->setTitle(tr("Top accessing sites"));
  if (sites_->rowCount() == 0) {
    chart->setTitle(tr("Top accessing sites: none in the selection"));
    return;
  }
  auto* series = new QHorizontalStackedBarSeries;
  QBarSet* reads = MakeSet(tr("reads"), kReadColor);
  QBarSet* writes = MakeSet(tr("writes"), kWriteColor);
  QStringList categories;
  double max = 0;
  const int n = std::min(sites_->rowCount(), kTopSites);
  // Bars are drawn bottom-up: add the top site last so that it is on top.
  for (int r = n - 1; r >= 0; --r) {
    const double rd =
        sites_->data(sites_->index(r, SiteTableModel::kReads), SiteTableModel::kCountRole)
            .toDouble();
    const double wr =
        sites_->data(sites_->index(r, SiteTableModel::kWrites), SiteTableModel::kCountRole)
            .toDouble();
    *reads << rd;
    *writes << wr;
    // Qt Charts reads axis labels as HTML: a site named "<b>" or "a&lt;b" shows as written.
    categories << sites_->SiteLabel(r).toHtmlEscaped();
    max = std::max(max, rd + wr);
  }
  series->append(reads);
  series->append(writes);
  series->setBarWidth(0.7);
  chart->addSeries(series);
  auto* y = new QBarCategoryAxis;
  y->append(categories);
  chart->addAxis(y, Qt::AlignLeft);
  QValueAxis* x = CountAxis(max, tr("accesses"));
  chart->addAxis(x, Qt::AlignBottom);
  series->attachAxis(y);
  series->attachAxis(x);
}

void ChartsWidget::RebuildThreads() {
  QChart* chart = threads_chart();
  ClearChart(chart);
  chart->setTitle(tr("Per thread"));
  if (threads_->rowCount() == 0) {
    chart->setTitle(tr("Per thread: no accesses in the selection"));
    return;
  }
  auto* series = new QStackedBarSeries;
  QBarSet* reads = MakeSet(tr("reads"), kReadColor);
  QBarSet* writes = MakeSet(tr("writes"), kWriteColor);
  // A bar per thread, for the kTopThreads busiest (in the table's order): a recording of
  // thousands of short-lived threads would make a chart of unreadable slivers, at a cost in
  // graphics items per thread.
  std::vector<int> shown(static_cast<size_t>(threads_->rowCount()));
  std::iota(shown.begin(), shown.end(), 0);
  if (shown.size() > kTopThreads) {
    std::stable_sort(shown.begin(), shown.end(), [this](int a, int b) {
      return threads_->ReadsAt(a) + threads_->WritesAt(a) >
             threads_->ReadsAt(b) + threads_->WritesAt(b);
    });
    shown.resize(kTopThreads);
    std::sort(shown.begin(), shown.end());
    chart->setTitle(
        tr("Per thread: the %1 busiest of %2").arg(kTopThreads).arg(threads_->rowCount()));
  }
  QStringList categories;
  double max = 0;
  for (const int r : shown) {
    const auto rd = static_cast<double>(threads_->ReadsAt(r));
    const auto wr = static_cast<double>(threads_->WritesAt(r));
    *reads << rd;
    *writes << wr;
    categories << QString::number(threads_->TidAt(r));
    max = std::max(max, rd + wr);
  }
  series->append(reads);
  series->append(writes);
  series->setBarWidth(0.6);
  chart->addSeries(series);
  auto* x = new QBarCategoryAxis;
  x->append(categories);
  x->setTitleText(tr("thread id"));
  chart->addAxis(x, Qt::AlignBottom);
  QValueAxis* y = CountAxis(max, tr("accesses"));
  chart->addAxis(y, Qt::AlignLeft);
  series->attachAxis(x);
  series->attachAxis(y);
}

}  // namespace kwatch::gui
