#pragma once

#include <sys/types.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <QAbstractTableModel>
#include <QString>

#include "gui/heat_color.h"
#include "gui/snapshot.h"

namespace kwatch::gui {

// Which accesses a view counts.
enum class AccessMode : uint8_t { kBoth = 0, kReads = 1, kWrites = 2 };

// The heatmap matrix of one watched object: rows are its leaf fields in layout order (so
// fields of one cache line are adjacent), columns the profile's time columns; a cell counts
// the field's accesses (reads, writes or both) in that column, by all threads or one. The
// matrix is computed when an input changes (O(rows + accessed rows x columns)), never while
// painting; only rows with accesses hold counters (a row nobody touched reads as zeros), so a
// structure of thousands of fields costs what its accessed fields need.
// Zoomed in (SetZoom), the columns are those of a ZoomGrid: a time window at its own
// resolution, read from the recording's finer profile_bins, not the snapshot's columns
// magnified; a new snapshot (follow mode) keeps the zoom until the caller replaces it.
// Lives on the GUI thread; SetSnapshot, SetObject and SetZoom reset it, the other setters emit
// dataChanged over every cell.
class HeatmapModel : public QAbstractTableModel {
  Q_OBJECT

 public:
  enum Role {
    kCountRole = Qt::UserRole + 1,  // quint64: the cell's count in the current mode
    kReadsRole,                     // quint64
    kWritesRole,                    // quint64
    kFractionRole,                  // double: count / max_count()
    kFieldRole,                     // header (vertical): global field index
    kCacheLineRole,                 // header (vertical): quint64 line address
    kColumnStartNsRole,             // header (horizontal): quint64 ns after the session start
  };

  explicit HeatmapModel(QObject* parent = nullptr);

  void SetSnapshot(SnapshotPtr snap);
  void SetObject(uint32_t obj);
  void SetMode(AccessMode mode);
  void SetThread(std::optional<pid_t> tid);  // nullopt: all threads
  void SetScale(Scale scale);                // colours only
  // The window's grid (its tid must be thread()'s), or null: the snapshot's own columns.
  void SetZoom(ZoomPtr zoom);
  const ZoomGrid* zoom() const { return zoom_.get(); }

  // For painting (row and column in range).
  uint64_t Count(int row, int column) const;
  uint64_t Reads(int row, int column) const;
  uint64_t Writes(int row, int column) const;
  // Rows holding counters (accessed in the current thread filter).
  size_t counted_rows() const { return reads_.size() / std::max(columns_, 1); }
  uint64_t max_count() const { return max_; }
  uint64_t total() const { return total_; }  // sum of all cells
  QColor CellColor(int row, int column) const;
  uint32_t FieldAt(int row) const { return fields_[static_cast<size_t>(row)]; }
  // The row of a global field index, or -1 when it is not one of this object's.
  int RowOf(uint32_t field) const;
  QString RowLabel(int row) const;
  uint64_t LineAt(int row) const { return lines_[static_cast<size_t>(row)]; }
  // Nanoseconds after the session start where column `c` begins (c == columnCount(): the end).
  uint64_t ColumnStartNs(int column) const;
  uint64_t bucket_ns() const { return bucket_ns_; }
  uint32_t object() const { return object_; }
  AccessMode mode() const { return mode_; }
  Scale scale() const { return scale_; }
  const std::optional<pid_t>& thread() const { return tid_; }
  // "g_stats  (struct stats, 32 bytes at 0x4040a0)", or "" with no object.
  QString ObjectTitle() const;
  const Snapshot* snapshot() const { return snap_.get(); }

  int rowCount(const QModelIndex& parent = {}) const override;
  int columnCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
  QVariant headerData(int section, Qt::Orientation orientation,
                      int role = Qt::DisplayRole) const override;

 private:
  static constexpr uint32_t kNoBlock = ~0U;
  // Index of the cell in reads_ / writes_, or npos for a row without counters.
  size_t Cell(int row, int column) const {
    const uint32_t block = blocks_[static_cast<size_t>(row)];
    return block == kNoBlock ? std::string::npos
                             : static_cast<size_t>(block) * static_cast<size_t>(columns_) +
                                   static_cast<size_t>(column);
  }
  const watch::profile::StorageProfile* profile() const;
  void Rebuild();       // layout (rows, columns) and counts
  void RebuildCells();  // counts only
  void EmitAllChanged();

  SnapshotPtr snap_;
  ZoomPtr zoom_;
  uint32_t object_ = 0;
  AccessMode mode_ = AccessMode::kBoth;
  std::optional<pid_t> tid_;
  Scale scale_ = Scale::kLinear;
  std::vector<uint32_t> fields_;  // per row: global field index
  std::vector<uint64_t> lines_;   // per row: cache line address
  int columns_ = 0;
  uint64_t bucket_ns_ = 0;
  uint64_t first_column_ns_ = 0;
  std::vector<uint32_t> blocks_;          // per row: its block of columns_ counters, or kNoBlock
  std::vector<uint64_t> reads_, writes_;  // blocks, in row order
  uint64_t max_ = 0;
  uint64_t total_ = 0;
};

}  // namespace kwatch::gui
