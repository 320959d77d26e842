#pragma once

#include <QComboBox>
#include <QLabel>
#include <QMainWindow>
#include <QMenu>
#include <QPlainTextEdit>
#include <QSplitter>
#include <QTabWidget>
#include <QTableView>
#include <QTreeView>

#include "absl/status/status.h"
#include "gui/aggregates_widget.h"
#include "gui/charts_widget.h"
#include "gui/heatmap_widget.h"
#include "gui/session_model.h"

class QAction;

namespace kwatch::gui {

// The kwatch-gui window: the field tree on the left; the heatmap, the charts and the tabs
// with the sites table (and source lines) and the cache lines (and false-sharing evidence) on
// the right; view settings in the toolbar; errors in a banner. It builds the UI, connects it
// to `session` (not owned; outlives the window) and shows its models; it computes nothing.
class MainWindow : public QMainWindow {
  Q_OBJECT

 public:
  explicit MainWindow(SessionModel* session, QWidget* parent = nullptr);

  // Writes the window (PNG or SVG by suffix) or only the heatmap.
  absl::Status ExportWindow(const QString& path);
  absl::Status ExportHeatmap(const QString& path);

  HeatmapWidget* heatmap() const { return heatmap_; }
  ChartsWidget* charts() const { return charts_; }
  AggregatesWidget* aggregates() const { return aggregates_; }
  QTreeView* field_tree() const { return tree_; }
  QTableView* sites_view() const { return sites_view_; }
  QPlainTextEdit* source_view() const { return source_view_; }
  QTableView* lines_view() const { return lines_view_; }
  QPlainTextEdit* evidence_view() const { return evidence_view_; }
  QComboBox* object_combo() const { return object_combo_; }
  QComboBox* mode_combo() const { return mode_combo_; }
  QComboBox* scale_combo() const { return scale_combo_; }
  QComboBox* thread_combo() const { return thread_combo_; }
  QAction* follow_action() const { return follow_action_; }
  QLabel* banner() const { return banner_; }
  QTabWidget* tabs() const { return tabs_; }

 protected:
  void dragEnterEvent(QDragEnterEvent* event) override;
  void dropEvent(QDropEvent* event) override;

 private:
  void BuildMenus();
  void BuildToolBar();
  void OnLoaded();
  void OnLoadFailed(const QString& message);
  void OnSelectionChanged();
  void OnHeatmapSelection(int row0, int row1, std::optional<std::pair<int, int>> columns);
  void OnTreeClicked(const QModelIndex& index);
  void OnSiteChanged(const QModelIndex& current);
  void OnLineChanged(const QModelIndex& current);
  void ShowBanner(const QString& text, bool error);
  // Sizes the tree to its columns and the heatmap to its rows (within limits).
  void FitPanes();
  void OpenDialog();
  void ExportDialog(bool heatmap_only);
  void Open(const QString& path);
  void RememberRecent(const QString& path);
  void RebuildRecentMenu();

  SessionModel* session_;
  HeatmapWidget* heatmap_;
  ChartsWidget* charts_;
  AggregatesWidget* aggregates_;
  QTreeView* tree_;
  QTableView* sites_view_;
  QPlainTextEdit* source_view_;
  QTableView* lines_view_;
  QPlainTextEdit* evidence_view_;
  QTabWidget* tabs_;
  QSplitter* main_split_;
  QSplitter* right_split_;
  QLabel* banner_;
  QLabel* status_;
  QComboBox* object_combo_ = nullptr;
  QComboBox* mode_combo_ = nullptr;
  QComboBox* scale_combo_ = nullptr;
  QComboBox* thread_combo_ = nullptr;
  QAction* follow_action_ = nullptr;
  QMenu* recent_menu_ = nullptr;
};

}  // namespace kwatch::gui
