#include "gui/timeline_model.h"

namespace kwatch::gui {

TimelineModel::TimelineModel(QObject* parent) : QAbstractTableModel(parent) {}

void TimelineModel::SetData(const SnapshotPtr& snap, const Selection& sel) {
  beginResetModel();
  rows_.clear();
  bucket_ns_ = 0;
  total_reads_ = 0;
  total_writes_ = 0;
  if (snap && snap->profile.has_value()) {
    const watch::profile::StorageProfile& p = *snap->profile;
    const watch::profile::TimeBins& bins = p.bins();
    bucket_ns_ = bins.width_ns();
    uint32_t thread = watch::profile::StorageProfile::kNone;
    bool none = false;
    if (sel.tid.has_value()) {
      thread = p.ThreadIndex(*sel.tid);
      none = thread == watch::profile::StorageProfile::kNone;
    }
    std::vector<uint64_t> reads(bins.columns(), 0);
    std::vector<uint64_t> writes(bins.columns(), 0);
    if (!none) {
      for (uint32_t f : SelectedFields(sel, p)) {
        for (const bool w : {false, true}) {
          std::vector<uint64_t>& out = w ? writes : reads;
          if (thread == watch::profile::StorageProfile::kNone) {
            const absl::Span<const uint64_t> row = p.FieldBins(f, w);
            for (size_t c = 0; c < row.size() && c < out.size(); ++c) {
              out[c] += row[c];
            }
          } else {
            const std::vector<uint64_t> row = p.ThreadFieldBins(thread, f, w);
            for (size_t c = 0; c < row.size() && c < out.size(); ++c) {
              out[c] += row[c];
            }
          }
        }
      }
    }
    for (uint32_t c = 0; c < bins.columns(); ++c) {
      const uint64_t start = bins.ColumnStartNs(c);
      const uint64_t end = bins.ColumnStartNs(c + 1);
      if ((sel.from_ns.has_value() && end <= *sel.from_ns) ||
          (sel.to_ns.has_value() && start >= *sel.to_ns)) {
        continue;
      }
      rows_.push_back(Row{start, reads[c], writes[c]});
      total_reads_ += reads[c];
      total_writes_ += writes[c];
    }
  }
  endResetModel();
}

int TimelineModel::rowCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : static_cast<int>(rows_.size());
}

int TimelineModel::columnCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : kColumnCount;
}

QVariant TimelineModel::data(const QModelIndex& index, int role) const {
  if (!checkIndex(index, CheckIndexOption::IndexIsValid | CheckIndexOption::ParentIsInvalid)) {
    return {};
  }
  const Row& r = rows_[static_cast<size_t>(index.row())];
  if (role == kStartNsRole) {
    return QVariant::fromValue<quint64>(r.start_ns);
  }
  if (role != Qt::DisplayRole && role != kCountRole) {
    return {};
  }
  switch (index.column()) {
    case kStart:
      return role == kCountRole ? QVariant() : QVariant(static_cast<double>(r.start_ns) / 1e9);
    case kReads:
      return QVariant::fromValue<quint64>(r.reads);
    case kWrites:
      return QVariant::fromValue<quint64>(r.writes);
    default:
      return {};
  }
}

QVariant TimelineModel::headerData(int section, Qt::Orientation orientation, int role) const {
  if (orientation != Qt::Horizontal || role != Qt::DisplayRole) {
    return {};
  }
  switch (section) {
    case kStart:
      return QStringLiteral("Time (s)");
    case kReads:
      return QStringLiteral("Reads");
    case kWrites:
      return QStringLiteral("Writes");
    default:
      return {};
  }
}

}  // namespace kwatch::gui
