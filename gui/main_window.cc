#include "gui/main_window.h"

#include <algorithm>

#include <QAction>
#include <QApplication>
#include <QDragEnterEvent>
#include <QDropEvent>
#include <QFileDialog>
#include <QFileInfo>
#include <QFontDatabase>
#include <QHeaderView>
#include <QHelpEvent>
#include <QMenuBar>
#include <QMimeData>
#include <QSettings>
#include <QSignalBlocker>
#include <QSplitter>
#include <QStatusBar>
#include <QStyledItemDelegate>
#include <QTabBar>
#include <QTabWidget>
#include <QToolBar>
#include <QToolTip>
#include <QVBoxLayout>

#include "gui/display_text.h"
#include "gui/exporter.h"

namespace kwatch::gui {

namespace {

constexpr int kMaxRecent = 8;
constexpr int kAggregationsTab = 2;

// Shows the models' tooltips as the plain text they are: Qt renders a tooltip that looks like
// HTML as rich text, and the names in a recording are anybody's ("<img src=...>").
class PlainToolTipDelegate : public QStyledItemDelegate {
 public:
  using QStyledItemDelegate::QStyledItemDelegate;

  bool helpEvent(QHelpEvent* event, QAbstractItemView* view, const QStyleOptionViewItem& option,
                 const QModelIndex& index) override {
    if (event->type() != QEvent::ToolTip || !index.isValid()) {
      return QStyledItemDelegate::helpEvent(event, view, option, index);
    }
    const QString tip = index.data(Qt::ToolTipRole).toString();
    if (tip.isEmpty()) {
      QToolTip::hideText();
    } else {
      QToolTip::showText(event->globalPos(), RichTextSafe(tip), view, option.rect);
    }
    return true;
  }
};

QTableView* MakeTable(QAbstractItemModel* model, QWidget* parent) {
  auto* view = new QTableView(parent);
  view->setModel(model);
  view->setItemDelegate(new PlainToolTipDelegate(view));
  view->setSelectionBehavior(QAbstractItemView::SelectRows);
  view->setSelectionMode(QAbstractItemView::SingleSelection);
  view->verticalHeader()->hide();
  view->verticalHeader()->setDefaultSectionSize(22);
  view->horizontalHeader()->setStretchLastSection(true);
  view->setAlternatingRowColors(true);
  view->setWordWrap(false);
  return view;
}

QPlainTextEdit* MakeText(QWidget* parent) {
  auto* text = new QPlainTextEdit(parent);
  text->setReadOnly(true);
  text->setFont(QFontDatabase::systemFont(QFontDatabase::FixedFont));
  text->setLineWrapMode(QPlainTextEdit::NoWrap);
  return text;
}

}  // namespace

MainWindow::MainWindow(SessionModel* session, QWidget* parent)
    : QMainWindow(parent), session_(session) {
  setWindowTitle(QStringLiteral("kwatch-gui"));
  setAcceptDrops(true);

  heatmap_ = new HeatmapWidget(this);
  heatmap_->SetModel(session_->heatmap());
  charts_ = new ChartsWidget(this);
  charts_->SetModels(session_->timeline(), session_->sites(), session_->threads());

  tree_ = new QTreeView(this);
  tree_->setModel(session_->fields());
  tree_->setItemDelegate(new PlainToolTipDelegate(tree_));
  tree_->setUniformRowHeights(true);
  tree_->setAlternatingRowColors(true);
  tree_->setMinimumWidth(340);
  tree_->header()->setStretchLastSection(false);

  sites_view_ = MakeTable(session_->sites(), this);
  source_view_ = MakeText(this);
  lines_view_ = MakeTable(session_->cache_lines(), this);
  evidence_view_ = MakeText(this);

  auto* sites_split = new QSplitter(Qt::Horizontal, this);
  sites_split->addWidget(sites_view_);
  sites_split->addWidget(source_view_);
  sites_split->setStretchFactor(0, 3);
  sites_split->setStretchFactor(1, 2);
  auto* lines_split = new QSplitter(Qt::Horizontal, this);
  lines_split->addWidget(lines_view_);
  lines_split->addWidget(evidence_view_);
  lines_split->setStretchFactor(0, 3);
  lines_split->setStretchFactor(1, 2);
  tabs_ = new QTabWidget(this);
  tabs_->addTab(sites_split, tr("Sites"));
  tabs_->addTab(lines_split, tr("Cache lines"));
  aggregates_ = new AggregatesWidget(this);
  aggregates_->SetModels(session_->histograms(), session_->scalar_aggregates());
  aggregates_->scalar_view()->setItemDelegate(new PlainToolTipDelegate(aggregates_->scalar_view()));
  tabs_->addTab(aggregates_, tr("Aggregations"));

  right_split_ = new QSplitter(Qt::Vertical, this);
  right_split_->addWidget(heatmap_);
  right_split_->addWidget(charts_);
  right_split_->addWidget(tabs_);
  right_split_->setStretchFactor(0, 5);
  right_split_->setStretchFactor(1, 3);
  right_split_->setStretchFactor(2, 3);

  main_split_ = new QSplitter(Qt::Horizontal, this);
  main_split_->addWidget(tree_);
  main_split_->addWidget(right_split_);
  main_split_->setStretchFactor(0, 1);
  main_split_->setStretchFactor(1, 4);

  banner_ = new QLabel(this);
  banner_->setTextFormat(Qt::PlainText);  // it quotes paths and messages: never rich text
  banner_->setWordWrap(true);
  banner_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  banner_->setMargin(6);
  banner_->hide();

  auto* central = new QWidget(this);
  auto* layout = new QVBoxLayout(central);
  layout->setContentsMargins(4, 4, 4, 4);
  layout->setSpacing(4);
  layout->addWidget(banner_);
  layout->addWidget(main_split_, 1);
  setCentralWidget(central);

  status_ = new QLabel(this);
  status_->setTextFormat(Qt::PlainText);
  statusBar()->addWidget(status_, 1);
  status_->setText(session_->Summary());

  BuildMenus();
  BuildToolBar();

  connect(session_, &SessionModel::Loaded, this, &MainWindow::OnLoaded);
  connect(session_, &SessionModel::LoadFailed, this, &MainWindow::OnLoadFailed);
  connect(session_, &SessionModel::SelectionChanged, this, &MainWindow::OnSelectionChanged);
  connect(session_, &SessionModel::LoadStarted, this,
          [this](const QString& path) { status_->setText(tr("Loading %1…").arg(path)); });
  connect(session_, &SessionModel::FollowStatus, this, [this](const QString& message) {
    status_->setText(session_->Summary() + QStringLiteral("   ·   ") + message);
  });
  connect(session_, &SessionModel::DetailLoaded, this, [this] {
    sites_view_->resizeColumnsToContents();
    lines_view_->resizeColumnsToContents();
    if (session_->sites()->rowCount() > 0) {
      sites_view_->selectRow(0);
    } else {
      source_view_->clear();
    }
    int finding = -1;
    for (int r = 0; r < session_->cache_lines()->rowCount() && finding < 0; ++r) {
      if (session_->cache_lines()
              ->data(session_->cache_lines()->index(r, 0), CacheLineModel::kFalseSharingRole)
              .toBool()) {
        finding = r;
      }
    }
    if (session_->cache_lines()->rowCount() > 0) {
      lines_view_->selectRow(std::max(finding, 0));
    } else {
      evidence_view_->clear();
    }
    // The tab says when there is false sharing to look at.
    const int findings = session_->cache_lines()->findings();
    tabs_->setTabText(1, findings > 0 ? tr("Cache lines (%n false sharing)", nullptr, findings)
                                      : tr("Cache lines"));
    tabs_->tabBar()->setTabTextColor(
        1, findings > 0 ? QColor(180, 0, 0) : palette().color(QPalette::WindowText));
  });
  connect(heatmap_, &HeatmapWidget::SelectionMade, this, &MainWindow::OnHeatmapSelection);
  // Zoomed in: the window's own grid, from the recording's finer bins.
  connect(heatmap_, &HeatmapWidget::TimeViewRequested, session_,
          [this](std::optional<std::pair<uint64_t, uint64_t>> range) {
            session_->SetViewRange(range);
          });
  connect(heatmap_, &HeatmapWidget::SelectionCleared, session_, &SessionModel::ClearSelection);
  connect(tree_, &QTreeView::clicked, this, &MainWindow::OnTreeClicked);
  connect(sites_view_->selectionModel(), &QItemSelectionModel::currentRowChanged, this,
          &MainWindow::OnSiteChanged);
  connect(lines_view_->selectionModel(), &QItemSelectionModel::currentRowChanged, this,
          &MainWindow::OnLineChanged);
}

void MainWindow::BuildMenus() {
  QMenu* file = menuBar()->addMenu(tr("&File"));
  QAction* open = file->addAction(tr("&Open…"), this, &MainWindow::OpenDialog);
  open->setShortcut(QKeySequence::Open);
  recent_menu_ = file->addMenu(tr("Open &recent"));
  RebuildRecentMenu();
  file->addSeparator();
  file->addAction(tr("&Export window as PNG/SVG…"), this, [this] { ExportDialog(false); })
      ->setShortcut(QKeySequence(Qt::CTRL | Qt::Key_E));
  file->addAction(tr("Export &heatmap as PNG/SVG…"), this, [this] { ExportDialog(true); });
  file->addSeparator();
  file->addAction(tr("&Quit"), this, &QWidget::close)->setShortcut(QKeySequence::Quit);
  QMenu* view = menuBar()->addMenu(tr("&View"));
  view->addAction(tr("&Clear selection"), session_, &SessionModel::ClearSelection);
  view->addAction(tr("&Reset time zoom"), heatmap_, &HeatmapWidget::ResetTimeView);
  view->addAction(tr("Zoom time &in"), this, [this] {
    heatmap_->ZoomTime(1.5, (heatmap_->view_first() + heatmap_->view_last()) / 2);
  });
  view->addAction(tr("Zoom time &out"), this, [this] {
    heatmap_->ZoomTime(1 / 1.5, (heatmap_->view_first() + heatmap_->view_last()) / 2);
  });
  view->addSeparator();
  follow_action_ = view->addAction(tr("&Follow the recording"));
  follow_action_->setCheckable(true);
  follow_action_->setShortcut(QKeySequence(Qt::CTRL | Qt::Key_F));
  follow_action_->setToolTip(
      tr("Read what kwatch adds to the recording as it is written (only the new events)"));
  connect(follow_action_, &QAction::toggled, session_, &SessionModel::SetFollow);
  connect(session_, &SessionModel::FollowChanged, follow_action_, [this](bool on) {
    const QSignalBlocker block(follow_action_);
    follow_action_->setChecked(on);
  });
}

void MainWindow::BuildToolBar() {
  QToolBar* bar = addToolBar(tr("View"));
  bar->setMovable(false);
  bar->addAction(tr("Open…"), this, &MainWindow::OpenDialog);
  bar->addAction(tr("Export…"), this, [this] { ExportDialog(false); });
  bar->addSeparator();
  bar->addWidget(new QLabel(tr(" Watch "), bar));
  object_combo_ = new QComboBox(bar);
  object_combo_->setMinimumContentsLength(16);
  object_combo_->setSizeAdjustPolicy(QComboBox::AdjustToContents);
  bar->addWidget(object_combo_);
  bar->addWidget(new QLabel(tr("  Show "), bar));
  mode_combo_ = new QComboBox(bar);
  mode_combo_->addItem(tr("reads + writes"), static_cast<int>(AccessMode::kBoth));
  mode_combo_->addItem(tr("reads"), static_cast<int>(AccessMode::kReads));
  mode_combo_->addItem(tr("writes"), static_cast<int>(AccessMode::kWrites));
  bar->addWidget(mode_combo_);
  bar->addWidget(new QLabel(tr("  Scale "), bar));
  scale_combo_ = new QComboBox(bar);
  scale_combo_->addItem(tr("linear"), static_cast<int>(Scale::kLinear));
  scale_combo_->addItem(tr("log"), static_cast<int>(Scale::kLog));
  bar->addWidget(scale_combo_);
  bar->addWidget(new QLabel(tr("  Thread "), bar));
  thread_combo_ = new QComboBox(bar);
  thread_combo_->setSizeAdjustPolicy(QComboBox::AdjustToContents);
  thread_combo_->addItem(tr("all threads"), -1);
  bar->addWidget(thread_combo_);
  bar->addSeparator();
  bar->addAction(tr("Clear selection"), session_, &SessionModel::ClearSelection);
  bar->addAction(tr("Reset zoom"), heatmap_, &HeatmapWidget::ResetTimeView);
  bar->addAction(follow_action_);

  connect(object_combo_, &QComboBox::activated, this,
          [this](int i) { session_->SetObject(static_cast<uint32_t>(std::max(i, 0))); });
  connect(mode_combo_, &QComboBox::currentIndexChanged, this, [this](int i) {
    session_->SetMode(static_cast<AccessMode>(mode_combo_->itemData(i).toInt()));
  });
  connect(scale_combo_, &QComboBox::currentIndexChanged, this, [this](int i) {
    session_->SetScale(static_cast<Scale>(scale_combo_->itemData(i).toInt()));
  });
  connect(thread_combo_, &QComboBox::currentIndexChanged, this, [this](int i) {
    const int tid = thread_combo_->itemData(i).toInt();
    session_->SetThreadFilter(tid < 0 ? std::nullopt : std::optional<pid_t>(tid));
  });
}

void MainWindow::OnLoaded() {
  const SnapshotPtr& snap = session_->main_snapshot();
  const watch::profile::StorageProfile& p = *snap->profile;
  setWindowTitle(tr("kwatch-gui — %1").arg(QFileInfo(session_->path()).fileName()));
  RememberRecent(session_->path());
  {
    const QSignalBlocker block(object_combo_);
    object_combo_->clear();
    for (const watch::profile::WatchedObject& o : p.objects()) {
      object_combo_->addItem(DisplayText(o.expr));
    }
    object_combo_->setCurrentIndex(static_cast<int>(session_->selection().object));
  }
  {
    const QSignalBlocker block(thread_combo_);
    thread_combo_->clear();
    thread_combo_->addItem(tr("all threads"), -1);
    for (const auto& [tid, n] : session_->Threads()) {
      thread_combo_->addItem(tr("%1  (%2 accesses)").arg(tid).arg(n), tid);
    }
    const auto& tid = session_->selection().tid;
    const int i = tid.has_value() ? thread_combo_->findData(*tid) : 0;
    thread_combo_->setCurrentIndex(std::max(i, 0));
  }
  // Expand the tree unless it holds thousands of fields.
  if (p.fields().size() <= 512) {
    tree_->expandAll();
  } else {
    tree_->expand(session_->fields()->ObjectIndex(session_->selection().object));
  }
  for (int c = 0; c < FieldTreeModel::kColumnCount; ++c) {
    tree_->resizeColumnToContents(c);
  }
  const bool aggregations = !snap->aggregates.empty();
  tabs_->setTabText(kAggregationsTab, aggregations
                                          ? tr("Aggregations (%1)").arg(snap->aggregates.size())
                                          : tr("Aggregations"));
  if (aggregations && p.objects().empty()) {
    tabs_->setCurrentIndex(kAggregationsTab);
  }
  FitPanes();
  status_->setText(session_->Summary());
  if (p.objects().empty() && aggregations) {
    ShowBanner(tr("%1 has no watched memory: it is a probe recording; its aggregations are in the "
                  "Aggregations tab (hits: `kwatch report %1`).")
                   .arg(session_->path()),
               false);
  } else if (p.objects().empty()) {
    ShowBanner(tr("%1 has no watched memory: it is a probe recording (see `kwatch report %1`).")
                   .arg(session_->path()),
               false);
  } else if (p.events() == 0) {
    ShowBanner(tr("%1 holds no events: the target never touched the watched bytes while kwatch "
                  "was recording.")
                   .arg(session_->path()),
               false);
  } else if (!snap->complete && !session_->following()) {
    ShowBanner(tr("%1 was cut short (kwatch stopped before finishing it); it shows every batch "
                  "committed before that.")
                   .arg(session_->path()),
               false);
  } else {
    banner_->hide();
  }
}

void MainWindow::FitPanes() {
  int tree_w = 2 * tree_->frameWidth() + 24;
  for (int c = 0; c < FieldTreeModel::kColumnCount; ++c) {
    tree_w += tree_->columnWidth(c);
  }
  const int total_w = main_split_->width();
  tree_w =
      std::clamp(tree_w, tree_->minimumWidth(), std::max(tree_->minimumWidth(), total_w * 2 / 5));
  main_split_->setSizes({tree_w, std::max(0, total_w - tree_w)});
  const int total_h = right_split_->height();
  if (session_->main_snapshot() && session_->main_snapshot()->profile->objects().empty() &&
      !session_->main_snapshot()->aggregates.empty()) {
    // A probe recording: no heatmap or access charts to show, the aggregations take the room.
    right_split_->setSizes({0, 0, total_h});
    return;
  }
  const int heat_h = std::clamp(heatmap_->PreferredHeight(), 220, std::max(220, total_h * 11 / 20));
  const int charts_h = (total_h - heat_h) / 2;
  right_split_->setSizes({heat_h, charts_h, std::max(0, total_h - heat_h - charts_h)});
}

void MainWindow::OnLoadFailed(const QString& message) {
  ShowBanner(tr("Cannot open the recording: %1").arg(message), true);
  status_->setText(session_->Summary());
}

void MainWindow::ShowBanner(const QString& text, bool error) {
  banner_->setText(text);
  banner_->setStyleSheet(error ? QStringLiteral("background:#f8d0cc; color:#6b0000;")
                               : QStringLiteral("background:#fff2c2; color:#4a3b00;"));
  banner_->show();
}

void MainWindow::OnSelectionChanged() {
  const Selection& sel = session_->selection();
  HeatmapModel* m = session_->heatmap();
  std::optional<std::pair<uint64_t, uint64_t>> time;
  if (sel.has_time_range()) {
    time = std::make_pair(sel.from_ns.value_or(0),
                          sel.to_ns.value_or(m->ColumnStartNs(m->columnCount())));
  }
  if (sel.fields.empty()) {
    if (time.has_value()) {
      heatmap_->ShowSelection(0, m->rowCount() - 1, time);
    } else {
      heatmap_->ShowNoSelection();
    }
  } else {
    int r0 = m->rowCount();
    int r1 = -1;
    for (uint32_t f : sel.fields) {
      const int r = m->RowOf(f);
      if (r >= 0) {
        r0 = std::min(r0, r);
        r1 = std::max(r1, r);
      }
    }
    if (r1 >= 0) {
      heatmap_->ShowSelection(r0, r1, time);
    }
  }
  if (object_combo_->currentIndex() != static_cast<int>(sel.object)) {
    const QSignalBlocker block(object_combo_);
    object_combo_->setCurrentIndex(static_cast<int>(sel.object));
  }
}

void MainWindow::OnHeatmapSelection(int row0, int row1,
                                    std::optional<std::pair<int, int>> columns) {
  HeatmapModel* m = session_->heatmap();
  std::vector<uint32_t> fields;
  for (int r = row0; r <= row1; ++r) {
    fields.push_back(m->FieldAt(r));
  }
  session_->SetFieldSelection(std::move(fields));
  if (columns.has_value()) {
    session_->SetTimeSelection(m->ColumnStartNs(columns->first),
                               m->ColumnStartNs(columns->second + 1));
  } else {
    session_->SetTimeSelection(std::nullopt, std::nullopt);
  }
}

void MainWindow::OnTreeClicked(const QModelIndex& index) {
  const uint32_t obj = index.data(FieldTreeModel::kObjectRole).toUInt();
  const int field = index.data(FieldTreeModel::kFieldRole).toInt();
  if (obj != session_->selection().object) {
    session_->SetObject(obj);
  }
  if (field >= 0) {
    session_->SetFieldSelection({static_cast<uint32_t>(field)});
  } else {
    session_->ClearSelection();
  }
}

void MainWindow::OnSiteChanged(const QModelIndex& current) {
  source_view_->setPlainText(
      current.isValid() ? current.siblingAtColumn(0).data(SiteTableModel::kSourceRole).toString()
                        : QString());
}

void MainWindow::OnLineChanged(const QModelIndex& current) {
  evidence_view_->setPlainText(
      current.isValid() ? current.siblingAtColumn(0).data(CacheLineModel::kEvidenceRole).toString()
                        : QString());
}

absl::Status MainWindow::ExportWindow(const QString& path) {
  return ExportWidget(this, path);
}

absl::Status MainWindow::ExportHeatmap(const QString& path) {
  return ExportWidget(heatmap_, path);
}

void MainWindow::OpenDialog() {
  const QString path = QFileDialog::getOpenFileName(
      this, tr("Open a kwatch recording"), QFileInfo(session_->path()).absolutePath(),
      tr("kwatch recordings (*.kwdb);;All files (*)"));
  if (!path.isEmpty()) {
    Open(path);
  }
}

void MainWindow::ExportDialog(bool heatmap_only) {
  const QString base = QFileInfo(session_->path()).completeBaseName();
  const QString path = QFileDialog::getSaveFileName(
      this, heatmap_only ? tr("Export the heatmap") : tr("Export the window"),
      base.isEmpty() ? QStringLiteral("kwatch.png") : base + QStringLiteral(".png"),
      tr("PNG image (*.png);;SVG drawing (*.svg)"));
  if (path.isEmpty()) {
    return;
  }
  const absl::Status s = heatmap_only ? ExportHeatmap(path) : ExportWindow(path);
  if (!s.ok()) {
    ShowBanner(QString::fromStdString(std::string{s.message()}), true);
  } else {
    statusBar()->showMessage(tr("Wrote %1").arg(path), 5000);
  }
}

void MainWindow::Open(const QString& path) {
  session_->Open(path, session_->following());
}

void MainWindow::RememberRecent(const QString& path) {
  QSettings settings;
  QStringList recent = settings.value(QStringLiteral("recent")).toStringList();
  const QString abs = QFileInfo(path).absoluteFilePath();
  recent.removeAll(abs);
  recent.prepend(abs);
  while (recent.size() > kMaxRecent) {
    recent.removeLast();
  }
  settings.setValue(QStringLiteral("recent"), recent);
  RebuildRecentMenu();
}

void MainWindow::RebuildRecentMenu() {
  recent_menu_->clear();
  const QStringList recent = QSettings().value(QStringLiteral("recent")).toStringList();
  for (const QString& path : recent) {
    recent_menu_->addAction(path, this, [this, path] { Open(path); });
  }
  recent_menu_->setEnabled(!recent.isEmpty());
}

void MainWindow::dragEnterEvent(QDragEnterEvent* event) {
  if (event->mimeData()->hasUrls() && !event->mimeData()->urls().isEmpty() &&
      event->mimeData()->urls().first().isLocalFile()) {
    event->acceptProposedAction();
  }
}

void MainWindow::dropEvent(QDropEvent* event) {
  const QList<QUrl> urls = event->mimeData()->urls();
  if (!urls.isEmpty() && urls.first().isLocalFile()) {
    Open(urls.first().toLocalFile());
    event->acceptProposedAction();
  }
}

}  // namespace kwatch::gui
