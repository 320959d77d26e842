#pragma once

#include <cstdint>
#include <vector>

#include <QAbstractItemModel>

#include "gui/snapshot.h"

namespace kwatch::gui {

// The watched objects of a recording (top level) and their leaf fields in layout order
// (children), with layout (offset, size, type) and the whole recording's read and write
// counts. Lives on the GUI thread; reset by SetSnapshot.
class FieldTreeModel : public QAbstractItemModel {
  Q_OBJECT

 public:
  enum Column { kName = 0, kOffset, kSize, kType, kReads, kWrites, kThreads, kColumnCount };
  enum Role {
    kObjectRole = Qt::UserRole + 1,  // index into profile objects() (both levels)
    kFieldRole,                      // global field index (fields; -1 for objects)
    kCountRole,                      // quint64 value of the count columns
  };

  explicit FieldTreeModel(QObject* parent = nullptr);

  void SetSnapshot(SnapshotPtr snap);

  // The index of an object (row of the top level) and of a global field index.
  QModelIndex ObjectIndex(uint32_t obj, int column = 0) const;
  QModelIndex FieldIndex(uint32_t field, int column = 0) const;

  QModelIndex index(int row, int column, const QModelIndex& parent = {}) const override;
  QModelIndex parent(const QModelIndex& child) const override;
  int rowCount(const QModelIndex& parent = {}) const override;
  int columnCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
  QVariant headerData(int section, Qt::Orientation orientation,
                      int role = Qt::DisplayRole) const override;

 private:
  const watch::profile::StorageProfile* profile() const;

  SnapshotPtr snap_;
  std::vector<uint64_t> object_threads_;  // per object: threads that touched it
};

// The field's name below its object: "g_stats.inner.a" of "g_stats" -> "inner.a"; "[3].tag"
// for array elements; the whole path when it does not start with the object's name.
QString FieldLabel(const watch::profile::StorageProfile& profile, uint32_t field);

// Offset and size as the report shows them: "8" and "4", bitfields "24:3" and "1b".
QString FieldOffsetText(const watch::profile::FieldInfo& f);
QString FieldSizeText(const watch::profile::FieldInfo& f);

}  // namespace kwatch::gui
