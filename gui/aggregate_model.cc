#include "gui/aggregate_model.h"

#include <string>

#include "gui/display_text.h"
#include "watch/probe/aggregate_output.h"

namespace kwatch::gui {

namespace {

// "tid=1234 comm=\"prog\"", "-" without a key (as kwatch prints it), shown safely.
QString KeyText(const core::store::AggregateRowRecord& row) {
  return row.key.empty() ? QStringLiteral("-")
                         : DisplayText(watch::probe::AggregateKeyText(row.key));
}

}  // namespace

AggregateTableModel::AggregateTableModel(QObject* parent) : QAbstractTableModel(parent) {}

void AggregateTableModel::SetSnapshot(const SnapshotPtr& snap) {
  beginResetModel();
  snap_ = snap;
  rows_.clear();
  if (snap_) {
    for (const core::store::AggregateRecord& a : snap_->aggregates) {
      if (a.histogram()) {
        continue;
      }
      for (const core::store::AggregateRowRecord& r : a.rows) {
        rows_.push_back(Row{&a, &r});
      }
    }
  }
  endResetModel();
}

int AggregateTableModel::rowCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : static_cast<int>(rows_.size());
}

int AggregateTableModel::columnCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : kColumnCount;
}

QVariant AggregateTableModel::data(const QModelIndex& index, int role) const {
  if (!checkIndex(index, CheckIndexOption::IndexIsValid | CheckIndexOption::ParentIsInvalid)) {
    return {};
  }
  const Row& r = rows_[static_cast<size_t>(index.row())];
  if (role == kValueRole) {
    return QString::fromStdString(r.row->value);
  }
  if (role == kCountRole) {
    return QVariant::fromValue<quint64>(r.row->count);
  }
  if (role == Qt::TextAlignmentRole) {
    if (index.column() >= kValue) {
      return {Qt::AlignRight | Qt::AlignVCenter};
    }
    return {Qt::AlignLeft | Qt::AlignVCenter};
  }
  if (role == Qt::ToolTipRole && index.column() == kAggregation && r.agg->no_value > 0) {
    return r.agg->no_value == 1 ? tr("1 hit without a value left out")
                                : tr("%1 hits without a value left out").arg(r.agg->no_value);
  }
  if (role != Qt::DisplayRole) {
    return {};
  }
  switch (index.column()) {
    case kEvent:
      return DisplayText(r.agg->event);
    case kAggregation:
      return DisplayText(r.agg->agg);
    case kKey:
      return KeyText(*r.row);
    case kValue:
      return QString::fromStdString(r.row->value);
    case kCount:
      return QVariant::fromValue<quint64>(r.row->count);
    default:
      return {};
  }
}

QVariant AggregateTableModel::headerData(int section, Qt::Orientation orientation, int role) const {
  if (orientation != Qt::Horizontal || role != Qt::DisplayRole) {
    return {};
  }
  switch (section) {
    case kEvent:
      return tr("Event");
    case kAggregation:
      return tr("Aggregation");
    case kKey:
      return tr("Key");
    case kValue:
      return tr("Value");
    case kCount:
      return tr("Hits");
    default:
      return {};
  }
}

HistogramListModel::HistogramListModel(QObject* parent) : QAbstractListModel(parent) {}

void HistogramListModel::SetSnapshot(const SnapshotPtr& snap) {
  beginResetModel();
  snap_ = snap;
  rows_.clear();
  if (snap_) {
    for (const core::store::AggregateRecord& a : snap_->aggregates) {
      if (!a.histogram()) {
        continue;
      }
      for (const core::store::AggregateRowRecord& r : a.rows) {
        rows_.push_back(Row{&a, &r});
      }
    }
  }
  endResetModel();
}

const std::vector<core::store::AggregateBucketRecord>& HistogramListModel::BucketsAt(
    int row) const {
  return rows_[static_cast<size_t>(row)].row->buckets;
}

uint64_t HistogramListModel::NoValueAt(int row) const {
  return rows_[static_cast<size_t>(row)].agg->no_value;
}

QString HistogramListModel::RangeText(const core::store::AggregateBucketRecord& b) {
  return QString::fromStdString(watch::probe::BucketRangeText(b));
}

int HistogramListModel::rowCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : static_cast<int>(rows_.size());
}

QVariant HistogramListModel::data(const QModelIndex& index, int role) const {
  if (!checkIndex(index, CheckIndexOption::IndexIsValid | CheckIndexOption::ParentIsInvalid)) {
    return {};
  }
  const Row& r = rows_[static_cast<size_t>(index.row())];
  switch (role) {
    case Qt::DisplayRole: {
      QString name = DisplayText(r.agg->event) + QStringLiteral(": ") + DisplayText(r.agg->agg);
      if (!r.row->key.empty()) {
        name += QStringLiteral("   ") + KeyText(*r.row);
      }
      return name;
    }
    case kBucketsRole:
      return static_cast<int>(r.row->buckets.size());
    case kHitsRole:
      return QVariant::fromValue<quint64>(r.row->count);
    default:
      return {};
  }
}

}  // namespace kwatch::gui
