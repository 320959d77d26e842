#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include <QAbstractTableModel>
#include <QString>

#include "gui/selection.h"
#include "gui/snapshot.h"
#include "watch/profile/false_sharing.h"

namespace kwatch::gui {

// The 64-byte cache lines holding the selected object's fields, by address, with their writes,
// writing threads and transfers between threads; lines with a false-sharing finding are
// highlighted and carry its evidence (who wrote which fields, from where). Lives on the GUI
// thread; SetData resets it.
class CacheLineModel : public QAbstractTableModel {
  Q_OBJECT

 public:
  enum Column {
    kAddress = 0,
    kFields,
    kWrites,
    kWriters,
    kFalseTransfers,
    kTrueTransfers,
    kVerdict,
    kColumnCount
  };
  enum Role {
    kLineRole = Qt::UserRole + 1,  // quint64 line address
    kCountRole,                    // quint64: the count columns
    kFalseSharingRole,             // bool: a finding
    kEvidenceRole,                 // QString: the finding's evidence, or the line's summary
  };

  explicit CacheLineModel(QObject* parent = nullptr);

  // `snap`: the snapshot to show (a slice for a time range or thread); `names`: the whole
  // recording's (site names).
  void SetData(SnapshotPtr snap, SnapshotPtr names, const Selection& sel);

  int findings() const { return findings_; }

  int rowCount(const QModelIndex& parent = {}) const override;
  int columnCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
  QVariant headerData(int section, Qt::Orientation orientation,
                      int role = Qt::DisplayRole) const override;

 private:
  struct Row {
    uint32_t line = 0;  // index into the profile's lines()
    std::optional<watch::profile::FalseSharingFinding> finding;
  };
  const watch::profile::StorageProfile& profile() const { return *snap_->profile; }
  QString Evidence(const Row& r) const;

  SnapshotPtr snap_;
  SnapshotPtr names_;
  std::vector<Row> rows_;
  int findings_ = 0;
};

}  // namespace kwatch::gui
