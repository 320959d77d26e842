#include "gui/heatmap_widget.h"

#include <algorithm>
#include <array>
#include <cmath>

#include <QFontMetrics>
#include <QHelpEvent>
#include <QKeyEvent>
#include <QLinearGradient>
#include <QMouseEvent>
#include <QPainter>
#include <QScrollBar>
#include <QToolTip>
#include <QWheelEvent>

#include "gui/display_text.h"
#include "gui/time_axis.h"
#include "watch/profile/duration.h"

namespace kwatch::gui {

namespace {

constexpr int kTitleH = 24;
constexpr int kAxisH = 40;
constexpr int kLegendW = 96;
constexpr int kMinRowH = 6;
constexpr int kMaxRowH = 40;
constexpr int kMaxLabelW = 300;
constexpr int kMinColumns = 4;  // deepest zoom

const std::array<QColor, 2> kLineShade = {QColor(250, 250, 252), QColor(226, 234, 246)};
const QColor kSelectColor(20, 90, 200);

QString ModeText(AccessMode m) {
  switch (m) {
    case AccessMode::kBoth:
      return QStringLiteral("reads + writes");
    case AccessMode::kReads:
      return QStringLiteral("reads");
    case AccessMode::kWrites:
      return QStringLiteral("writes");
  }
  return {};
}

}  // namespace

HeatmapWidget::HeatmapWidget(QWidget* parent) : QAbstractScrollArea(parent) {
  setHorizontalScrollBarPolicy(Qt::ScrollBarAlwaysOff);
  setVerticalScrollBarPolicy(Qt::ScrollBarAsNeeded);
  viewport()->setMouseTracking(true);
  setFocusPolicy(Qt::StrongFocus);
  setFrameShape(QFrame::NoFrame);
  viewport()->setBackgroundRole(QPalette::Base);
}

void HeatmapWidget::SetModel(HeatmapModel* model) {
  if (model_ != nullptr) {
    disconnect(model_, nullptr, this, nullptr);
  }
  model_ = model;
  if (model_ != nullptr) {
    connect(model_, &QAbstractItemModel::modelReset, this, &HeatmapWidget::OnModelReset);
    connect(model_, &QAbstractItemModel::dataChanged, viewport(), [this] { viewport()->update(); });
  }
  OnModelReset();
}

void HeatmapWidget::OnModelReset() {
  const int columns = model_ == nullptr ? 0 : model_->columnCount();
  // A zoom grid is the requested window: all of its columns are shown.
  if (whole_view_ || view_last_ > columns || (model_ != nullptr && model_->zoom() != nullptr)) {
    view_first_ = 0;
    view_last_ = columns;
    whole_view_ = true;
  }
  const int rows = model_ == nullptr ? 0 : model_->rowCount();
  if (sel_row1_ >= rows) {
    sel_row0_ = sel_row1_ = -1;
    sel_ns_.reset();
  }
  UpdateScrollBars();
  viewport()->update();
}

int HeatmapWidget::PreferredHeight() const {
  const int rows = model_ == nullptr ? 0 : model_->rowCount();
  return kTitleH + kAxisH + std::max(rows, 4) * kMaxRowH + 2 * frameWidth() +
         (horizontalScrollBar()->isVisible() ? horizontalScrollBar()->height() : 0);
}

void HeatmapWidget::SetTimeView(int first, int last) {
  const int columns = model_ == nullptr ? 0 : model_->columnCount();
  if (columns == 0) {
    return;
  }
  const int span = std::clamp(last - first, std::min(kMinColumns, columns), columns);
  first = std::clamp(first, 0, columns - span);
  view_first_ = first;
  view_last_ = first + span;
  whole_view_ = view_first_ == 0 && view_last_ == columns;
  viewport()->update();
}

void HeatmapWidget::ResetTimeView() {
  whole_view_ = true;
  Q_EMIT TimeViewRequested(std::nullopt);
  OnModelReset();
}

void HeatmapWidget::RequestView(int64_t from_ns, int64_t to_ns) {
  const Snapshot* snap = model_ == nullptr ? nullptr : model_->snapshot();
  const auto total = static_cast<int64_t>(snap == nullptr ? 0 : snap->SpanNs());
  if (total <= 0) {
    return;
  }
  constexpr int64_t kMinSpanNs = 1000;
  const int64_t span = std::clamp<int64_t>(to_ns - from_ns, kMinSpanNs, total);
  from_ns = std::clamp<int64_t>(from_ns, 0, total - span);
  if (span == total) {
    Q_EMIT TimeViewRequested(std::nullopt);
    return;
  }
  Q_EMIT TimeViewRequested(
      std::make_pair(static_cast<uint64_t>(from_ns), static_cast<uint64_t>(from_ns + span)));
}

void HeatmapWidget::ZoomTime(double factor, int anchor_column) {
  const int span = view_last_ - view_first_;
  if (span <= 0 || factor <= 0 || model_ == nullptr) {
    return;
  }
  // In time: the window to ask the model for, at its own resolution.
  const auto v0 = static_cast<double>(model_->ColumnStartNs(view_first_));
  const auto v1 = static_cast<double>(model_->ColumnStartNs(view_last_));
  const auto anchor_ns = static_cast<double>(model_->ColumnStartNs(anchor_column));
  const double new_ns = (v1 - v0) / factor;
  const double from = anchor_ns - (anchor_ns - v0) / (v1 - v0) * new_ns;
  // In columns: the magnified view until the grid arrives.
  const int new_span = std::max(1, static_cast<int>(std::lround(span / factor)));
  const double rel = static_cast<double>(anchor_column - view_first_) / span;
  const int first = anchor_column - static_cast<int>(std::lround(rel * new_span));
  SetTimeView(first, first + new_span);
  RequestView(std::llround(from), std::llround(from + new_ns));
}

void HeatmapWidget::PanTime(int columns) {
  const int64_t shift = static_cast<int64_t>(columns) *
                        static_cast<int64_t>(model_ == nullptr ? 0 : model_->bucket_ns());
  const int64_t from =
      model_ == nullptr ? 0 : static_cast<int64_t>(model_->ColumnStartNs(view_first_)) + shift;
  const int64_t to =
      model_ == nullptr ? 0 : static_cast<int64_t>(model_->ColumnStartNs(view_last_)) + shift;
  SetTimeView(view_first_ + columns, view_last_ + columns);
  if (model_ != nullptr && (model_->zoom() != nullptr || !whole_view_)) {
    RequestView(from, to);
  }
}

void HeatmapWidget::ShowSelection(int row0, int row1,
                                  std::optional<std::pair<uint64_t, uint64_t>> time_ns) {
  sel_row0_ = std::min(row0, row1);
  sel_row1_ = std::max(row0, row1);
  sel_ns_ = time_ns;
  viewport()->update();
}

void HeatmapWidget::ShowNoSelection() {
  sel_row0_ = sel_row1_ = -1;
  sel_ns_.reset();
  viewport()->update();
}

HeatmapWidget::Geometry HeatmapWidget::Layout() const {
  Geometry g;
  const QRect all = viewport()->rect();
  const QFontMetrics fm(font());
  int label_w = 80;
  if (model_ != nullptr) {
    // Measure a bounded sample of labels (thousands of rows must not cost a full scan).
    const int rows = model_->rowCount();
    const int step = std::max(1, rows / 256);
    for (int r = 0; r < rows; r += step) {
      label_w = std::max(label_w, fm.horizontalAdvance(model_->RowLabel(r)) + 18);
    }
  }
  label_w = std::min(label_w, kMaxLabelW);
  g.title = QRect(all.left(), all.top(), all.width(), kTitleH);
  const int body_top = g.title.bottom() + 1;
  const int body_h = std::max(0, all.height() - kTitleH - kAxisH);
  g.labels = QRect(all.left(), body_top, label_w, body_h);
  g.legend = QRect(all.right() - kLegendW + 1, body_top, kLegendW, body_h);
  g.plot = QRect(g.labels.right() + 1, body_top, std::max(0, all.width() - label_w - kLegendW - 8),
                 body_h);
  g.axis = QRect(g.plot.left(), g.plot.bottom() + 1, g.plot.width(), kAxisH);
  const int rows = model_ == nullptr ? 0 : model_->rowCount();
  if (rows > 0 && body_h > 0) {
    g.row_h = std::clamp(body_h / rows, kMinRowH, kMaxRowH);
    g.visible_rows = std::min(rows, std::max(1, body_h / g.row_h));
    g.first_row = std::clamp(verticalScrollBar()->value(), 0, rows - g.visible_rows);
    // Rows that fit leave the plot no taller than they are.
    g.plot.setHeight(g.visible_rows * g.row_h);
    g.labels.setHeight(g.plot.height());
    g.axis.moveTop(g.plot.bottom() + 1);
  }
  const int span = view_last_ - view_first_;
  g.col_w = span > 0 ? static_cast<double>(g.plot.width()) / span : 0;
  return g;
}

void HeatmapWidget::UpdateScrollBars() {
  const int rows = model_ == nullptr ? 0 : model_->rowCount();
  const int body_h = std::max(0, viewport()->height() - kTitleH - kAxisH);
  const int row_h = rows > 0 ? std::clamp(body_h / std::max(rows, 1), kMinRowH, kMaxRowH) : 1;
  const int visible = std::max(1, body_h / row_h);
  verticalScrollBar()->setRange(0, std::max(0, rows - visible));
  verticalScrollBar()->setPageStep(visible);
  verticalScrollBar()->setSingleStep(1);
}

void HeatmapWidget::resizeEvent(QResizeEvent* event) {
  QAbstractScrollArea::resizeEvent(event);
  UpdateScrollBars();
}

void HeatmapWidget::scrollContentsBy(int /*dx*/, int /*dy*/) {
  viewport()->update();
}

int HeatmapWidget::ColumnX(const Geometry& g, int column) const {
  return g.plot.left() + static_cast<int>(std::lround((column - view_first_) * g.col_w));
}

QRect HeatmapWidget::CellRect(int row, int column) const {
  const Geometry g = Layout();
  if (model_ == nullptr || row < g.first_row || row >= g.first_row + g.visible_rows ||
      column < view_first_ || column >= view_last_) {
    return {};
  }
  const int x0 = ColumnX(g, column);
  const int x1 = ColumnX(g, column + 1);
  return {x0, g.plot.top() + (row - g.first_row) * g.row_h, std::max(1, x1 - x0), g.row_h};
}

std::pair<int, int> HeatmapWidget::CellAt(QPoint p) const {
  const Geometry g = Layout();
  if (model_ == nullptr || !g.plot.contains(p) || g.row_h == 0 || g.col_w <= 0) {
    return {-1, -1};
  }
  const int row = g.first_row + (p.y() - g.plot.top()) / g.row_h;
  const int col = view_first_ + static_cast<int>((p.x() - g.plot.left()) / g.col_w);
  if (row >= model_->rowCount() || col >= view_last_) {
    return {-1, -1};
  }
  return {row, col};
}

std::optional<std::pair<int, int>> HeatmapWidget::SelectedColumns() const {
  if (!sel_ns_.has_value() || model_ == nullptr || model_->bucket_ns() == 0) {
    return std::nullopt;
  }
  const uint64_t origin = model_->ColumnStartNs(0);
  const uint64_t w = model_->bucket_ns();
  const auto col = [&](uint64_t ns) {
    return static_cast<int>(ns <= origin ? 0 : (ns - origin) / w);
  };
  const int c0 = col(sel_ns_->first);
  const int c1 = sel_ns_->second == 0 ? c0 : col(sel_ns_->second - 1);
  return std::make_pair(c0, std::max(c0, c1));
}

void HeatmapWidget::PaintMessage(QPainter& p, const QString& text) const {
  p.setPen(palette().color(QPalette::PlaceholderText));
  p.drawText(viewport()->rect().adjusted(20, 20, -20, -20), Qt::AlignCenter | Qt::TextWordWrap,
             text);
}

void HeatmapWidget::paintEvent(QPaintEvent* /*event*/) {
  QPainter p(viewport());
  p.fillRect(viewport()->rect(), palette().color(QPalette::Base));
  if (model_ == nullptr || model_->snapshot() == nullptr) {
    PaintMessage(p, tr("Open a recording (File ▸ Open, or drop a .kwdb file here)."));
    return;
  }
  if (model_->rowCount() == 0) {
    PaintMessage(p, tr("This recording has no watched memory (probe recordings have no heatmap)."));
    return;
  }
  const Geometry g = Layout();
  // Title: the object and what the colours count.
  QFont bold = font();
  bold.setBold(true);
  p.setFont(bold);
  p.setPen(palette().color(QPalette::Text));
  const QString title = model_->ObjectTitle();
  p.drawText(g.title.adjusted(6, 0, -6, 0), Qt::AlignLeft | Qt::AlignVCenter, title);
  p.setFont(font());
  QString what =
      QStringLiteral("%1 per %2, %3, %4   ·   %5, shaded by cache line")
          .arg(ModeText(model_->mode()),
               QString::fromStdString(watch::profile::FormatDuration(model_->bucket_ns())),
               model_->scale() == Scale::kLog ? tr("log scale") : tr("linear scale"),
               model_->thread().has_value() ? tr("thread %1").arg(*model_->thread())
                                            : tr("all threads"))
          .arg(model_->rowCount() == 1 ? tr("1 field") : tr("%1 fields").arg(model_->rowCount()));
  if (g.visible_rows < model_->rowCount()) {
    what += tr(" (rows %1–%2 shown)").arg(g.first_row + 1).arg(g.first_row + g.visible_rows);
  }
  p.setPen(palette().color(QPalette::PlaceholderText));
  const int title_w = QFontMetrics(bold).horizontalAdvance(title) + 24;
  const QRect what_rect = g.title.adjusted(title_w, 0, -6, 0);
  p.drawText(what_rect, Qt::AlignRight | Qt::AlignVCenter,
             QFontMetrics(font()).elidedText(what, Qt::ElideLeft, what_rect.width()));

  PaintLabels(p, g);
  if (model_->columnCount() == 0) {
    p.setPen(palette().color(QPalette::PlaceholderText));
    p.drawText(g.plot.adjusted(10, 0, -10, 0), Qt::AlignCenter | Qt::TextWordWrap,
               tr("No events in this recording: the target never touched the watched bytes "
                  "while kwatch was recording."));
    return;
  }
  PaintCells(p, g);
  PaintSelection(p, g);
  PaintAxis(p, g);
  PaintLegend(p, g);
}

void HeatmapWidget::PaintLabels(QPainter& p, const Geometry& g) const {
  // Rows lower than the text get a smaller font and a label every few rows.
  QFont label_font = font();
  if (g.row_h < QFontMetrics(font()).height()) {
    label_font.setPointSizeF(std::max(6.0, font().pointSizeF() * 0.8));
  }
  const QFontMetrics fm(label_font);
  const int every = std::max(1, (fm.height() + g.row_h - 1) / std::max(g.row_h, 1));
  int shade = 0;
  uint64_t prev_line = 0;
  // The shade of the first visible row continues from the rows above it.
  for (int r = 0; r <= g.first_row && r < model_->rowCount(); ++r) {
    if (r > 0 && model_->LineAt(r) != prev_line) {
      shade ^= 1;
    }
    prev_line = model_->LineAt(r);
  }
  p.save();
  p.setClipRect(g.labels.adjusted(0, 0, 0, 0).united(g.plot));
  for (int i = 0; i < g.visible_rows; ++i) {
    const int r = g.first_row + i;
    if (i > 0 && model_->LineAt(r) != prev_line) {
      shade ^= 1;
    }
    prev_line = model_->LineAt(r);
    const QRect band(g.labels.left(), g.plot.top() + i * g.row_h, g.labels.width(), g.row_h);
    const bool selected = r >= sel_row0_ && r <= sel_row1_;
    p.fillRect(band, selected ? QColor(200, 220, 255) : kLineShade[shade]);
  }
  p.setClipRect(g.labels);
  for (int i = 0; i < g.visible_rows; ++i) {
    const int r = g.first_row + i;
    if (i % every != 0) {
      continue;
    }
    const bool selected = r >= sel_row0_ && r <= sel_row1_;
    QFont f = label_font;
    f.setBold(selected);
    p.setFont(f);
    p.setPen(palette().color(QPalette::Text));
    const int top = g.plot.top() + i * g.row_h;
    // Centred on its row when the row is tall enough, else starting at its top.
    const QRect text(g.labels.left() + 6,
                     g.row_h >= fm.height() ? top + (g.row_h - fm.height()) / 2 : top,
                     g.labels.width() - 10, fm.height());
    p.drawText(text, Qt::AlignRight | Qt::AlignVCenter,
               fm.elidedText(model_->RowLabel(r), Qt::ElideLeft, text.width()));
  }
  p.restore();
  // Separators between cache lines, across the labels.
  p.setPen(QColor(120, 130, 150));
  for (int i = 1; i < g.visible_rows; ++i) {
    const int r = g.first_row + i;
    if (model_->LineAt(r) != model_->LineAt(r - 1)) {
      const int y = g.plot.top() + i * g.row_h;
      p.drawLine(g.labels.left(), y, g.labels.right(), y);
    }
  }
  p.setFont(font());
}

void HeatmapWidget::PaintCells(QPainter& p, const Geometry& g) const {
  const bool gaps = g.col_w >= 6 && g.row_h >= 10;
  for (int i = 0; i < g.visible_rows; ++i) {
    const int r = g.first_row + i;
    const int y = g.plot.top() + i * g.row_h;
    for (int c = view_first_; c < view_last_; ++c) {
      const int x0 = ColumnX(g, c);
      const int x1 = ColumnX(g, c + 1);
      QRect cell(x0, y, std::max(1, x1 - x0), g.row_h);
      if (gaps) {
        cell.adjust(0, 0, -1, -1);
      }
      p.fillRect(cell, model_->CellColor(r, c));
    }
  }
  // Separators between cache lines over the cells.
  p.setPen(QColor(90, 100, 120));
  for (int i = 1; i < g.visible_rows; ++i) {
    const int r = g.first_row + i;
    if (model_->LineAt(r) != model_->LineAt(r - 1)) {
      const int y = g.plot.top() + i * g.row_h;
      p.drawLine(g.plot.left(), y, g.plot.right(), y);
    }
  }
  p.setPen(QColor(160, 160, 160));
  p.drawRect(g.plot.adjusted(0, 0, -1, -1));
}

void HeatmapWidget::PaintSelection(QPainter& p, const Geometry& g) const {
  std::pair<int, int> rows{sel_row0_, sel_row1_};
  std::optional<std::pair<int, int>> cols = SelectedColumns();
  if (drag_ == Drag::kSelect && press_cell_.first >= 0 && drag_cell_.first >= 0) {
    rows = {std::min(press_cell_.first, drag_cell_.first),
            std::max(press_cell_.first, drag_cell_.first)};
    cols = std::make_pair(std::min(press_cell_.second, drag_cell_.second),
                          std::max(press_cell_.second, drag_cell_.second));
  }
  if (rows.first < 0 && !cols.has_value()) {
    return;
  }
  const int r0 = rows.first < 0 ? 0 : rows.first;
  const int r1 = rows.first < 0 ? model_->rowCount() - 1 : rows.second;
  const int c0 = cols.has_value() ? cols->first : 0;
  const int c1 = cols.has_value() ? cols->second : model_->columnCount() - 1;
  const int y0 = g.plot.top() + (std::max(r0, g.first_row) - g.first_row) * g.row_h;
  const int y1 =
      g.plot.top() + (std::min(r1 + 1, g.first_row + g.visible_rows) - g.first_row) * g.row_h;
  if (y1 <= y0) {
    return;
  }
  const int x0 = std::max(ColumnX(g, c0), g.plot.left());
  const int x1 = std::min(ColumnX(g, c1 + 1), g.plot.right() + 1);
  if (x1 <= x0) {
    return;
  }
  // Dim what lies outside the selected time range, then outline the selection.
  if (cols.has_value()) {
    const QColor veil(255, 255, 255, 150);
    p.fillRect(QRect(QPoint(g.plot.left(), g.plot.top()), QPoint(x0 - 1, g.plot.bottom())), veil);
    p.fillRect(QRect(QPoint(x1, g.plot.top()), QPoint(g.plot.right(), g.plot.bottom())), veil);
  }
  QPen pen(kSelectColor, 2);
  p.setPen(pen);
  p.setBrush(Qt::NoBrush);
  p.drawRect(QRect(QPoint(x0, y0), QPoint(x1 - 1, y1 - 1)).adjusted(1, 1, -1, -1));
}

void HeatmapWidget::PaintAxis(QPainter& p, const Geometry& g) const {
  const QFontMetrics fm(font());
  p.setPen(palette().color(QPalette::Text));
  const uint64_t t0 = model_->ColumnStartNs(view_first_);
  const uint64_t t1 = model_->ColumnStartNs(view_last_);
  if (t1 <= t0 || g.plot.width() <= 0) {
    return;
  }
  // Ticks at round times (1, 2 or 5 x 10^k ns), at least ~90 px apart, for any span.
  const double ns_per_px = static_cast<double>(t1 - t0) / g.plot.width();
  for (const uint64_t t : TimeAxisTicks(t0, t1, g.plot.width(), 90).ticks_ns) {
    const int x =
        g.plot.left() + static_cast<int>(std::lround(static_cast<double>(t - t0) / ns_per_px));
    p.drawLine(x, g.axis.top(), x, g.axis.top() + 4);
    const QString label = QString::fromStdString(watch::profile::FormatDuration(t));
    const int w = fm.horizontalAdvance(label);
    p.drawText(QRect(x - w / 2 - 2, g.axis.top() + 5, w + 4, fm.height()), Qt::AlignCenter, label);
  }
  p.setPen(palette().color(QPalette::PlaceholderText));
  p.drawText(QRect(g.axis.left(), g.axis.top() + 5 + fm.height(), g.axis.width(), fm.height()),
             Qt::AlignCenter, tr("time after the start of the recording"));
}

void HeatmapWidget::PaintLegend(QPainter& p, const Geometry& g) const {
  const QFontMetrics fm(font());
  const int bar_h = std::min(g.plot.height() - 2 * fm.height() - 8, 240);
  if (bar_h < 30) {
    return;
  }
  const QRect bar(g.legend.left() + 8, g.plot.top() + fm.height() + 4, 14, bar_h);
  const uint64_t max = model_->max_count();
  const Scale scale = model_->scale();
  // The bar spans the colours in use: from a count of 1 (bottom) to the maximum (top).
  const double p_min = watch::profile::HeatPosition(1, max, scale);
  const auto pos_at = [&](double k) { return p_min + (1.0 - p_min) * k; };
  for (int y = 0; y < bar.height(); ++y) {
    const double pos = pos_at(1.0 - static_cast<double>(y) / (bar.height() - 1));
    p.setPen(HeatRampColor(pos));
    p.drawLine(bar.left(), bar.top() + y, bar.right(), bar.top() + y);
  }
  p.setPen(QColor(120, 120, 120));
  p.drawRect(bar.adjusted(0, 0, -1, -1));
  p.setPen(palette().color(QPalette::Text));
  p.drawText(QRect(g.legend.left(), g.plot.top(), g.legend.width(), fm.height()),
             Qt::AlignLeft | Qt::AlignVCenter, tr("accesses"));
  // Up to five labels, distinct counts only (a small maximum has few).
  uint64_t prev = 0;
  for (int k = 0; k <= 4 && max > 0; ++k) {
    const double pos = pos_at(k / 4.0);
    const uint64_t v = k == 0 ? 1 : watch::profile::HeatCountAt(pos, max, scale);
    if (v <= prev) {
      continue;
    }
    prev = v;
    const int y = bar.bottom() - static_cast<int>(std::lround(k / 4.0 * (bar.height() - 1)));
    p.drawLine(bar.right() + 1, y, bar.right() + 4, y);
    p.drawText(QRect(bar.right() + 7, y - fm.height() / 2, g.legend.width() - 30, fm.height()),
               Qt::AlignLeft | Qt::AlignVCenter, QString::number(v));
  }
  // The empty colour.
  const QRect none(bar.left(), bar.bottom() + 8, bar.width(), 10);
  p.fillRect(none, EmptyHeatColor());
  p.setPen(QColor(120, 120, 120));
  p.drawRect(none.adjusted(0, 0, -1, -1));
  p.setPen(palette().color(QPalette::Text));
  p.drawText(QRect(bar.right() + 7, none.center().y() - fm.height() / 2, 60, fm.height()),
             Qt::AlignLeft | Qt::AlignVCenter, QStringLiteral("0"));
}

void HeatmapWidget::mousePressEvent(QMouseEvent* event) {
  if (model_ == nullptr) {
    return;
  }
  setFocus();
  const QPoint pos = event->position().toPoint();
  const Geometry g = Layout();
  press_pos_ = pos;
  if (event->button() == Qt::RightButton || event->button() == Qt::MiddleButton) {
    drag_ = Drag::kPan;
    pan_origin_first_ = view_first_;
    return;
  }
  if (event->button() != Qt::LeftButton) {
    return;
  }
  if (g.labels.contains(pos) && g.row_h > 0) {
    const int row = g.first_row + (pos.y() - g.plot.top()) / g.row_h;
    if (row < 0 || row >= model_->rowCount()) {
      return;
    }
    int r0 = row;
    if (event->modifiers().testFlag(Qt::ShiftModifier) && sel_row0_ >= 0) {
      r0 = row < sel_row0_ ? sel_row1_ : sel_row0_;
    }
    drag_ = Drag::kLabels;
    press_cell_ = {r0, -1};
    drag_cell_ = {row, -1};
    ShowSelection(r0, row, std::nullopt);
    return;
  }
  const auto cell = CellAt(pos);
  if (cell.first < 0) {
    return;
  }
  drag_ = Drag::kSelect;
  press_cell_ = cell;
  drag_cell_ = cell;
  viewport()->update();
}

void HeatmapWidget::mouseMoveEvent(QMouseEvent* event) {
  const QPoint pos = event->position().toPoint();
  const Geometry g = Layout();
  switch (drag_) {
    case Drag::kPan:
      if (g.col_w > 0) {
        const int delta = static_cast<int>(std::lround((press_pos_.x() - pos.x()) / g.col_w));
        SetTimeView(pan_origin_first_ + delta,
                    pan_origin_first_ + delta + (view_last_ - view_first_));
      }
      return;
    case Drag::kSelect: {
      // Clamp to the plot so that a drag past its edge still selects to the edge.
      const QPoint clamped(std::clamp(pos.x(), g.plot.left(), g.plot.right()),
                           std::clamp(pos.y(), g.plot.top(), g.plot.bottom()));
      const auto cell = CellAt(clamped);
      if (cell.first >= 0 && cell != drag_cell_) {
        drag_cell_ = cell;
        viewport()->update();
      }
      return;
    }
    case Drag::kLabels: {
      if (g.row_h > 0) {
        const int row = std::clamp(g.first_row + (pos.y() - g.plot.top()) / g.row_h, 0,
                                   model_ == nullptr ? 0 : model_->rowCount() - 1);
        drag_cell_ = {row, -1};
        ShowSelection(press_cell_.first, row, std::nullopt);
      }
      return;
    }
    case Drag::kNone:
      return;
  }
}

void HeatmapWidget::mouseReleaseEvent(QMouseEvent* event) {
  const Drag drag = drag_;
  drag_ = Drag::kNone;
  if (drag == Drag::kLabels) {
    Q_EMIT SelectionMade(std::min(press_cell_.first, drag_cell_.first),
                         std::max(press_cell_.first, drag_cell_.first), std::nullopt);
    return;
  }
  if (drag != Drag::kSelect || event->button() != Qt::LeftButton) {
    return;
  }
  const int r0 = std::min(press_cell_.first, drag_cell_.first);
  const int r1 = std::max(press_cell_.first, drag_cell_.first);
  const int c0 = std::min(press_cell_.second, drag_cell_.second);
  const int c1 = std::max(press_cell_.second, drag_cell_.second);
  if (press_cell_ == drag_cell_) {
    // A click: that field, all the time.
    Q_EMIT SelectionMade(r0, r1, std::nullopt);
  } else {
    Q_EMIT SelectionMade(r0, r1, std::make_pair(c0, c1));
  }
  viewport()->update();
}

void HeatmapWidget::mouseDoubleClickEvent(QMouseEvent* /*event*/) {
  ShowNoSelection();
  Q_EMIT SelectionCleared();
}

void HeatmapWidget::wheelEvent(QWheelEvent* event) {
  const Geometry g = Layout();
  const int steps = event->angleDelta().y() / 120;
  if (event->modifiers().testFlag(Qt::ControlModifier)) {
    const auto cell = CellAt(event->position().toPoint());
    const int anchor = cell.second >= 0 ? cell.second : (view_first_ + view_last_) / 2;
    ZoomTime(std::pow(1.25, steps), anchor);
    event->accept();
    return;
  }
  if (event->modifiers().testFlag(Qt::ShiftModifier) || event->angleDelta().x() != 0) {
    const int delta = event->angleDelta().x() != 0 ? -event->angleDelta().x() / 120 : -steps;
    PanTime(delta * std::max(1, (view_last_ - view_first_) / 10));
    event->accept();
    return;
  }
  (void)g;
  QAbstractScrollArea::wheelEvent(event);
}

void HeatmapWidget::keyPressEvent(QKeyEvent* event) {
  const int span = view_last_ - view_first_;
  switch (event->key()) {
    case Qt::Key_Plus:
    case Qt::Key_Equal:
      ZoomTime(1.5, (view_first_ + view_last_) / 2);
      return;
    case Qt::Key_Minus:
      ZoomTime(1 / 1.5, (view_first_ + view_last_) / 2);
      return;
    case Qt::Key_Left:
      PanTime(-std::max(1, span / 10));
      return;
    case Qt::Key_Right:
      PanTime(std::max(1, span / 10));
      return;
    case Qt::Key_Home:
    case Qt::Key_0:
      ResetTimeView();
      return;
    case Qt::Key_Escape:
      ShowNoSelection();
      Q_EMIT SelectionCleared();
      return;
    default:
      QAbstractScrollArea::keyPressEvent(event);
  }
}

bool HeatmapWidget::viewportEvent(QEvent* event) {
  if (event->type() == QEvent::ToolTip && model_ != nullptr) {
    auto* help = static_cast<QHelpEvent*>(event);
    const auto [row, col] = CellAt(help->pos());
    if (row >= 0) {
      // Rich text made from the plain tooltip: names from the recording never render as HTML.
      QToolTip::showText(
          help->globalPos(),
          RichTextSafe(model_->data(model_->index(row, col), Qt::ToolTipRole).toString()),
          viewport(), CellRect(row, col));
    } else {
      const Geometry g = Layout();
      if (g.labels.contains(help->pos()) && g.row_h > 0) {
        const int r = g.first_row + (help->pos().y() - g.plot.top()) / g.row_h;
        if (r >= 0 && r < model_->rowCount()) {
          QToolTip::showText(help->globalPos(),
                             RichTextSafe(tr("%1\ncache line 0x%2")
                                              .arg(model_->headerData(r, Qt::Vertical).toString(),
                                                   QString::number(model_->LineAt(r), 16))),
                             viewport());
          return true;
        }
      }
      QToolTip::hideText();
    }
    return true;
  }
  return QAbstractScrollArea::viewportEvent(event);
}

}  // namespace kwatch::gui
