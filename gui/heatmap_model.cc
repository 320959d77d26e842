#include "gui/heatmap_model.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "gui/display_text.h"
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

void HeatmapModel::SetZoom(ZoomPtr zoom) {
  beginResetModel();
  zoom_ = std::move(zoom);
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
    if (zoom_ != nullptr) {
      columns_ = static_cast<int>(zoom_->heat.columns);
      bucket_ns_ = zoom_->heat.column_ns;
      first_column_ns_ = zoom_->heat.from_ns;
    } else {
      columns_ = static_cast<int>(p->bins().columns());
      bucket_ns_ = p->bins().width_ns();
      first_column_ns_ = p->bins().ColumnStartNs(0);
    }
  }
  RebuildCells();
}

void HeatmapModel::RebuildCells() {
  blocks_.assign(fields_.size(), kNoBlock);
  reads_.clear();
  writes_.clear();
  max_ = 0;
  total_ = 0;
  const watch::profile::StorageProfile* p = profile();
  if (p == nullptr || fields_.empty() || columns_ == 0) {
    return;
  }
  // The report model's per-field heat, for one thread or all (a thread that touched nothing in
  // this recording selects nothing: all zeros). Rows without accesses keep no counters.
  const watch::profile::ThreadSelection threads(
      *p, tid_.has_value() ? std::vector<pid_t>{*tid_} : std::vector<pid_t>{});
  const auto width = static_cast<size_t>(columns_);
  if (zoom_ != nullptr) {
    for (size_t row = 0; row < fields_.size(); ++row) {
      const auto it = zoom_->heat.fields.find(fields_[row]);
      if (it == zoom_->heat.fields.end()) {
        continue;
      }
      blocks_[row] = static_cast<uint32_t>(reads_.size() / width);
      for (size_t c = 0; c < width; ++c) {
        const watch::profile::RwCounts n =
            c < it->second.size() ? it->second[c] : watch::profile::RwCounts{};
        reads_.push_back(n.reads);
        writes_.push_back(n.writes);
      }
      for (size_t c = 0; c < width; ++c) {
        const uint64_t n = Count(static_cast<int>(row), static_cast<int>(c));
        max_ = std::max(max_, n);
        total_ += n;
      }
    }
    return;
  }
  for (size_t row = 0; row < fields_.size(); ++row) {
    const uint32_t f = fields_[row];
    if (threads.FieldCounts(f).total() == 0) {
      continue;
    }
    blocks_[row] = static_cast<uint32_t>(reads_.size() / width);
    for (const bool writes : {false, true}) {
      std::vector<uint64_t>& out = writes ? writes_ : reads_;
      std::vector<uint64_t> bins = threads.FieldHeat(f, writes);
      bins.resize(width, 0);
      out.insert(out.end(), bins.begin(), bins.end());
    }
    for (size_t c = 0; c < width; ++c) {
      const uint64_t n = Count(static_cast<int>(row), static_cast<int>(c));
      max_ = std::max(max_, n);
      total_ += n;
    }
  }
}

uint64_t HeatmapModel::Reads(int row, int column) const {
  const size_t i = Cell(row, column);
  return i == std::string::npos ? 0 : reads_[i];
}

uint64_t HeatmapModel::Writes(int row, int column) const {
  const size_t i = Cell(row, column);
  return i == std::string::npos ? 0 : writes_[i];
}

uint64_t HeatmapModel::Count(int row, int column) const {
  const size_t i = Cell(row, column);
  if (i == std::string::npos) {
    return 0;
  }
  switch (mode_) {
    case AccessMode::kBoth:
      return reads_[i] + writes_[i];
    case AccessMode::kReads:
      return reads_[i];
    case AccessMode::kWrites:
      return writes_[i];
  }
  return 0;
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
  if (zoom_ != nullptr && column >= columns_) {
    return zoom_->heat.to_ns;  // the last column may be narrower
  }
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
        .arg(DisplayText(o.expr), QString::number(o.length), QString::number(o.addr.value, 16));
  }
  return QStringLiteral("%1  (%2, %3 bytes at 0x%4)")
      .arg(DisplayText(o.expr), DisplayText(o.type_name), QString::number(o.length),
           QString::number(o.addr.value, 16));
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
          .arg(DisplayText(f.path), DisplayText(f.type_name), FieldOffsetText(f), FieldSizeText(f),
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
