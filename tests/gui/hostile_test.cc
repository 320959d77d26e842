// kwatch-gui on crafted recordings (a recording is a file people share): the time axis of
// any length, names that hold HTML or terminal escapes, and thousands of fields that were
// never touched.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <QApplication>
#include <QBarCategoryAxis>
#include <QChart>
#include <QHelpEvent>
#include <QImage>
#include <QLabel>
#include <QTest>
#include <QToolTip>
#include <QTreeView>

#include "absl/strings/str_cat.h"
#include "gui/charts_widget.h"
#include "gui/display_text.h"
#include "gui/field_tree_model.h"
#include "gui/heatmap_model.h"
#include "gui/heatmap_widget.h"
#include "gui/main_window.h"
#include "gui/snapshot.h"
#include "gui/time_axis.h"
#include "tests/crafted_recording.h"
#include "tests/gui/gui_test_util.h"
#include "watch/profile/duration.h"

namespace kwatch {
namespace {

using ::kwatch::gui::HeatmapModel;
using ::kwatch::gui::HeatmapWidget;
using ::kwatch::gui::LoadRequest;
using ::kwatch::gui::SnapshotPtr;
using ::kwatch::gui::TimeAxisTicks;
using ::kwatch::gui::TimeTicks;
using ::kwatch::testing::CraftFieldsSql;
using ::kwatch::testing::CraftSpec;
using ::kwatch::testing::CraftSql;
using ::kwatch::testing::CraftWrite;
using ::kwatch::testing::WriteCraftBase;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr uint64_t kHour = 3600ULL * 1'000'000'000;

std::string Fresh(const std::string& name) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/hostile-gui-", name, "-", getpid());
  for (const char* suffix : {"", "-wal", "-shm", "-journal"}) {
    std::filesystem::remove(path + suffix);
  }
  return path;
}

SnapshotPtr Load(const std::string& path) {
  LoadRequest req;
  req.path = path;
  auto snap = gui::LoadSnapshot(req);
  EXPECT_TRUE(snap.ok()) << snap.status();
  return snap.ok() ? *snap : nullptr;
}

// Every tick is a multiple of the step, inside the range, ascending, at least min_gap_px apart
// when drawn (unless even the largest step, 10^19 ns, is closer: then at most two ticks).
void ExpectSaneTicks(uint64_t t0, uint64_t t1, int width, int gap) {
  const TimeTicks t = TimeAxisTicks(t0, t1, width, gap);
  SCOPED_TRACE(absl::StrCat("t0 ", t0, " t1 ", t1, " width ", width));
  ASSERT_GT(t.step_ns, 0u);
  constexpr uint64_t kLargest = 10'000'000'000'000'000'000ULL;
  EXPECT_LE(t.ticks_ns.size(), std::max<size_t>(static_cast<size_t>(width / gap) + 1, 2));
  const double ns_per_px = static_cast<double>(t1 - t0) / width;
  for (size_t i = 0; i < t.ticks_ns.size(); ++i) {
    EXPECT_EQ(t.ticks_ns[i] % t.step_ns, 0u);
    EXPECT_GE(t.ticks_ns[i], t0);
    EXPECT_LE(t.ticks_ns[i], t1);
    if (i > 0 && t.step_ns < kLargest) {
      EXPECT_GE(static_cast<double>(t.ticks_ns[i] - t.ticks_ns[i - 1]) / ns_per_px, gap - 1e-6);
    }
  }
}

TEST(TimeAxis, StepsAreRoundAndTicksBoundedForAnySpan) {
  // A second over 900 px, 90 px apart: 100 ms steps; over 800 px, 200 ms (100 ms would be 80
  // px apart).
  TimeTicks t = TimeAxisTicks(0, 1'000'000'000, 900, 90);
  EXPECT_EQ(t.step_ns, 100'000'000u);
  EXPECT_EQ(t.ticks_ns.size(), 11u);
  EXPECT_EQ(watch::profile::FormatDuration(t.ticks_ns[1]), "100 ms");
  t = TimeAxisTicks(0, 1'000'000'000, 800, 90);
  EXPECT_EQ(t.step_ns, 200'000'000u);
  EXPECT_EQ(t.ticks_ns.size(), 6u);
  // 30 hours: the tick search stopped at 10^12 ns and drew one label per nanosecond.
  t = TimeAxisTicks(0, 30 * kHour, 700, 90);
  EXPECT_EQ(t.step_ns, 20'000'000'000'000u);  // 20000 s
  EXPECT_EQ(t.ticks_ns.size(), 6u);
  EXPECT_EQ(watch::profile::FormatDuration(t.ticks_ns.back()), "100000 s");
  // About 500 years of nanoseconds, and the whole uint64 range.
  t = TimeAxisTicks(0, 15'778'800'000'000'000'000ULL, 700, 90);
  EXPECT_EQ(t.step_ns, 5'000'000'000'000'000'000ULL);
  EXPECT_EQ(t.ticks_ns.size(), 4u);
  EXPECT_EQ(watch::profile::FormatDuration(t.ticks_ns[1]), "5000000000 s");
  t = TimeAxisTicks(0, UINT64_MAX, 700, 90);
  EXPECT_EQ(t.step_ns, 5'000'000'000'000'000'000ULL);
  EXPECT_EQ(t.ticks_ns.size(), 4u);          // 0, 5e18, 1e19, 1.5e19
  t = TimeAxisTicks(0, UINT64_MAX, 90, 90);  // even 10^19 is closer than 90 px: two ticks
  EXPECT_EQ(t.step_ns, 10'000'000'000'000'000'000ULL);
  EXPECT_EQ(t.ticks_ns.size(), 2u);
  // A range ending at the top of uint64: no tick past it, no wrap-around.
  t = TimeAxisTicks(UINT64_MAX - 1000, UINT64_MAX, 700, 90);
  EXPECT_LE(t.ticks_ns.size(), 8u);
  for (const uint64_t tick : t.ticks_ns) {
    EXPECT_GE(tick, UINT64_MAX - 1000);
  }
  // Nothing to draw.
  EXPECT_TRUE(TimeAxisTicks(10, 5, 700, 90).ticks_ns.empty());
  EXPECT_TRUE(TimeAxisTicks(0, 10, 0, 90).ticks_ns.empty());
  for (const uint64_t span : {uint64_t{1}, uint64_t{999}, uint64_t{123'456'789}, 30 * kHour,
                              24 * 365 * kHour, uint64_t{1} << 63, UINT64_MAX}) {
    for (const int width : {1, 89, 700, 3000}) {
      ExpectSaneTicks(0, span, width, 90);
      ExpectSaneTicks(UINT64_MAX - span, UINT64_MAX, width, 90);
    }
  }
}

// A recording `span_ns` long with one write at its end.
std::string LongRecording(const std::string& name, uint64_t span_ns) {
  CraftSpec spec;
  spec.span_ns = span_ns;
  spec.events = {CraftWrite(0, 101, 0), CraftWrite(span_ns, 101, 8)};
  const std::string path = Fresh(name);
  EXPECT_TRUE(WriteCraftBase(path, spec).ok());
  return path;
}

TEST(HostileGui, HeatmapOfAThirtyHourAndAFiveHundredYearRecordingPaints) {
  for (const uint64_t span : {30 * kHour, uint64_t{15'778'800'000'000'000'000ULL}}) {
    SCOPED_TRACE(span);
    const SnapshotPtr snap = Load(LongRecording("long", span));
    ASSERT_NE(snap, nullptr);
    HeatmapModel model;
    model.SetSnapshot(snap);
    ASSERT_EQ(model.rowCount(), 2);
    ASSERT_GT(model.columnCount(), 0);
    EXPECT_GE(model.ColumnStartNs(model.columnCount()), span);
    EXPECT_EQ(model.total(), 2u);
    HeatmapWidget widget;
    widget.SetModel(&model);
    widget.resize(900, 420);
    const QImage image = widget.grab().toImage();  // spun forever on the axis before
    EXPECT_EQ(image.width(), 900);
  }
}

// A recording whose names look like HTML and hold terminal escapes.
std::string MarkupRecording() {
  CraftSpec spec;
  spec.events = {CraftWrite(10, 101, 0)};
  spec.sites.push_back({core::RemoteAddr{0x401000}, "f", 0, "/src/f.c", 7, "mov", ""});
  const std::string path = Fresh("markup");
  EXPECT_TRUE(WriteCraftBase(path, spec).ok());
  EXPECT_TRUE(CraftSql(path,
                       "UPDATE fields SET path = '.<b>bold</b><img src=\"x.png\">' || ?1 "
                       "WHERE idx = 0; UPDATE watches SET type_name = ?1;"
                       "UPDATE session SET exit_reason = '<h1>done</h1>';",
                       {"\x1b[31m"})
                  .ok());
  return path;
}

TEST(HostileGui, NamesShowAsWrittenNeverAsMarkupOrEscapes) {
  const std::string path = MarkupRecording();
  const SnapshotPtr snap = Load(path);
  ASSERT_NE(snap, nullptr);
  HeatmapModel model;
  model.SetSnapshot(snap);
  EXPECT_EQ(model.RowLabel(0).toStdString(), "<b>bold</b><img src=\"x.png\">\\x1b[31m");
  EXPECT_THAT(model.ObjectTitle().toStdString(), HasSubstr("(\\x1b[31m, 16 bytes"));
  gui::FieldTreeModel tree;
  tree.SetSnapshot(snap);
  EXPECT_EQ(tree.data(tree.ObjectIndex(0, gui::FieldTreeModel::kType)).toString(),
            QStringLiteral("\\x1b[31m"));

  // The heatmap's tooltip is rich text made from the plain text: the markup shows escaped.
  HeatmapWidget widget;
  widget.SetModel(&model);
  widget.resize(900, 420);
  widget.show();
  ASSERT_TRUE(QTest::qWaitForWindowExposed(&widget));
  int col = 0;
  while (col < model.columnCount() && model.Count(0, col) == 0) {
    ++col;
  }
  ASSERT_LT(col, model.columnCount());
  const QRect cell = widget.CellRect(0, col);
  ASSERT_FALSE(cell.isEmpty());
  QHelpEvent help(QEvent::ToolTip, cell.center(), widget.viewport()->mapToGlobal(cell.center()));
  QApplication::sendEvent(widget.viewport(), &help);
  const std::string tip = QToolTip::text().toStdString();
  EXPECT_THAT(tip, HasSubstr("&lt;b&gt;bold&lt;/b&gt;&lt;img src=&quot;x.png&quot;&gt;"));
  EXPECT_THAT(tip, Not(HasSubstr("<img")));
  QToolTip::hideText();
  EXPECT_EQ(gui::RichTextSafe(QStringLiteral("a<b>\nc&d")).toStdString(),
            "<p style='white-space:pre'>a&lt;b&gt;<br>c&amp;d</p>");
}

TEST(HostileGui, TheWindowsLabelsArePlainText) {
  const std::string path = MarkupRecording();
  gui::SessionModel session;
  gui::MainWindow window(&session);
  window.resize(1200, 800);
  window.show();
  ASSERT_TRUE(QTest::qWaitForWindowExposed(&window));
  ASSERT_TRUE(guitest::OpenAndWait(session, path)) << session.error().toStdString();
  EXPECT_EQ(window.banner()->textFormat(), Qt::PlainText);
  for (QLabel* label : window.findChildren<QLabel*>()) {
    if (label->text().contains(QStringLiteral("<h1>"))) {
      EXPECT_EQ(label->textFormat(), Qt::PlainText) << label->text().toStdString();
    }
  }
}

TEST(HostileGui, ThePerThreadChartShowsTheBusiestThreads) {
  // 100 threads, thread 1000 + i writing i + 1 times: the chart has the 32 busiest, in tid order.
  CraftSpec spec;
  for (int i = 0; i < 100; ++i) {
    for (int k = 0; k <= i; ++k) {
      spec.events.push_back(CraftWrite(static_cast<uint64_t>(1000 * i + k), 1000 + i, 0));
    }
  }
  const std::string path = Fresh("threads");
  ASSERT_TRUE(WriteCraftBase(path, spec).ok());
  gui::SessionModel session;
  gui::MainWindow window(&session);
  window.resize(1200, 800);
  window.show();
  ASSERT_TRUE(QTest::qWaitForWindowExposed(&window));
  ASSERT_TRUE(guitest::OpenAndWait(session, path)) << session.error().toStdString();
  QChart* chart = window.charts()->threads_chart();
  EXPECT_EQ(chart->title().toStdString(), "Per thread: the 32 busiest of 100");
  QStringList categories;
  for (QAbstractAxis* axis : chart->axes()) {
    if (auto* cat = qobject_cast<QBarCategoryAxis*>(axis)) {
      categories = cat->categories();
    }
  }
  ASSERT_EQ(categories.size(), 32);
  EXPECT_EQ(categories.front().toStdString(), "1068");
  EXPECT_EQ(categories.back().toStdString(), "1099");
}

TEST(HostileGui, UntouchedFieldsHoldNoHeatmapCounters) {
  // 40000 fields, one written: the model used to hold 3 x 40000 x columns counters.
  CraftSpec spec;
  spec.events = {CraftWrite(10, 101, 4 * 123, 4)};
  const std::string path = Fresh("wide");
  ASSERT_TRUE(WriteCraftBase(path, spec).ok());
  ASSERT_TRUE(CraftSql(path, "DELETE FROM fields; UPDATE watches SET length = 160000;" +
                                 CraftFieldsSql(0, 40000))
                  .ok());
  const SnapshotPtr snap = Load(path);
  ASSERT_NE(snap, nullptr);
  HeatmapModel model;
  model.SetSnapshot(snap);
  ASSERT_EQ(model.rowCount(), 40000);
  EXPECT_EQ(model.counted_rows(), 1u);
  EXPECT_EQ(model.total(), 1u);
  EXPECT_EQ(snap->profile->bins().counted_rows(), 1u);  // .f123's writes
  EXPECT_EQ(snap->profile->bins().sparse_cells(), 1u);  // thread 101's
  int col = 0;
  while (col < model.columnCount() && model.Count(123, col) == 0) {
    ++col;
  }
  ASSERT_LT(col, model.columnCount());
  EXPECT_EQ(model.Writes(123, col), 1u);
  EXPECT_EQ(model.Count(124, col), 0u);
  model.SetMode(gui::AccessMode::kReads);
  EXPECT_EQ(model.Count(123, col), 0u);
  EXPECT_EQ(model.total(), 0u);
}

TEST(HostileGui, SourceFilesNamedByARecordingAreReadWithinBounds) {
  // A /proc file says it is empty and never ends: at most 8 MiB are read, then it is refused.
  EXPECT_FALSE(gui::ReadSourceSnippet("/proc/self/pagemap", 1, 3).has_value());
  EXPECT_FALSE(gui::ReadSourceSnippet("/dev/zero", 1, 3).has_value());  // not a regular file
  // A line of 100 KB is cut to 1000 bytes in the snippet.
  const std::string path = Fresh("source.c");
  {
    std::FILE* f = std::fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs("int a;\n", f);
    std::fputs(std::string(100000, 'x').c_str(), f);
    std::fputs("\nint b;\n", f);
    std::fclose(f);
  }
  const std::optional<gui::SourceSnippet> s = gui::ReadSourceSnippet(path, 2, 1);
  ASSERT_TRUE(s.has_value());
  ASSERT_EQ(s->lines.size(), 3u);
  EXPECT_EQ(s->lines[0], "int a;");
  EXPECT_EQ(s->lines[1], std::string(1000, 'x') + " [...]");
  EXPECT_EQ(s->lines[2], "int b;");
}

}  // namespace
}  // namespace kwatch
