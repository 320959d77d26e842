#pragma once

#include <cstdint>
#include <vector>

#include <QAbstractListModel>
#include <QAbstractTableModel>
#include <QString>

#include "gui/snapshot.h"

namespace kwatch::gui {

// The scalar aggregations of a probe recording (`kwatch probe -o F --agg 'count() by tid'`:
// count, sum, min, max, avg), one row per aggregation and key, in the order kwatch printed
// them. Lives on the GUI thread; SetSnapshot resets it.
class AggregateTableModel : public QAbstractTableModel {
  Q_OBJECT

 public:
  enum Column { kEvent = 0, kAggregation, kKey, kValue, kCount, kColumnCount };
  enum Role {
    kValueRole = Qt::UserRole + 1,  // QString: the value as printed ("5", "2.5")
    kCountRole,                     // quint64: hits aggregated in the row
  };

  explicit AggregateTableModel(QObject* parent = nullptr);

  void SetSnapshot(const SnapshotPtr& snap);

  int rowCount(const QModelIndex& parent = {}) const override;
  int columnCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
  QVariant headerData(int section, Qt::Orientation orientation,
                      int role = Qt::DisplayRole) const override;

 private:
  struct Row {
    const core::store::AggregateRecord* agg = nullptr;
    const core::store::AggregateRowRecord* row = nullptr;
  };
  SnapshotPtr snap_;  // holds what rows_ point into
  std::vector<Row> rows_;
};

// The histograms of a probe recording (hist, lhist), one entry per aggregation and key, named
// "fact: hist(n)" or "fact: hist(n)  tid=1234"; each gives its buckets for a chart. Lives on
// the GUI thread; SetSnapshot resets it.
class HistogramListModel : public QAbstractListModel {
  Q_OBJECT

 public:
  enum Role {
    kBucketsRole = Qt::UserRole + 1,  // int: how many buckets
    kHitsRole,                        // quint64: hits aggregated
  };

  explicit HistogramListModel(QObject* parent = nullptr);

  void SetSnapshot(const SnapshotPtr& snap);

  // The buckets of histogram `row`, in order (empty ones between included).
  const std::vector<core::store::AggregateBucketRecord>& BucketsAt(int row) const;
  // A bucket's range as kwatch prints it: "[4, 8)", "(..., 0)", "[1000, ...)".
  static QString RangeText(const core::store::AggregateBucketRecord& b);
  // Hits of the aggregation left out for want of a value (0 when none).
  uint64_t NoValueAt(int row) const;

  int rowCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;

 private:
  struct Row {
    const core::store::AggregateRecord* agg = nullptr;
    const core::store::AggregateRowRecord* row = nullptr;
  };
  SnapshotPtr snap_;
  std::vector<Row> rows_;
};

}  // namespace kwatch::gui
