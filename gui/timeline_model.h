#pragma once

#include <cstdint>
#include <vector>

#include <QAbstractTableModel>

#include "gui/selection.h"
#include "gui/snapshot.h"

namespace kwatch::gui {

// Accesses over time for a selection: one row per time column of the recording's profile
// inside the selected time range, with the reads and writes of the selected fields (by the
// selected thread, or all). Lives on the GUI thread; SetData resets it.
class TimelineModel : public QAbstractTableModel {
  Q_OBJECT

 public:
  enum Column { kStart = 0, kReads, kWrites, kColumnCount };
  enum Role {
    kStartNsRole = Qt::UserRole + 1,  // quint64: column start, ns after the session start
    kCountRole,                       // quint64: the count columns
  };

  explicit TimelineModel(QObject* parent = nullptr);

  // `snap`: the whole recording's snapshot (its time columns are the rows).
  void SetData(const SnapshotPtr& snap, const Selection& sel);

  uint64_t total_reads() const { return total_reads_; }
  uint64_t total_writes() const { return total_writes_; }
  uint64_t bucket_ns() const { return bucket_ns_; }
  uint64_t StartNs(int row) const { return rows_[static_cast<size_t>(row)].start_ns; }
  uint64_t ReadsAt(int row) const { return rows_[static_cast<size_t>(row)].reads; }
  uint64_t WritesAt(int row) const { return rows_[static_cast<size_t>(row)].writes; }

  int rowCount(const QModelIndex& parent = {}) const override;
  int columnCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
  QVariant headerData(int section, Qt::Orientation orientation,
                      int role = Qt::DisplayRole) const override;

 private:
  struct Row {
    uint64_t start_ns = 0;
    uint64_t reads = 0;
    uint64_t writes = 0;
  };
  std::vector<Row> rows_;
  uint64_t bucket_ns_ = 0;
  uint64_t total_reads_ = 0;
  uint64_t total_writes_ = 0;
};

}  // namespace kwatch::gui
