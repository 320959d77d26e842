#include "gui/field_tree_model.h"

#include <utility>

#include <QString>

#include "gui/display_text.h"

namespace kwatch::gui {

namespace {

// internalId: 0 for objects; object index + 1 for their fields.
constexpr quintptr kObjectLevel = 0;

QString ObjectTitle(const watch::profile::WatchedObject& o) {
  return DisplayText(o.expr);
}

}  // namespace

QString FieldLabel(const watch::profile::StorageProfile& profile, uint32_t field) {
  const watch::profile::FieldInfo& f = profile.fields()[field];
  const std::string& expr = profile.objects()[f.object].expr;
  std::string label = f.path;
  if (label.size() > expr.size() && label.compare(0, expr.size(), expr) == 0) {
    label = label.substr(expr.size());
    if (label[0] == '.') {
      label = label.substr(1);
    }
  }
  return DisplayText(label);
}

QString FieldOffsetText(const watch::profile::FieldInfo& f) {
  if (f.bit_size > 0) {
    return QStringLiteral("%1:%2").arg(f.offset).arg(f.bit_offset);
  }
  return QString::number(f.offset);
}

QString FieldSizeText(const watch::profile::FieldInfo& f) {
  if (f.bit_size > 0) {
    return QStringLiteral("%1b").arg(f.bit_size);
  }
  return QString::number(f.size);
}

FieldTreeModel::FieldTreeModel(QObject* parent) : QAbstractItemModel(parent) {}

const watch::profile::StorageProfile* FieldTreeModel::profile() const {
  return snap_ && snap_->profile.has_value() ? &*snap_->profile : nullptr;
}

void FieldTreeModel::SetSnapshot(SnapshotPtr snap) {
  beginResetModel();
  snap_ = std::move(snap);
  object_threads_.clear();
  if (const watch::profile::StorageProfile* p = profile(); p != nullptr) {
    // Threads that touched any field of each object: one pass over what each thread touched.
    object_threads_.assign(p->objects().size(), 0);
    for (uint32_t t = 0; t < p->threads().size(); ++t) {
      uint32_t last_object = watch::profile::StorageProfile::kNone;
      for (const auto& [f, c] : p->ThreadFields(t)) {  // by field: object by object
        const uint32_t obj = p->fields()[f].object;
        if (c.total() > 0 && obj != last_object) {
          ++object_threads_[obj];
          last_object = obj;
        }
      }
    }
  }
  endResetModel();
}

QModelIndex FieldTreeModel::ObjectIndex(uint32_t obj, int column) const {
  const watch::profile::StorageProfile* p = profile();
  if (p == nullptr || obj >= p->objects().size()) {
    return {};
  }
  return createIndex(static_cast<int>(obj), column, kObjectLevel);
}

QModelIndex FieldTreeModel::FieldIndex(uint32_t field, int column) const {
  const watch::profile::StorageProfile* p = profile();
  if (p == nullptr || field >= p->fields().size()) {
    return {};
  }
  const uint32_t obj = p->fields()[field].object;
  const uint32_t first = p->FieldRange(obj).first;
  return createIndex(static_cast<int>(field - first), column, static_cast<quintptr>(obj) + 1);
}

QModelIndex FieldTreeModel::index(int row, int column, const QModelIndex& parent) const {
  if (!hasIndex(row, column, parent)) {
    return {};
  }
  if (!parent.isValid()) {
    return createIndex(row, column, kObjectLevel);
  }
  if (parent.internalId() != kObjectLevel) {
    return {};
  }
  return createIndex(row, column, static_cast<quintptr>(parent.row()) + 1);
}

QModelIndex FieldTreeModel::parent(const QModelIndex& child) const {
  if (!child.isValid() || child.internalId() == kObjectLevel) {
    return {};
  }
  return createIndex(static_cast<int>(child.internalId() - 1), 0, kObjectLevel);
}

int FieldTreeModel::rowCount(const QModelIndex& parent) const {
  const watch::profile::StorageProfile* p = profile();
  if (p == nullptr) {
    return 0;
  }
  if (!parent.isValid()) {
    return static_cast<int>(p->objects().size());
  }
  if (parent.column() != 0 || parent.internalId() != kObjectLevel) {
    return 0;
  }
  const auto [first, last] = p->FieldRange(static_cast<uint32_t>(parent.row()));
  return static_cast<int>(last - first);
}

int FieldTreeModel::columnCount(const QModelIndex& /*parent*/) const {
  return kColumnCount;
}

QVariant FieldTreeModel::data(const QModelIndex& index, int role) const {
  const watch::profile::StorageProfile* p = profile();
  if (p == nullptr || !checkIndex(index, CheckIndexOption::IndexIsValid)) {
    return {};
  }
  const bool is_object = index.internalId() == kObjectLevel;
  const uint32_t obj = is_object ? static_cast<uint32_t>(index.row())
                                 : static_cast<uint32_t>(index.internalId() - 1);
  const watch::profile::WatchedObject& o = p->objects()[obj];
  const uint32_t field =
      is_object ? 0 : p->FieldRange(obj).first + static_cast<uint32_t>(index.row());
  if (role == kObjectRole) {
    return obj;
  }
  if (role == kFieldRole) {
    return is_object ? -1 : static_cast<int>(field);
  }
  watch::profile::RwCounts counts;
  uint64_t threads = 0;
  if (is_object) {
    counts = p->object_stats(obj).total;
    threads = object_threads_[obj];
  } else {
    counts = p->field_counts(field);
    threads = p->FieldThreadCount(field);
  }
  const auto count_of = [&](int column) -> std::optional<uint64_t> {
    switch (column) {
      case kReads:
        return counts.reads;
      case kWrites:
        return counts.writes;
      case kThreads:
        return threads;
      default:
        return std::nullopt;
    }
  };
  if (role == kCountRole) {
    const auto c = count_of(index.column());
    return c.has_value() ? QVariant::fromValue<quint64>(*c) : QVariant();
  }
  if (role == Qt::TextAlignmentRole) {
    return index.column() == kName || index.column() == kType
               ? QVariant(Qt::AlignLeft | Qt::AlignVCenter)
               : QVariant(Qt::AlignRight | Qt::AlignVCenter);
  }
  if (role == Qt::ToolTipRole) {
    if (is_object) {
      return QStringLiteral("%1: %2, %3 bytes at 0x%4")
          .arg(ObjectTitle(o), DisplayText(o.type_name.empty() ? "?" : o.type_name))
          .arg(o.length)
          .arg(o.addr.value, 0, 16);
    }
    const watch::profile::FieldInfo& f = p->fields()[field];
    return QStringLiteral("%1 (%2): offset %3, %4 bytes, at 0x%5")
        .arg(DisplayText(f.path), DisplayText(f.type_name), FieldOffsetText(f), FieldSizeText(f))
        .arg(o.addr.value + f.offset, 0, 16);
  }
  if (role != Qt::DisplayRole) {
    return {};
  }
  if (const auto c = count_of(index.column()); c.has_value()) {
    return QVariant::fromValue<quint64>(*c);
  }
  switch (index.column()) {
    case kName:
      return is_object ? ObjectTitle(o) : FieldLabel(*p, field);
    case kOffset:
      return is_object ? QString() : FieldOffsetText(p->fields()[field]);
    case kSize:
      return is_object ? QString::number(o.length) : FieldSizeText(p->fields()[field]);
    case kType:
      return DisplayText(is_object ? o.type_name : p->fields()[field].type_name);
    default:
      return {};
  }
}

QVariant FieldTreeModel::headerData(int section, Qt::Orientation orientation, int role) const {
  if (orientation != Qt::Horizontal || role != Qt::DisplayRole) {
    return {};
  }
  switch (section) {
    case kName:
      return QStringLiteral("Field");
    case kOffset:
      return QStringLiteral("Offset");
    case kSize:
      return QStringLiteral("Size");
    case kType:
      return QStringLiteral("Type");
    case kReads:
      return QStringLiteral("Reads");
    case kWrites:
      return QStringLiteral("Writes");
    case kThreads:
      return QStringLiteral("Threads");
    default:
      return {};
  }
}

}  // namespace kwatch::gui
