#pragma once

#include <QChart>
#include <QChartView>
#include <QComboBox>
#include <QLabel>
#include <QTableView>
#include <QWidget>

#include "gui/aggregate_model.h"

namespace kwatch::gui {

// The aggregations of a probe recording (`kwatch probe -o F --agg ...`): on the left a bar
// chart of one histogram (hist, lhist; one per aggregation and key, picked in a combo box),
// its bars the bucket counts over the buckets' ranges as kwatch prints them; on the right the
// scalar aggregations (count, sum, min, max, avg) in a table. Redrawn when its models reset;
// holds no data of its own.
class AggregatesWidget : public QWidget {
  Q_OBJECT

 public:
  explicit AggregatesWidget(QWidget* parent = nullptr);

  void SetModels(HistogramListModel* histograms, AggregateTableModel* scalars);

  // Shows histogram `row` of the list model (the combo box's choice).
  void ShowHistogram(int row);

  QChart* histogram_chart() const { return chart_view_->chart(); }
  QComboBox* histogram_combo() const { return combo_; }
  QTableView* scalar_view() const { return table_; }

 private:
  void Rebuild();

  HistogramListModel* histograms_ = nullptr;
  AggregateTableModel* scalars_ = nullptr;
  QComboBox* combo_;
  QLabel* combo_label_;
  QChartView* chart_view_;
  QTableView* table_;
};

}  // namespace kwatch::gui
