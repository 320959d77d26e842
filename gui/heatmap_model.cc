#include "gui/heatmap_model.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "gui/field_tree_model.h"
#include "watch/profile/duration.h"
#include "watch/profile/false_sharing.h"
#include "watch/profile/report_rows.h"

namespace kwatch::gui {

HeatmapModel::HeatmapModel(QObject* parent) : QAbstractTableModel(parent) {}

const watch::profile::StorageProfile* HeatmapModel::profile() const {
  return snap_ && snap_->profile.has_value() ? &*snap_->profile : nullptr;
}

void HeatmapModel::SetSnapshot(SnapshotPtr snap) {
  beginResetModel();
  snap_ = std::move(snap);
  const watch::profile::StorageProfile* p = profile();
  if (p == nullptr || object_ >= p->objects().size()) {
    object_ = 0;
  }
  Rebuild();
  endResetModel();
}

void HeatmapModel::SetObject(uint32_t obj) {
  beginResetModel();
  object_ = obj;
  Rebuild();
  endResetModel();
}

void HeatmapModel::SetMode(AccessMode mode) {
  if (mode == mode_) {
    return;
  }
  mode_ = mode;
  RebuildCells();
  EmitAllChanged();
}

void HeatmapModel::SetThread(std::optional<pid_t> tid) {
  if (tid == tid_) {
    return;
  }
  tid_ = tid;
  RebuildCells();
  EmitAllChanged();
}

void HeatmapModel::SetScale(Scale scale) {
  if (scale == scale_) {
    return;
  }
  scale_ = scale;
  EmitAllChanged();
}

void HeatmapModel::EmitAllChanged() {
  if (!fields_.empty() && columns_ > 0) {
    Q_EMIT dataChanged(index(0, 0), index(static_cast<int>(fields_.size()) - 1, columns_ - 1));
  }
}

void HeatmapModel::Rebuild() {
  fields_.clear();
  lines_.clear();
  columns_ = 0;
  bucket_ns_ = 0;
  first_column_ns_ = 0;
  const watch::profile::StorageProfile* p = profile();
  if (p != nullptr && object_ < p->objects().size()) {
    const watch::profile::WatchedObject& o = p->objects()[object_];
    const auto [first, last] = p->FieldRange(object_);
    for (uint32_t f = first; f < last; ++f) {
      fields_.push_back(f);
      lines_.push_back((o.addr.value + p->fields()[f].begin) &
                       ~(watch::profile::kCacheLineBytes - 1));
    }
    columns_ = static_cast<int>(p->bins().columns());
    bucket_ns_ = p->bins().width_ns();
    first_column_ns_ = p->bins().ColumnStartNs(0);
  }
  RebuildCells();
}

void HeatmapModel::RebuildCells() {
  const size_t n = fields_.size() * static_cast<size_t>(columns_);
  reads_.assign(n, 0);
  writes_.assign(n, 0);
  cells_.assign(n, 0);
  max_ = 0;
  total_ = 0;
  const watch::profile::StorageProfile* p = profile();
  if (p == nullptr || n == 0) {
    return;
  }
  // The report model's per-field heat, for one thread or all (a thread that touched nothing in
  // this recording selects nothing: all zeros).
  const watch::profile::ThreadSelection threads(
      *p, tid_.has_value() ? std::vector<pid_t>{*tid_} : std::vector<pid_t>{});
  for (size_t row = 0; row < fields_.size(); ++row) {
    const uint32_t f = fields_[row];
    const size_t base = row * static_cast<size_t>(columns_);
    const auto copy = [&](bool writes, std::vector<uint64_t>& out) {
      const std::vector<uint64_t> bins = threads.FieldHeat(f, writes);
      std::copy_n(bins.begin(), std::min<size_t>(bins.size(), static_cast<size_t>(columns_)),
                  out.begin() + static_cast<ptrdiff_t>(base));
    };
    copy(false, reads_);
    copy(true, writes_);
  }
  for (size_t i = 0; i < n; ++i) {
    switch (mode_) {
      case AccessMode::kBoth:
        cells_[i] = reads_[i] + writes_[i];
        break;
      case AccessMode::kReads:
        cells_[i] = reads_[i];
        break;
      case AccessMode::kWrites:
        cells_[i] = writes_[i];
        break;
    }
    max_ = std::max(max_, cells_[i]);
    total_ += cells_[i];
  }
}

QColor HeatmapModel::CellColor(int row, int column) const {
  return HeatColor(Count(row, column), max_, scale_);
}

int HeatmapModel::RowOf(uint32_t field) const {
  const auto it = std::find(fields_.begin(), fields_.end(), field);
  return it == fields_.end() ? -1 : static_cast<int>(it - fields_.begin());
}

QString HeatmapModel::RowLabel(int row) const {
  return FieldLabel(*profile(), FieldAt(row));
}

uint64_t HeatmapModel::ColumnStartNs(int column) const {
  return first_column_ns_ + static_cast<uint64_t>(column) * bucket_ns_;
}

QString HeatmapModel::ObjectTitle() const {
  const watch::profile::StorageProfile* p = profile();
  if (p == nullptr || object_ >= p->objects().size()) {
    return {};
  }
  const watch::profile::WatchedObject& o = p->objects()[object_];
  if (o.type_name.empty()) {
    return QStringLiteral("%1  (%2 bytes at 0x%3)")
        .arg(QString::fromStdString(o.expr))
        .arg(o.length)
        .arg(o.addr.value, 0, 16);
  }
  return QStringLiteral("%1  (%2, %3 bytes at 0x%4)")
      .arg(QString::fromStdString(o.expr), QString::fromStdString(o.type_name))
      .arg(o.length)
      .arg(o.addr.value, 0, 16);
}

int HeatmapModel::rowCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : static_cast<int>(fields_.size());
}

int HeatmapModel::columnCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : columns_;
}

QVariant HeatmapModel::data(const QModelIndex& index, int role) const {
  if (!checkIndex(index, CheckIndexOption::IndexIsValid | CheckIndexOption::ParentIsInvalid)) {
    return {};
  }
  const int row = index.row();
  const int col = index.column();
  switch (role) {
    case Qt::DisplayRole:
    case kCountRole:
      return QVariant::fromValue<quint64>(Count(row, col));
    case kReadsRole:
      return QVariant::fromValue<quint64>(Reads(row, col));
    case kWritesRole:
      return QVariant::fromValue<quint64>(Writes(row, col));
    case kFractionRole:
      return max_ == 0 ? 0.0 : static_cast<double>(Count(row, col)) / static_cast<double>(max_);
    case Qt::BackgroundRole:
      return CellColor(row, col);
    case Qt::ToolTipRole: {
      const watch::profile::FieldInfo& f = profile()->fields()[FieldAt(row)];
      QString who =
          tid_.has_value() ? QStringLiteral("thread %1").arg(*tid_) : QStringLiteral("all threads");
      return QStringLiteral(
                 "%1  (%2, offset %3, %4 bytes)\n%5 – %6 after start, %7\n"
                 "reads %8   writes %9")
          .arg(QString::fromStdString(f.path), QString::fromStdString(f.type_name),
               FieldOffsetText(f), FieldSizeText(f),
               QString::fromStdString(watch::profile::FormatDuration(ColumnStartNs(col))),
               QString::fromStdString(watch::profile::FormatDuration(ColumnStartNs(col + 1))), who)
          .arg(Reads(row, col))
          .arg(Writes(row, col));
    }
    default:
      return {};
  }
}

QVariant HeatmapModel::headerData(int section, Qt::Orientation orientation, int role) const {
  if (orientation == Qt::Vertical) {
    if (section < 0 || section >= static_cast<int>(fields_.size())) {
      return {};
    }
    switch (role) {
      case Qt::DisplayRole:
        return RowLabel(section);
      case kFieldRole:
        return FieldAt(section);
      case kCacheLineRole:
        return QVariant::fromValue<quint64>(LineAt(section));
      default:
        return {};
    }
  }
  if (section < 0 || section >= columns_) {
    return {};
  }
  switch (role) {
    case Qt::DisplayRole:
      return QString::fromStdString(watch::profile::FormatDuration(ColumnStartNs(section)));
    case kColumnStartNsRole:
      return QVariant::fromValue<quint64>(ColumnStartNs(section));
    default:
      return {};
  }
}

}  // namespace kwatch::gui
