#include "gui/thread_model.h"

#include <array>
#include <utility>

#include "watch/profile/duration.h"

namespace kwatch::gui {

ThreadModel::ThreadModel(QObject* parent) : QAbstractTableModel(parent) {}

void ThreadModel::SetData(const SnapshotPtr& snap, const Selection& sel) {
  beginResetModel();
  rows_.clear();
  if (snap && snap->profile.has_value()) {
    const watch::profile::StorageProfile& p = *snap->profile;
    std::vector<bool> selected(p.fields().size(), false);
    for (const uint32_t f : SelectedFields(sel, p)) {
      selected[f] = true;
    }
    const uint64_t start = snap->session.start_mono_ns;
    for (uint32_t t = 0; t < p.threads().size(); ++t) {
      const watch::profile::ThreadInfo& info = p.threads()[t];
      if (sel.tid.has_value() && info.tid != *sel.tid) {
        continue;
      }
      Row r;
      r.tid = info.tid;
      for (const auto& [f, c] : p.ThreadFields(t)) {  // only what the thread touched
        if (selected[f]) {
          r.counts += c;
        }
      }
      if (r.counts.total() == 0) {
        continue;
      }
      r.first_ns = info.first_ns > start ? info.first_ns - start : 0;
      r.last_ns = info.last_ns > start ? info.last_ns - start : 0;
      rows_.push_back(r);
    }
  }
  endResetModel();
}

int ThreadModel::rowCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : static_cast<int>(rows_.size());
}

int ThreadModel::columnCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : kColumnCount;
}

QVariant ThreadModel::data(const QModelIndex& index, int role) const {
  if (!checkIndex(index, CheckIndexOption::IndexIsValid | CheckIndexOption::ParentIsInvalid)) {
    return {};
  }
  const Row& r = rows_[static_cast<size_t>(index.row())];
  if (role == kTidRole) {
    return r.tid;
  }
  if (role == Qt::TextAlignmentRole) {
    return {Qt::AlignRight | Qt::AlignVCenter};
  }
  if (role == kCountRole) {
    switch (index.column()) {
      case kReads:
        return QVariant::fromValue<quint64>(r.counts.reads);
      case kWrites:
        return QVariant::fromValue<quint64>(r.counts.writes);
      case kTotal:
        return QVariant::fromValue<quint64>(r.counts.total());
      default:
        return {};
    }
  }
  if (role != Qt::DisplayRole) {
    return {};
  }
  switch (index.column()) {
    case kTid:
      return r.tid;
    case kReads:
      return QVariant::fromValue<quint64>(r.counts.reads);
    case kWrites:
      return QVariant::fromValue<quint64>(r.counts.writes);
    case kTotal:
      return QVariant::fromValue<quint64>(r.counts.total());
    case kFirst:
      return QString::fromStdString(watch::profile::FormatDuration(r.first_ns));
    case kLast:
      return QString::fromStdString(watch::profile::FormatDuration(r.last_ns));
    default:
      return {};
  }
}

QVariant ThreadModel::headerData(int section, Qt::Orientation orientation, int role) const {
  if (orientation != Qt::Horizontal || role != Qt::DisplayRole) {
    return {};
  }
  static constexpr auto kNames =
      std::to_array<const char*>({"Thread", "Reads", "Writes", "Total", "First", "Last"});
  static_assert(kNames.size() == kColumnCount);
  if (section < 0 || section >= kColumnCount) {
    return {};
  }
  return QString::fromLatin1(kNames[static_cast<size_t>(section)]);
}

}  // namespace kwatch::gui
