// The window under QTest (offscreen): mouse selection on the heatmap updates the charts and
// the sites table, the thread filter changes the matrix, hover shows exact counts, zoom and
// pan, bad input in the banner, and screenshots in the build tree.
#include "gui/main_window.h"

#include <filesystem>
#include <fstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <QAbstractBarSeries>
#include <QBarCategoryAxis>
#include <QBarSet>
#include <QHelpEvent>
#include <QLineSeries>
#include <QScrollBar>
#include <QSignalSpy>
#include <QTest>
#include <QToolTip>

#include "absl/strings/str_cat.h"
#include "tests/gui/gui_test_util.h"

namespace kwatch {
namespace {

using ::kwatch::gui::HeatmapModel;
using ::kwatch::gui::MainWindow;
using ::kwatch::gui::SessionModel;
using ::kwatch::guitest::FieldWriterLine;
using ::kwatch::guitest::FieldWriterRecording;
using ::kwatch::guitest::OpenAndWait;
using ::kwatch::guitest::Recording;
using ::kwatch::guitest::WaitForDetail;
using ::testing::HasSubstr;

std::string ScreenshotPath(const std::string& name) {
  std::filesystem::create_directories(KWATCH_GUI_SCREENSHOT_DIR);
  return std::string(KWATCH_GUI_SCREENSHOT_DIR) + "/" + name;
}

// Sum of a line series' counts (step lines hold each column's count at two points).
double StepSum(QChart* chart, const QString& name) {
  for (QAbstractSeries* s : chart->series()) {
    if (s->name() == name) {
      double sum = 0;
      for (const QPointF& p : static_cast<QLineSeries*>(s)->points()) {
        sum += p.y();
      }
      return sum / 2;
    }
  }
  ADD_FAILURE() << "no series " << name.toStdString();
  return -1;
}

// Sum of one bar set of the chart's bar series.
double BarSum(QChart* chart, const QString& set_name) {
  for (QAbstractSeries* s : chart->series()) {
    for (QBarSet* set : static_cast<QAbstractBarSeries*>(s)->barSets()) {
      if (set->label() == set_name) {
        double sum = 0;
        for (int i = 0; i < set->count(); ++i) {
          sum += set->at(i);
        }
        return sum;
      }
    }
  }
  ADD_FAILURE() << "no bar set " << set_name.toStdString();
  return -1;
}

QStringList Categories(QChart* chart) {
  for (QAbstractAxis* axis : chart->axes()) {
    if (auto* cat = qobject_cast<QBarCategoryAxis*>(axis)) {
      return cat->categories();
    }
  }
  return {};
}

class MainWindowTest : public ::testing::Test {
 protected:
  void SetUp() override {
    rec_ = &FieldWriterRecording();
    window_ = std::make_unique<MainWindow>(&session_);
    window_->resize(1600, 1000);
    window_->show();
    ASSERT_TRUE(QTest::qWaitForWindowExposed(window_.get()));
  }
  void Open(const std::string& path) {
    ASSERT_TRUE(OpenAndWait(session_, path)) << session_.error().toStdString();
    QTest::qWait(20);  // layouts settle
  }
  HeatmapModel& heat() { return *session_.heatmap(); }
  QWidget* viewport() { return window_->heatmap()->viewport(); }
  // The first and last columns where row `row` has accesses.
  std::pair<int, int> Active(int row) {
    int first = -1;
    int last = -1;
    for (int c = 0; c < heat().columnCount(); ++c) {
      if (heat().Count(row, c) > 0) {
        last = c;
        first = first < 0 ? c : first;
      }
    }
    return {first, last};
  }

  const Recording* rec_ = nullptr;
  SessionModel session_;
  std::unique_ptr<MainWindow> window_;
};

TEST_F(MainWindowTest, ClickingAFieldUpdatesTheCharts) {
  Open(rec_->path);
  QChart* timeline = window_->charts()->timeline_chart();
  EXPECT_EQ(StepSum(timeline, "writes"), 4500);
  EXPECT_EQ(StepSum(timeline, "reads"), 750);
  EXPECT_EQ(Categories(window_->charts()->sites_chart()).size(), 3);

  // Click a cell of the misses row (row 1).
  const auto [first, last] = Active(1);
  ASSERT_GE(first, 0);
  const QRect cell = window_->heatmap()->CellRect(1, first);
  ASSERT_FALSE(cell.isEmpty());
  QSignalSpy selected(&session_, &SessionModel::SelectionChanged);
  QTest::mouseClick(viewport(), Qt::LeftButton, {}, cell.center());
  ASSERT_EQ(selected.count(), 1);
  ASSERT_EQ(session_.selection().fields.size(), 1u);
  EXPECT_EQ(session_.selection().fields[0], heat().FieldAt(1));
  EXPECT_FALSE(session_.selection().has_time_range());
  ASSERT_TRUE(WaitForDetail(session_));

  EXPECT_EQ(StepSum(timeline, "writes"), 1500);
  EXPECT_EQ(StepSum(timeline, "reads"), 0);
  QChart* sites = window_->charts()->sites_chart();
  const QStringList cats = Categories(sites);
  ASSERT_EQ(cats.size(), 1);
  EXPECT_THAT(
      cats[0].toStdString(),
      HasSubstr(absl::StrCat("field_writer.c:", FieldWriterLine("g_stats.misses = (int)i;"))));
  EXPECT_EQ(BarSum(sites, "writes"), 1500);
  QChart* threads = window_->charts()->threads_chart();
  EXPECT_EQ(Categories(threads).size(), 3);
  EXPECT_EQ(BarSum(threads, "writes"), 1500);
  // The sites table follows, and its source pane shows the line.
  EXPECT_EQ(window_->sites_view()->model()->rowCount(), 1);
  EXPECT_THAT(window_->source_view()->toPlainText().toStdString(),
              HasSubstr("g_stats.misses = (int)i;"));

  // A click on the flags label selects flags.
  const QRect flags = window_->heatmap()->CellRect(2, first);
  QTest::mouseClick(viewport(), Qt::LeftButton, {}, QPoint(20, flags.center().y()));
  ASSERT_TRUE(WaitForDetail(session_));
  EXPECT_EQ(StepSum(timeline, "reads"), 750);
  EXPECT_EQ(StepSum(timeline, "writes"), 0);
  // Escape clears.
  QTest::keyClick(window_->heatmap(), Qt::Key_Escape);
  EXPECT_TRUE(session_.selection().fields.empty());
  EXPECT_EQ(StepSum(timeline, "writes"), 4500);
}

TEST_F(MainWindowTest, TreeClickSelectsAField) {
  Open(rec_->path);
  QTreeView* tree = window_->field_tree();
  const QModelIndex flags = session_.fields()->index(2, 0, session_.fields()->index(0, 0));
  const QRect r = tree->visualRect(flags);
  ASSERT_FALSE(r.isEmpty());
  QTest::mouseClick(tree->viewport(), Qt::LeftButton, {}, r.center());
  ASSERT_TRUE(WaitForDetail(session_));
  ASSERT_EQ(session_.selection().fields.size(), 1u);
  EXPECT_EQ(heat().RowOf(session_.selection().fields[0]), 2);
  EXPECT_EQ(StepSum(window_->charts()->timeline_chart(), "reads"), 750);
}

TEST_F(MainWindowTest, ThreadFilterChangesTheMatrix) {
  Open(rec_->path);
  const QImage before = window_->heatmap()->grab().toImage();
  QComboBox* combo = window_->thread_combo();
  ASSERT_EQ(combo->count(), 4);  // all threads + 3
  combo->setCurrentIndex(2);
  const int tid = combo->itemData(2).toInt();
  const guitest::Truth& t = rec_->truth.at(tid);
  EXPECT_EQ(session_.selection().tid, tid);
  EXPECT_EQ(heat().thread(), tid);
  EXPECT_EQ(heat().total(), static_cast<uint64_t>(t.hits_w + t.misses_w + t.flags_r));
  uint64_t hits = 0;
  for (int c = 0; c < heat().columnCount(); ++c) {
    hits += heat().Count(0, c);
  }
  EXPECT_EQ(hits, static_cast<uint64_t>(t.hits_w));
  QTest::qWait(20);
  const QImage after = window_->heatmap()->grab().toImage();
  EXPECT_NE(before, after);
  ASSERT_TRUE(WaitForDetail(session_));
  EXPECT_EQ(Categories(window_->charts()->threads_chart()), QStringList{QString::number(tid)});
  EXPECT_EQ(BarSum(window_->charts()->sites_chart(), "writes"), t.hits_w + t.misses_w);
  combo->setCurrentIndex(0);
  EXPECT_EQ(heat().total(), 5250u);
}

TEST_F(MainWindowTest, DraggingATimeRangeNarrowsTheSitesTable) {
  Open(rec_->path);
  const auto [first, last] = Active(0);
  ASSERT_GT(last, first + 6);
  const int c0 = first + 2;
  const int c1 = (first + last) / 2;
  const QPoint from = window_->heatmap()->CellRect(0, c0).center();
  const QPoint to = window_->heatmap()->CellRect(2, c1).center();
  QTest::mousePress(viewport(), Qt::LeftButton, {}, from);
  // QTest::mouseMove sends no button state; send the move with the button held.
  QMouseEvent move(QEvent::MouseMove, to, viewport()->mapToGlobal(to), Qt::NoButton, Qt::LeftButton,
                   Qt::NoModifier);
  QApplication::sendEvent(viewport(), &move);
  QTest::mouseRelease(viewport(), Qt::LeftButton, {}, to);
  ASSERT_TRUE(session_.selection().has_time_range());
  EXPECT_EQ(session_.selection().from_ns, heat().ColumnStartNs(c0));
  EXPECT_EQ(session_.selection().to_ns, heat().ColumnStartNs(c1 + 1));
  EXPECT_EQ(session_.selection().fields.size(), 3u);
  ASSERT_TRUE(WaitForDetail(session_));
  uint64_t want = 0;
  uint64_t want_hits = 0;
  for (int r = 0; r <= 2; ++r) {
    for (int c = c0; c <= c1; ++c) {
      want += heat().Count(r, c);
      want_hits += r == 0 ? heat().Count(r, c) : 0;
    }
  }
  ASSERT_GT(want, 0u);
  EXPECT_LT(want, 5250u);
  QAbstractItemModel* table = window_->sites_view()->model();
  ASSERT_EQ(table->rowCount(), 3);
  uint64_t total = 0;
  for (int r = 0; r < table->rowCount(); ++r) {
    total += table->index(r, gui::SiteTableModel::kTotal).data().value<quint64>();
  }
  EXPECT_EQ(total, want);
  EXPECT_EQ(table->index(0, gui::SiteTableModel::kWrites).data().value<quint64>(), want_hits);
  EXPECT_EQ(StepSum(window_->charts()->timeline_chart(), "writes") +
                StepSum(window_->charts()->timeline_chart(), "reads"),
            static_cast<double>(want));
}

TEST_F(MainWindowTest, HoverShowsTheCellsExactCounts) {
  Open(rec_->path);
  const auto [first, last] = Active(0);
  const QRect cell = window_->heatmap()->CellRect(0, first);
  QHelpEvent help(QEvent::ToolTip, cell.center(), viewport()->mapToGlobal(cell.center()));
  QApplication::sendEvent(viewport(), &help);
  const std::string tip = QToolTip::text().toStdString();
  EXPECT_THAT(tip, HasSubstr("g_stats.hits"));
  EXPECT_THAT(tip, HasSubstr(absl::StrCat("reads 0   writes ", heat().Writes(0, first))));
  QToolTip::hideText();
}

TEST_F(MainWindowTest, WheelAndKeysZoomAndPanTime) {
  Open(rec_->path);
  gui::HeatmapWidget* w = window_->heatmap();
  const int columns = heat().columnCount();
  EXPECT_EQ(w->view_first(), 0);
  EXPECT_EQ(w->view_last(), columns);
  const QRect cell = w->CellRect(0, columns / 2);
  QWheelEvent wheel(QPointF(cell.center()), QPointF(viewport()->mapToGlobal(cell.center())),
                    QPoint(), QPoint(0, 120 * 3), Qt::NoButton, Qt::ControlModifier,
                    Qt::NoScrollPhase, false);
  QApplication::sendEvent(viewport(), &wheel);
  const int span = w->view_last() - w->view_first();
  EXPECT_LT(span, columns);
  EXPECT_LE(w->view_first(), columns / 2);
  EXPECT_GT(w->view_last(), columns / 2);
  // Zoomed in, a cell is wider.
  EXPECT_GT(w->CellRect(0, columns / 2).width(), cell.width());
  const int first = w->view_first();
  QTest::keyClick(w, Qt::Key_Right);
  EXPECT_GT(w->view_first(), first);
  EXPECT_EQ(w->view_last() - w->view_first(), span);
  QTest::keyClick(w, Qt::Key_Home);
  EXPECT_EQ(w->view_first(), 0);
  EXPECT_EQ(w->view_last(), columns);
  w->SetTimeView(10, 5);  // nonsense is clamped to the minimum span
  EXPECT_GE(w->view_last() - w->view_first(), 1);
}

TEST_F(MainWindowTest, BadInputShowsClearMessages) {
  // A missing file before anything was shown.
  const std::string missing = guitest::TempPath("nothing-here.kwdb");
  EXPECT_FALSE(OpenAndWait(session_, missing));
  EXPECT_TRUE(window_->banner()->isVisible());
  EXPECT_EQ(window_->banner()->text().toStdString(),
            "Cannot open the recording: " + missing + ": no such recording");
  // Then a real one hides the banner.
  Open(rec_->path);
  EXPECT_FALSE(window_->banner()->isVisible());
  // A corrupted one.
  const std::string garbage = guitest::TempPath("garbage.kwdb");
  std::ofstream(garbage) << std::string(8192, 'x');
  EXPECT_FALSE(OpenAndWait(session_, garbage));
  EXPECT_THAT(window_->banner()->text().toStdString(),
              HasSubstr("not a kwatch recording or corrupted: " + garbage));
  // A recording without events: a note, an empty heatmap with its message.
  const Recording zero = guitest::Record("zero-window", {"--rw", "g_stats.tag"},
                                         {guitest::TargetPath("field_writer"), "1", "10"});
  Open(zero.path);
  EXPECT_THAT(window_->banner()->text().toStdString(), HasSubstr("holds no events"));
  const QImage empty = window_->heatmap()->grab().toImage();
  EXPECT_FALSE(empty.isNull());
  ASSERT_TRUE(
      window_->ExportWindow(QString::fromStdString(ScreenshotPath("zero_events.png"))).ok());
  // Export to an unknown format, or somewhere unwritable.
  const absl::Status bad = window_->ExportWindow(QStringLiteral("/tmp/picture.bmp"));
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.message()), HasSubstr("must end in .png or .svg"));
  const absl::Status unwritable = window_->ExportWindow(QStringLiteral("/nonexistent-dir/x.png"));
  EXPECT_EQ(unwritable.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(unwritable.message()), HasSubstr("/nonexistent-dir/x.png"));
}

TEST_F(MainWindowTest, ThousandsOfFieldsScrollAndStayResponsive) {
  const Recording rec =
      guitest::Record("big-window", {"--write", "g_table"}, {guitest::GuiTargetPath("big_table")});
  Open(rec.path);
  ASSERT_EQ(heat().rowCount(), 3008);
  QScrollBar* bar = window_->heatmap()->verticalScrollBar();
  EXPECT_GT(bar->maximum(), 2500);
  // Row 0 is on screen, row 3000 is not until scrolled there.
  EXPECT_FALSE(window_->heatmap()->CellRect(0, 0).isEmpty());
  EXPECT_TRUE(window_->heatmap()->CellRect(3000, 0).isEmpty());
  bar->setValue(bar->maximum());
  EXPECT_FALSE(window_->heatmap()->CellRect(3007, 0).isEmpty());
  bar->setValue(0);
  ASSERT_TRUE(window_->ExportWindow(QString::fromStdString(ScreenshotPath("big_table.png"))).ok());
}

// Renders the window with a real recording to PNG and SVG in the build tree (look at them).
TEST_F(MainWindowTest, Screenshots) {
  Open(rec_->path);
  const std::string png = ScreenshotPath("main_window.png");
  ASSERT_TRUE(window_->ExportWindow(QString::fromStdString(png)).ok());
  QImage image(QString::fromStdString(png));
  ASSERT_FALSE(image.isNull());
  EXPECT_EQ(image.size(), QSize(1600, 1000));
  // The heatmap's hottest cell is drawn in the ramp's darkest colour somewhere.
  bool hot = false;
  const QRgb darkest = gui::HeatRampColor(1.0).rgb();
  for (int y = 0; y < image.height() && !hot; ++y) {
    for (int x = 0; x < image.width() && !hot; ++x) {
      hot = image.pixel(x, y) == darkest;
    }
  }
  EXPECT_TRUE(hot);
  const std::string svg = ScreenshotPath("main_window.svg");
  ASSERT_TRUE(window_->ExportWindow(QString::fromStdString(svg)).ok());
  std::ifstream in(svg);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_THAT(text, HasSubstr("<svg"));
  ASSERT_TRUE(window_->ExportHeatmap(QString::fromStdString(ScreenshotPath("heatmap.png"))).ok());

  // With a selection (misses over part of the run), a thread and the log scale.
  const auto [first, last] = Active(1);
  const QPoint from = window_->heatmap()->CellRect(1, first + 1).center();
  const QPoint to = window_->heatmap()->CellRect(1, (first + last) / 2).center();
  QTest::mousePress(viewport(), Qt::LeftButton, {}, from);
  QMouseEvent move(QEvent::MouseMove, to, viewport()->mapToGlobal(to), Qt::NoButton, Qt::LeftButton,
                   Qt::NoModifier);
  QApplication::sendEvent(viewport(), &move);
  QTest::mouseRelease(viewport(), Qt::LeftButton, {}, to);
  window_->scale_combo()->setCurrentIndex(1);
  ASSERT_TRUE(WaitForDetail(session_));
  QTest::qWait(20);
  ASSERT_TRUE(
      window_->ExportWindow(QString::fromStdString(ScreenshotPath("main_window_selection.png")))
          .ok());
}

TEST_F(MainWindowTest, FalseSharingScreenshot) {
  const Recording rec = guitest::Record("fs-window", {"--write", "g_shared", "g_padded"},
                                        {guitest::TargetPath("false_sharing"), "2000"});
  Open(rec.path);
  EXPECT_EQ(session_.cache_lines()->findings(), 1);
  // The finding's evidence is shown for the highlighted line.
  EXPECT_THAT(window_->evidence_view()->toPlainText().toStdString(), HasSubstr("FALSE SHARING"));
  // The second watch through the combo box.
  window_->object_combo()->setCurrentIndex(1);
  Q_EMIT window_->object_combo()->activated(1);
  ASSERT_TRUE(WaitForDetail(session_));
  EXPECT_EQ(session_.selection().object, 1u);
  EXPECT_EQ(session_.cache_lines()->findings(), 0);
  EXPECT_EQ(heat().RowLabel(0), "a");
  window_->object_combo()->setCurrentIndex(0);
  Q_EMIT window_->object_combo()->activated(0);
  ASSERT_TRUE(WaitForDetail(session_));
  ASSERT_TRUE(
      window_->ExportWindow(QString::fromStdString(ScreenshotPath("false_sharing.png"))).ok());
}

}  // namespace
}  // namespace kwatch
