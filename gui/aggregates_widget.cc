#include "gui/aggregates_widget.h"

#include <algorithm>

#include <QBarCategoryAxis>
#include <QBarSeries>
#include <QBarSet>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QSplitter>
#include <QVBoxLayout>
#include <QValueAxis>

namespace kwatch::gui {

namespace {

const QColor kBarColor(52, 120, 200);

void ClearChart(QChart* chart) {
  chart->removeAllSeries();
  for (QAbstractAxis* axis : chart->axes()) {
    chart->removeAxis(axis);
    delete axis;
  }
}

}  // namespace

AggregatesWidget::AggregatesWidget(QWidget* parent)
    : QWidget(parent),
      combo_(new QComboBox(this)),
      combo_label_(new QLabel(tr("Histogram "), this)),
      chart_view_(new QChartView(new QChart, this)),
      table_(new QTableView(this)) {
  combo_->setSizeAdjustPolicy(QComboBox::AdjustToContents);
  combo_->setMinimumContentsLength(24);
  combo_label_->setTextFormat(Qt::PlainText);
  QChart* chart = chart_view_->chart();
  chart->setAnimationOptions(QChart::NoAnimation);
  chart->legend()->hide();
  chart->setMargins(QMargins(4, 4, 4, 4));
  chart_view_->setRenderHint(QPainter::Antialiasing);
  chart_view_->setMinimumSize(320, 200);

  table_->setSelectionBehavior(QAbstractItemView::SelectRows);
  table_->setSelectionMode(QAbstractItemView::SingleSelection);
  table_->verticalHeader()->hide();
  table_->verticalHeader()->setDefaultSectionSize(22);
  table_->horizontalHeader()->setStretchLastSection(true);
  table_->setAlternatingRowColors(true);
  table_->setWordWrap(false);

  auto* left = new QWidget(this);
  auto* left_layout = new QVBoxLayout(left);
  left_layout->setContentsMargins(0, 0, 0, 0);
  left_layout->setSpacing(2);
  auto* picker = new QHBoxLayout;
  picker->addWidget(combo_label_);
  picker->addWidget(combo_, 1);
  left_layout->addLayout(picker);
  left_layout->addWidget(chart_view_, 1);

  auto* split = new QSplitter(Qt::Horizontal, this);
  split->addWidget(left);
  split->addWidget(table_);
  split->setStretchFactor(0, 3);
  split->setStretchFactor(1, 2);
  auto* layout = new QHBoxLayout(this);
  layout->setContentsMargins(0, 0, 0, 0);
  layout->addWidget(split);

  connect(combo_, &QComboBox::currentIndexChanged, this, &AggregatesWidget::ShowHistogram);
}

void AggregatesWidget::SetModels(HistogramListModel* histograms, AggregateTableModel* scalars) {
  histograms_ = histograms;
  scalars_ = scalars;
  combo_->setModel(histograms_);
  table_->setModel(scalars_);
  connect(histograms_, &QAbstractItemModel::modelReset, this, &AggregatesWidget::Rebuild);
  connect(scalars_, &QAbstractItemModel::modelReset, this,
          [this] { table_->resizeColumnsToContents(); });
  Rebuild();
}

void AggregatesWidget::Rebuild() {
  const bool any = histograms_->rowCount() > 0;
  combo_->setEnabled(any);
  if (combo_->currentIndex() < 0 && any) {
    combo_->setCurrentIndex(0);  // emits: ShowHistogram(0)
  }
  ShowHistogram(combo_->currentIndex());
}

void AggregatesWidget::ShowHistogram(int row) {
  QChart* chart = histogram_chart();
  ClearChart(chart);
  if (row < 0 || row >= histograms_->rowCount()) {
    chart->setTitle(tr("No histograms (kwatch probe --agg 'hist(x)' records them)"));
    return;
  }
  const QModelIndex index = histograms_->index(row, 0);
  // Qt Charts reads titles and axis labels as HTML: names show as written.
  QString title = index.data().toString().toHtmlEscaped();
  const uint64_t hits = index.data(HistogramListModel::kHitsRole).toULongLong();
  title += hits == 1 ? tr(" — 1 hit") : tr(" — %1 hits").arg(hits);
  if (const uint64_t left_out = histograms_->NoValueAt(row); left_out > 0) {
    title += tr(", %1 without a value left out").arg(left_out);
  }
  chart->setTitle(title);
  auto* set = new QBarSet(tr("hits"));
  set->setColor(kBarColor);
  set->setBorderColor(kBarColor.darker(120));
  QStringList categories;
  double max = 0;
  for (const core::store::AggregateBucketRecord& b : histograms_->BucketsAt(row)) {
    const auto count = static_cast<double>(b.count);
    *set << count;
    categories << HistogramListModel::RangeText(b).toHtmlEscaped();
    max = std::max(max, count);
  }
  auto* series = new QBarSeries;
  series->append(set);
  series->setBarWidth(0.8);
  series->setLabelsVisible(true);
  series->setLabelsPosition(QAbstractBarSeries::LabelsInsideEnd);
  chart->addSeries(series);
  auto* x = new QBarCategoryAxis;
  x->append(categories);
  x->setTitleText(tr("value"));
  chart->addAxis(x, Qt::AlignBottom);
  auto* y = new QValueAxis;
  y->setRange(0, std::max(1.0, max * 1.1));
  y->setLabelFormat(QStringLiteral("%d"));
  y->setTitleText(tr("hits"));
  y->applyNiceNumbers();
  chart->addAxis(y, Qt::AlignLeft);
  series->attachAxis(x);
  series->attachAxis(y);
}

}  // namespace kwatch::gui
