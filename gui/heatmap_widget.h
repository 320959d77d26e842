#pragma once

#include <cstdint>
#include <optional>
#include <utility>

#include <QAbstractScrollArea>
#include <QPoint>
#include <QRect>

#include "gui/heatmap_model.h"

namespace kwatch::gui {

// Paints a HeatmapModel: field labels (shaded by cache line) on the left, cells in the middle,
// the time axis below, the colour legend on the right. Rows scroll vertically when they do not
// fit; time zooms (Ctrl+wheel, +/-) and pans (Shift+wheel, right-button drag, arrows), Home
// resets. A click selects a field (a click on a label too, Shift extends), a drag selects
// fields x a time range, Escape or a double click clears; hovering shows a cell's exact
// counts. The selection is held in rows and nanoseconds (so it survives a reload with wider
// columns); the widget only reports it (SelectionMade) and shows what it is given.
class HeatmapWidget : public QAbstractScrollArea {
  Q_OBJECT

 public:
  explicit HeatmapWidget(QWidget* parent = nullptr);

  void SetModel(HeatmapModel* model);
  HeatmapModel* model() const { return model_; }

  // Visible time columns [first, last), clamped to the model (at least 1 column).
  void SetTimeView(int first, int last);
  void ResetTimeView();
  int view_first() const { return view_first_; }
  int view_last() const { return view_last_; }
  // Zooms by `factor` (> 1: in) keeping `anchor_column` in place.
  void ZoomTime(double factor, int anchor_column);
  void PanTime(int columns);

  // Shows a selection: rows [row0, row1] and the time range [from_ns, to_ns) (unset: all).
  void ShowSelection(int row0, int row1, std::optional<std::pair<uint64_t, uint64_t>> time_ns);
  void ShowNoSelection();

  // The cell's rectangle in viewport coordinates (empty when scrolled or zoomed out of view).
  QRect CellRect(int row, int column) const;
  // The row and column under a viewport point, or {-1, -1}.
  std::pair<int, int> CellAt(QPoint p) const;

  // The height that shows every row at full size (for the window's initial layout).
  int PreferredHeight() const;

  QSize sizeHint() const override { return {900, 420}; }
  QSize minimumSizeHint() const override { return {320, 160}; }

 Q_SIGNALS:
  // Rows [row0, row1] x columns [col0, col1] (inclusive); no columns: the whole time.
  void SelectionMade(int row0, int row1, std::optional<std::pair<int, int>> columns);
  // The user zoomed or panned to [from, to) ns after the session start (nullopt: the whole
  // recording): the model should get that window's own grid (SessionModel::SetViewRange).
  // Until it does, the widget magnifies the columns it has.
  void TimeViewRequested(std::optional<std::pair<uint64_t, uint64_t>> range_ns);
  void SelectionCleared();

 protected:
  void paintEvent(QPaintEvent* event) override;
  void resizeEvent(QResizeEvent* event) override;
  void mousePressEvent(QMouseEvent* event) override;
  void mouseMoveEvent(QMouseEvent* event) override;
  void mouseReleaseEvent(QMouseEvent* event) override;
  void mouseDoubleClickEvent(QMouseEvent* event) override;
  void wheelEvent(QWheelEvent* event) override;
  void keyPressEvent(QKeyEvent* event) override;
  bool viewportEvent(QEvent* event) override;
  void scrollContentsBy(int dx, int dy) override;

 private:
  struct Geometry {
    QRect title;   // object title and what is counted
    QRect labels;  // field labels (with the cache-line shading)
    QRect plot;    // cells
    QRect axis;    // time axis
    QRect legend;  // colour scale
    int row_h = 0;
    int first_row = 0;  // topmost visible row
    int visible_rows = 0;
    double col_w = 0;
  };
  Geometry Layout() const;
  void UpdateScrollBars();
  void OnModelReset();
  void PaintCells(QPainter& p, const Geometry& g) const;
  void PaintLabels(QPainter& p, const Geometry& g) const;
  void PaintAxis(QPainter& p, const Geometry& g) const;
  void PaintLegend(QPainter& p, const Geometry& g) const;
  void PaintSelection(QPainter& p, const Geometry& g) const;
  void PaintMessage(QPainter& p, const QString& text) const;
  // Columns of the shown time selection, or nullopt.
  std::optional<std::pair<int, int>> SelectedColumns() const;
  int ColumnX(const Geometry& g, int column) const;  // left edge (may lie outside the plot)
  // Asks for [from, to) ns (clamped to the recording), or for the whole when it covers it.
  void RequestView(int64_t from_ns, int64_t to_ns);

  HeatmapModel* model_ = nullptr;
  int view_first_ = 0;
  int view_last_ = 0;
  bool whole_view_ = true;  // the view covers every column (and keeps doing so on reloads)
  // Shown selection.
  int sel_row0_ = -1;
  int sel_row1_ = -1;
  std::optional<std::pair<uint64_t, uint64_t>> sel_ns_;
  // Mouse gestures.
  enum class Drag : uint8_t { kNone, kSelect, kLabels, kPan };
  Drag drag_ = Drag::kNone;
  QPoint press_pos_;
  std::pair<int, int> press_cell_{-1, -1};
  std::pair<int, int> drag_cell_{-1, -1};
  int pan_origin_first_ = 0;
};

}  // namespace kwatch::gui
