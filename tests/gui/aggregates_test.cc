// The Aggregations tab of kwatch-gui on a real probe recording with aggregations (`kwatch probe
// -o F --agg 'count() by tid' --agg 'fact:hist(n)'` on tests/targets/probe_args: add_ints is
// called 5 times, fact(5) recurses with n = 5..1): the histogram's bars are its bucket counts,
// the scalar aggregations are in the table; models under QAbstractItemModelTester.
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <QAbstractItemModelTester>
#include <QBarCategoryAxis>
#include <QBarSeries>
#include <QBarSet>
#include <QImage>
#include <QTest>

#include "gui/main_window.h"
#include "tests/gui/gui_test_util.h"
#include "tests/test_util.h"

namespace kwatch {
namespace {

using ::kwatch::gui::AggregateTableModel;
using ::kwatch::gui::MainWindow;
using ::kwatch::gui::SessionModel;

// The recording, made once by the real kwatch on a private copy of probe_args.
const std::string& AggregationRecording() {
  static const std::string* path = [] {
    auto* p = new std::string(guitest::TempPath("aggregations.kwdb"));
    const std::string target = guitest::TempPath("probe_args");
    std::filesystem::copy_file(guitest::TargetPath("probe_args"), target);
    auto run =
        testing::Run({testing::KwatchPath(), "probe", "-q", "-o", *p, "--agg", "count() by tid",
                      "--agg", "fact:hist(n)", "add_ints a b", "fact n", "--", target});
    EXPECT_TRUE(run.ok()) << run.status();
    if (run.ok()) {
      EXPECT_EQ(run->exit_code, 0) << run->err;
    }
    return p;
  }();
  return *path;
}

std::vector<double> Bars(QChart* chart) {
  std::vector<double> out;
  for (QAbstractSeries* s : chart->series()) {
    for (QBarSet* set : static_cast<QAbstractBarSeries*>(s)->barSets()) {
      for (int i = 0; i < set->count(); ++i) {
        out.push_back(set->at(i));
      }
    }
  }
  return out;
}

QStringList Categories(QChart* chart) {
  for (QAbstractAxis* axis : chart->axes()) {
    if (auto* cat = qobject_cast<QBarCategoryAxis*>(axis)) {
      return cat->categories();
    }
  }
  return {};
}

TEST(AggregationsTab, HistogramBarsAndScalarTableOfARecording) {
  SessionModel session;
  const QAbstractItemModelTester hist_tester(session.histograms(),
                                             QAbstractItemModelTester::FailureReportingMode::Fatal);
  const QAbstractItemModelTester table_tester(
      session.scalar_aggregates(), QAbstractItemModelTester::FailureReportingMode::Fatal);
  MainWindow window(&session);
  window.resize(1600, 1000);
  window.show();
  ASSERT_TRUE(QTest::qWaitForWindowExposed(&window));
  ASSERT_TRUE(guitest::OpenAndWait(session, AggregationRecording()))
      << session.error().toStdString();
  QTest::qWait(20);

  // A probe recording: the tab is shown, and says how many aggregations it has.
  EXPECT_EQ(window.tabs()->currentWidget(), window.aggregates());
  EXPECT_EQ(window.tabs()->tabText(window.tabs()->currentIndex()), "Aggregations (3)");

  // One histogram: fact's n = 5..1 in power-of-two buckets.
  ASSERT_EQ(session.histograms()->rowCount(), 1);
  EXPECT_EQ(session.histograms()->index(0, 0).data().toString(), "fact: hist(n)");
  EXPECT_EQ(window.aggregates()->histogram_combo()->currentIndex(), 0);
  QChart* chart = window.aggregates()->histogram_chart();
  EXPECT_EQ(Bars(chart), (std::vector<double>{1, 2, 2}));
  EXPECT_EQ(Categories(chart), (QStringList{"[1, 2)", "[2, 4)", "[4, 8)"}));
  EXPECT_EQ(chart->title(), "fact: hist(n) — 5 hits");

  // count() by tid on both probes: 5 calls each, the target's one thread.
  AggregateTableModel* table = session.scalar_aggregates();
  ASSERT_EQ(table->rowCount(), 2);
  const QString tid = QString::number(session.main_snapshot()->session.pid);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(table->index(r, AggregateTableModel::kEvent).data().toString(),
              r == 0 ? "add_ints" : "fact");
    EXPECT_EQ(table->index(r, AggregateTableModel::kAggregation).data().toString(),
              "count() by tid");
    EXPECT_EQ(table->index(r, AggregateTableModel::kKey).data().toString(), "tid=" + tid);
    EXPECT_EQ(table->index(r, AggregateTableModel::kValue).data().toString(), "5");
    EXPECT_EQ(table->index(r, AggregateTableModel::kCount).data().toULongLong(), 5u);
  }

  std::filesystem::create_directories(KWATCH_GUI_SCREENSHOT_DIR);
  const std::string png = std::string(KWATCH_GUI_SCREENSHOT_DIR) + "/aggregations.png";
  ASSERT_TRUE(window.ExportWindow(QString::fromStdString(png)).ok());
  EXPECT_FALSE(QImage(QString::fromStdString(png)).isNull());
}

TEST(AggregationsTab, ARecordingWithoutAggregationsHasAnEmptyTab) {
  SessionModel session;
  MainWindow window(&session);
  window.resize(1200, 800);
  window.show();
  ASSERT_TRUE(QTest::qWaitForWindowExposed(&window));
  ASSERT_TRUE(guitest::OpenAndWait(session, guitest::FieldWriterRecording().path));
  EXPECT_EQ(session.histograms()->rowCount(), 0);
  EXPECT_EQ(session.scalar_aggregates()->rowCount(), 0);
  EXPECT_NE(window.tabs()->currentWidget(), window.aggregates());
  EXPECT_EQ(window.tabs()->tabText(2), "Aggregations");
  EXPECT_TRUE(Bars(window.aggregates()->histogram_chart()).empty());
}

}  // namespace
}  // namespace kwatch
