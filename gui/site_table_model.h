#pragma once

#include <cstdint>
#include <vector>

#include <QAbstractTableModel>
#include <QString>

#include "gui/selection.h"
#include "gui/snapshot.h"

namespace kwatch::gui {

// The instructions that accessed the selected fields, ranked by accesses (descending; ties:
// lower address first), with function+offset, file:line, counts, the fields they touched and
// the source lines around them. A last row "other sites" sums accesses beyond the profile's
// per-field site tables, when there are any.
//
// For the whole object the counts are per event (an event touching two fields counts once);
// for a set of fields they are the sum of the fields' site counts (an event touching two
// selected fields counts in both). Lives on the GUI thread; SetData resets it.
class SiteTableModel : public QAbstractTableModel {
  Q_OBJECT

 public:
  enum Column {
    kFunction = 0,
    kLocation,
    kAddress,
    kReads,
    kWrites,
    kTotal,
    kFields,
    kColumnCount
  };
  enum Role {
    kIpRole = Qt::UserRole + 1,  // quint64 (0 for the "other" row)
    kCountRole,                  // quint64: the count columns
    kSourceRole,                 // QString: numbered source lines around the site, or why none
    kIsOtherRole,                // bool
  };

  explicit SiteTableModel(QObject* parent = nullptr);

  // `counts`: the snapshot whose profile is counted (a slice for a time range or thread);
  // `names`: the whole recording's snapshot (site names and source lines).
  void SetData(SnapshotPtr counts, SnapshotPtr names, const Selection& sel);

  uint64_t total_reads() const { return total_.reads; }
  uint64_t total_writes() const { return total_.writes; }
  // The row of a site, or -1.
  int RowOfIp(uint64_t ip) const;
  // Short name for charts: "Work (field_writer.c:49)", "Work+0x1a" without line information,
  // "0x401a2b" without a symbol, "other sites".
  QString SiteLabel(int row) const;

  int rowCount(const QModelIndex& parent = {}) const override;
  int columnCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
  QVariant headerData(int section, Qt::Orientation orientation,
                      int role = Qt::DisplayRole) const override;

 private:
  struct Row {
    uint64_t ip = 0;
    bool other = false;
    watch::profile::RwCounts counts;
    std::vector<uint32_t> fields;  // selected fields it touched
  };
  const core::store::SiteRecord* Site(uint64_t ip) const;
  QString SourceText(const Row& r) const;

  SnapshotPtr counts_;
  SnapshotPtr names_;
  std::vector<Row> rows_;
  watch::profile::RwCounts total_;
};

}  // namespace kwatch::gui
