#pragma once

#include <sys/types.h>

#include <cstdint>
#include <vector>

#include <QAbstractTableModel>

#include "gui/selection.h"
#include "gui/snapshot.h"

namespace kwatch::gui {

// Per-thread breakdown of the selection: the threads that read or wrote the selected fields
// (in order of first appearance), with their counts and active time. Lives on the GUI
// thread; SetData resets it.
class ThreadModel : public QAbstractTableModel {
  Q_OBJECT

 public:
  enum Column { kTid = 0, kReads, kWrites, kTotal, kFirst, kLast, kColumnCount };
  enum Role {
    kTidRole = Qt::UserRole + 1,  // int
    kCountRole,                   // quint64: the count columns
  };

  explicit ThreadModel(QObject* parent = nullptr);

  // `snap`: the snapshot to count (a slice for a time range or thread).
  void SetData(const SnapshotPtr& snap, const Selection& sel);

  pid_t TidAt(int row) const { return rows_[static_cast<size_t>(row)].tid; }
  uint64_t ReadsAt(int row) const { return rows_[static_cast<size_t>(row)].counts.reads; }
  uint64_t WritesAt(int row) const { return rows_[static_cast<size_t>(row)].counts.writes; }

  int rowCount(const QModelIndex& parent = {}) const override;
  int columnCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
  QVariant headerData(int section, Qt::Orientation orientation,
                      int role = Qt::DisplayRole) const override;

 private:
  struct Row {
    pid_t tid = 0;
    watch::profile::RwCounts counts;
    uint64_t first_ns = 0;  // after the session start
    uint64_t last_ns = 0;
  };
  std::vector<Row> rows_;
};

}  // namespace kwatch::gui
