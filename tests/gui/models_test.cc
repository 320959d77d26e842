// The viewer's models, headless, under QAbstractItemModelTester (fatal mode), against a real
// recording of field_writer 3 x 1000 (--rw g_stats) and the ground truth it prints.
#include <numeric>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <QAbstractItemModelTester>
#include <QColor>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gui/cache_line_model.h"
#include "gui/display_text.h"
#include "gui/field_tree_model.h"
#include "gui/heat_color.h"
#include "gui/heatmap_model.h"
#include "gui/site_table_model.h"
#include "gui/snapshot.h"
#include "gui/thread_model.h"
#include "gui/timeline_model.h"
#include "tests/gui/gui_test_util.h"

namespace kwatch {
namespace {

using ::kwatch::gui::AccessMode;
using ::kwatch::gui::HeatmapModel;
using ::kwatch::gui::Selection;
using ::kwatch::gui::SnapshotPtr;
using ::kwatch::guitest::FieldWriterLine;
using ::kwatch::guitest::FieldWriterRecording;
using ::kwatch::guitest::Recording;
using ::testing::HasSubstr;
using Tester = QAbstractItemModelTester;

constexpr int kThreads = 3;
constexpr int kIters = 1000;
constexpr uint64_t kHitsWrites = kThreads * kIters;        // every iteration
constexpr uint64_t kMissesWrites = kThreads * kIters / 2;  // even iterations
constexpr uint64_t kFlagsReads = kThreads * kIters / 4;    // every fourth

uint64_t U(const QVariant& v) {
  return v.value<quint64>();
}

uint32_t FieldNamed(const watch::profile::StorageProfile& p, const std::string& path) {
  for (uint32_t f = 0; f < p.fields().size(); ++f) {
    if (p.fields()[f].path == path) {
      return f;
    }
  }
  ADD_FAILURE() << "no field " << path;
  return 0;
}

class ModelsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    rec_ = &FieldWriterRecording(kThreads, kIters);
    gui::LoadRequest req;
    req.path = rec_->path;
    auto snap = gui::LoadSnapshot(req);
    ASSERT_TRUE(snap.ok()) << snap.status();
    snap_ = *snap;
  }
  static void TearDownTestSuite() { snap_.reset(); }

  const watch::profile::StorageProfile& profile() const { return *snap_->profile; }
  uint32_t Field(const std::string& name) const { return FieldNamed(profile(), "g_stats." + name); }

  static const Recording* rec_;
  static SnapshotPtr snap_;
};

const Recording* ModelsTest::rec_ = nullptr;
SnapshotPtr ModelsTest::snap_;

// The chart's site labels name an inlined function and its caller, as the site table does.
TEST(SiteLabelText, NamesTheInlinedFunctionAndItsCaller) {
  EXPECT_EQ(
      gui::SiteLabelText("StoreScaled", 5, "ScaleHits", "/src/tests/layouts.c", 97).toStdString(),
      "ScaleHits inlined in StoreScaled (layouts.c:97)");
  EXPECT_EQ(gui::SiteLabelText("Work", 0x1a, "", "field_writer.c", 12).toStdString(),
            "Work (field_writer.c:12)");
  EXPECT_EQ(gui::SiteLabelText("Work", 0x1a, "Work", "a/b.c", 3).toStdString(), "Work (b.c:3)");
  // Without a line: the offset instead.
  EXPECT_EQ(gui::SiteLabelText("StoreScaled", 0x5, "ScaleHits", "", 0).toStdString(),
            "ScaleHits inlined in StoreScaled+0x5");
  // A hostile name stays printable.
  EXPECT_EQ(gui::SiteLabelText("f\x1b[2J", 0, "", "x.c", 1).toStdString(), "f\\x1b[2J (x.c:1)");
}

TEST_F(ModelsTest, SnapshotHoldsTheWholeRecording) {
  EXPECT_TRUE(snap_->complete);
  EXPECT_EQ(snap_->recorded_events, kHitsWrites + kMissesWrites + kFlagsReads);
  EXPECT_EQ(profile().events(), snap_->recorded_events);
  ASSERT_EQ(profile().objects().size(), 1u);
  EXPECT_EQ(profile().objects()[0].expr, "g_stats");
  EXPECT_EQ(profile().fields().size(), 8u);
  EXPECT_EQ(profile().threads().size(), static_cast<size_t>(kThreads));
  // About 240 columns of a round width over the session.
  EXPECT_LE(profile().bins().columns(), 240u);
  const uint64_t w = profile().bins().width_ns();
  uint64_t m = w;
  while (m % 10 == 0) {
    m /= 10;
  }
  EXPECT_TRUE(m == 1 || m == 2 || m == 5 || m == 4 || m == 8) << w;  // 1-2-5, maybe doubled
  // The source lines around each accessing instruction were read.
  ASSERT_EQ(snap_->sources.size(), 3u);
  bool found = false;
  for (const auto& [ip, s] : snap_->sources) {
    if (s.line == FieldWriterLine("g_stats.hits = i;")) {
      found = true;
      const size_t at = static_cast<size_t>(s.line - s.first_line);
      ASSERT_LT(at, s.lines.size());
      EXPECT_THAT(s.lines[at], HasSubstr("g_stats.hits = i;"));
      EXPECT_EQ(s.lines.size(), 7u);  // three lines either side
    }
  }
  EXPECT_TRUE(found);
}

TEST_F(ModelsTest, FieldTreeShowsTheLayoutWithExactCounts) {
  gui::FieldTreeModel model;
  Tester tester(&model, Tester::FailureReportingMode::Fatal);
  model.SetSnapshot(snap_);
  ASSERT_EQ(model.rowCount(), 1);
  const QModelIndex obj = model.index(0, 0);
  EXPECT_EQ(obj.data().toString(), "g_stats");
  EXPECT_THAT(model.index(0, gui::FieldTreeModel::kType).data().toString().toStdString(),
              HasSubstr("struct stats"));
  EXPECT_EQ(model.index(0, gui::FieldTreeModel::kSize).data().toString(), "32");
  EXPECT_EQ(U(model.index(0, gui::FieldTreeModel::kReads).data()), kFlagsReads);
  EXPECT_EQ(U(model.index(0, gui::FieldTreeModel::kWrites).data()), kHitsWrites + kMissesWrites);
  EXPECT_EQ(U(model.index(0, gui::FieldTreeModel::kThreads).data()), 3u);
  ASSERT_EQ(model.rowCount(obj), 8);
  const auto cell = [&](int row, int col) { return model.index(row, col, obj).data(); };
  const char* const names[] = {"hits", "misses", "flags",   "tag",
                               "mode", "ready",  "inner.a", "inner.b"};
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(cell(r, gui::FieldTreeModel::kName).toString(), names[r]);
  }
  // hits: offset 0, 8 bytes, written once per iteration by every thread.
  EXPECT_EQ(cell(0, gui::FieldTreeModel::kOffset).toString(), "0");
  EXPECT_EQ(cell(0, gui::FieldTreeModel::kSize).toString(), "8");
  EXPECT_EQ(cell(0, gui::FieldTreeModel::kType).toString(), "long");
  EXPECT_EQ(U(cell(0, gui::FieldTreeModel::kReads)), 0u);
  EXPECT_EQ(U(cell(0, gui::FieldTreeModel::kWrites)), kHitsWrites);
  EXPECT_EQ(U(cell(0, gui::FieldTreeModel::kThreads)), 3u);
  EXPECT_EQ(U(cell(1, gui::FieldTreeModel::kWrites)), kMissesWrites);
  EXPECT_EQ(U(cell(2, gui::FieldTreeModel::kReads)), kFlagsReads);
  EXPECT_EQ(U(cell(2, gui::FieldTreeModel::kWrites)), 0u);
  EXPECT_EQ(U(cell(3, gui::FieldTreeModel::kReads)) + U(cell(3, gui::FieldTreeModel::kWrites)), 0u);
  EXPECT_EQ(U(cell(3, gui::FieldTreeModel::kThreads)), 0u);
  // Bitfields show byte:bit and bits.
  EXPECT_EQ(cell(4, gui::FieldTreeModel::kOffset).toString(), "20:16");
  EXPECT_EQ(cell(4, gui::FieldTreeModel::kSize).toString(), "3b");
  EXPECT_EQ(cell(6, gui::FieldTreeModel::kOffset).toString(), "24");
  // Roles map back to the profile.
  EXPECT_EQ(model.index(1, 0, obj).data(gui::FieldTreeModel::kFieldRole).toUInt(), Field("misses"));
  EXPECT_EQ(model.FieldIndex(Field("flags")), model.index(2, 0, obj));
  EXPECT_EQ(model.ObjectIndex(0), obj);
}

TEST_F(ModelsTest, HeatmapRowsAreFieldsInLayoutOrderAndCellsSumToTheCounts) {
  HeatmapModel model;
  Tester tester(&model, Tester::FailureReportingMode::Fatal);
  model.SetSnapshot(snap_);
  ASSERT_EQ(model.rowCount(), 8);
  ASSERT_EQ(model.columnCount(), static_cast<int>(profile().bins().columns()));
  ASSERT_GT(model.columnCount(), 10);
  const auto row_sum = [&](int row) {
    uint64_t n = 0;
    for (int c = 0; c < model.columnCount(); ++c) {
      n += U(model.index(row, c).data(HeatmapModel::kCountRole));
    }
    return n;
  };
  EXPECT_EQ(model.headerData(0, Qt::Vertical).toString(), "hits");
  EXPECT_EQ(model.headerData(7, Qt::Vertical).toString(), "inner.b");
  EXPECT_EQ(model.headerData(2, Qt::Vertical, HeatmapModel::kFieldRole).toUInt(), Field("flags"));
  // g_stats is 32 bytes at a 64-byte aligned address here: one cache line for all rows.
  const uint64_t addr = profile().objects()[0].addr.value;
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(model.LineAt(r), (addr + profile().fields()[model.FieldAt(r)].begin) & ~63ULL);
  }
  EXPECT_EQ(row_sum(0), kHitsWrites);
  EXPECT_EQ(row_sum(1), kMissesWrites);
  EXPECT_EQ(row_sum(2), kFlagsReads);
  EXPECT_EQ(row_sum(3), 0u);
  EXPECT_EQ(model.total(), kHitsWrites + kMissesWrites + kFlagsReads);
  // Columns start at the session start, one bucket apart.
  EXPECT_EQ(U(model.headerData(0, Qt::Horizontal, HeatmapModel::kColumnStartNsRole)), 0u);
  EXPECT_EQ(U(model.headerData(3, Qt::Horizontal, HeatmapModel::kColumnStartNsRole)),
            3 * model.bucket_ns());

  model.SetMode(AccessMode::kReads);
  EXPECT_EQ(row_sum(0), 0u);
  EXPECT_EQ(row_sum(2), kFlagsReads);
  EXPECT_EQ(model.total(), kFlagsReads);
  model.SetMode(AccessMode::kWrites);
  EXPECT_EQ(row_sum(0), kHitsWrites);
  EXPECT_EQ(row_sum(2), 0u);
  EXPECT_EQ(model.total(), kHitsWrites + kMissesWrites);

  // The colour of a cell follows its share of the maximum; empty cells have the empty colour.
  model.SetMode(AccessMode::kBoth);
  uint64_t max = 0;
  for (int c = 0; c < model.columnCount(); ++c) {
    max = std::max(max, model.Count(0, c));
    EXPECT_EQ(model.index(3, c).data(Qt::BackgroundRole).value<QColor>(), gui::EmptyHeatColor());
  }
  EXPECT_EQ(model.max_count(), max);
  for (int c = 0; c < model.columnCount(); ++c) {
    if (model.Count(0, c) == max) {
      EXPECT_DOUBLE_EQ(model.index(0, c).data(HeatmapModel::kFractionRole).toDouble(), 1.0);
      EXPECT_EQ(model.index(0, c).data(Qt::BackgroundRole).value<QColor>(),
                gui::HeatColor(max, max, gui::Scale::kLinear));
      EXPECT_EQ(model.index(0, c).data(Qt::BackgroundRole).value<QColor>(),
                gui::HeatRampColor(1.0));
    }
  }
}

TEST_F(ModelsTest, HeatmapThreadFilterShowsThatThreadsAccessesOnly) {
  HeatmapModel model;
  Tester tester(&model, Tester::FailureReportingMode::Fatal);
  model.SetSnapshot(snap_);
  const auto row_sum = [&](int row) {
    uint64_t n = 0;
    for (int c = 0; c < model.columnCount(); ++c) {
      n += model.Count(row, c);
    }
    return n;
  };
  for (const auto& [tid, truth] : rec_->truth) {
    model.SetThread(tid);
    EXPECT_EQ(row_sum(0), static_cast<uint64_t>(truth.hits_w)) << tid;
    EXPECT_EQ(row_sum(1), static_cast<uint64_t>(truth.misses_w)) << tid;
    EXPECT_EQ(row_sum(2), static_cast<uint64_t>(truth.flags_r)) << tid;
    EXPECT_THAT(model.index(0, 0).data(Qt::ToolTipRole).toString().toStdString(),
                HasSubstr(absl::StrCat("thread ", tid)));
  }
  model.SetThread(1);  // no such thread in the recording
  EXPECT_EQ(model.total(), 0u);
  model.SetThread(std::nullopt);
  EXPECT_EQ(model.total(), kHitsWrites + kMissesWrites + kFlagsReads);
}

TEST_F(ModelsTest, HeatmapTooltipHasTheExactCounts) {
  HeatmapModel model;
  model.SetSnapshot(snap_);
  for (int c = 0; c < model.columnCount(); ++c) {
    if (model.Count(2, c) == 0) {
      continue;
    }
    const std::string tip = model.index(2, c).data(Qt::ToolTipRole).toString().toStdString();
    EXPECT_THAT(tip, HasSubstr("g_stats.flags"));
    EXPECT_THAT(tip, HasSubstr(absl::StrCat("reads ", model.Reads(2, c), "   writes 0")));
    EXPECT_THAT(tip, HasSubstr("all threads"));
    return;
  }
  FAIL() << "flags was never read";
}

TEST(HeatColor, IsAMonotonicRampWithADistinctEmptyColour) {
  using gui::HeatColor;
  using gui::Scale;
  for (Scale s : {Scale::kLinear, Scale::kLog}) {
    EXPECT_EQ(HeatColor(0, 100, s), gui::EmptyHeatColor());
    EXPECT_EQ(HeatColor(5, 0, s), gui::EmptyHeatColor());
    EXPECT_NE(HeatColor(1, 1'000'000'000, s), gui::EmptyHeatColor());
    // Darker with more accesses.
    double prev = 2.0;
    for (uint64_t c = 1; c <= 100; ++c) {
      const double l = HeatColor(c, 100, s).lightnessF();
      EXPECT_LE(l, prev + 1e-9) << c;
      prev = l;
      // A thin wrapper: the same colour as kwatch report's PNG.
      EXPECT_EQ(HeatColor(c, 100, s).rgb() & 0xffffffu, watch::profile::HeatRgb(c, 100, s)) << c;
    }
  }
  EXPECT_EQ(gui::EmptyHeatColor(), QColor(236, 236, 236));
  EXPECT_EQ(HeatColor(100, 100, Scale::kLinear), QColor(84, 0, 74));
  EXPECT_EQ(HeatColor(200, 100, Scale::kLinear), QColor(84, 0, 74));  // clamped
  EXPECT_EQ(gui::HeatRampColor(1.0), QColor(84, 0, 74));
  EXPECT_EQ(gui::HeatRampColor(0.0), QColor(255, 240, 168));
  // Log: 10 of 100 sits half way up the ramp (log 10 / log 100), linear a tenth of the way.
  EXPECT_EQ(HeatColor(10, 100, Scale::kLog), gui::HeatRampColor(0.5));
  EXPECT_EQ(HeatColor(10, 100, Scale::kLinear), gui::HeatRampColor(0.1));
}

TEST_F(ModelsTest, TimelineSumsTheSelectedFieldsOverTheSelectedColumns) {
  gui::TimelineModel model;
  Tester tester(&model, Tester::FailureReportingMode::Fatal);
  Selection sel;
  model.SetData(snap_, sel);
  EXPECT_EQ(model.rowCount(), static_cast<int>(profile().bins().columns()));
  EXPECT_EQ(model.total_reads(), kFlagsReads);
  EXPECT_EQ(model.total_writes(), kHitsWrites + kMissesWrites);
  sel.fields = {Field("misses")};
  model.SetData(snap_, sel);
  EXPECT_EQ(model.total_reads(), 0u);
  EXPECT_EQ(model.total_writes(), kMissesWrites);

  // A time range of whole columns: rows are those columns, sums those of the heatmap.
  HeatmapModel heat;
  heat.SetSnapshot(snap_);
  int first = -1;
  int last = -1;
  for (int c = 0; c < heat.columnCount(); ++c) {
    if (heat.Count(1, c) > 0) {
      last = c;
      first = first < 0 ? c : first;
    }
  }
  ASSERT_GT(last, first + 4);
  const int c0 = first + 1;
  const int c1 = last - 1;
  uint64_t want = 0;
  for (int c = c0; c <= c1; ++c) {
    want += heat.Writes(1, c);
  }
  sel.from_ns = heat.ColumnStartNs(c0);
  sel.to_ns = heat.ColumnStartNs(c1 + 1);
  model.SetData(snap_, sel);
  EXPECT_EQ(model.rowCount(), c1 - c0 + 1);
  EXPECT_EQ(model.StartNs(0), heat.ColumnStartNs(c0));
  EXPECT_EQ(model.total_writes(), want);
  EXPECT_LT(want, kMissesWrites);
  EXPECT_DOUBLE_EQ(model.index(0, gui::TimelineModel::kStart).data().toDouble(),
                   static_cast<double>(heat.ColumnStartNs(c0)) / 1e9);
  // One thread.
  const auto& [tid, truth] = *rec_->truth.begin();
  sel = Selection{};
  sel.tid = tid;
  model.SetData(snap_, sel);
  EXPECT_EQ(model.total_writes(), static_cast<uint64_t>(truth.hits_w + truth.misses_w));
  EXPECT_EQ(model.total_reads(), static_cast<uint64_t>(truth.flags_r));
}

TEST_F(ModelsTest, SitesAreRankedWithFunctionLineAndSource) {
  gui::SiteTableModel model;
  Tester tester(&model, Tester::FailureReportingMode::Fatal);
  model.SetData(snap_, snap_, Selection{});
  ASSERT_EQ(model.rowCount(), 3);
  const auto text = [&](int r, int c) { return model.index(r, c).data().toString().toStdString(); };
  const auto count = [&](int r, int c) {
    return U(model.index(r, c).data(gui::SiteTableModel::kCountRole));
  };
  EXPECT_THAT(text(0, gui::SiteTableModel::kFunction), ::testing::StartsWith("Work+0x"));
  EXPECT_EQ(text(0, gui::SiteTableModel::kLocation),
            absl::StrCat("field_writer.c:", FieldWriterLine("g_stats.hits = i;")));
  EXPECT_EQ(count(0, gui::SiteTableModel::kWrites), kHitsWrites);
  EXPECT_EQ(count(0, gui::SiteTableModel::kReads), 0u);
  EXPECT_EQ(text(0, gui::SiteTableModel::kFields), "hits");
  EXPECT_EQ(text(1, gui::SiteTableModel::kLocation),
            absl::StrCat("field_writer.c:", FieldWriterLine("g_stats.misses = (int)i;")));
  EXPECT_EQ(count(1, gui::SiteTableModel::kWrites), kMissesWrites);
  EXPECT_EQ(text(2, gui::SiteTableModel::kFields), "flags");
  EXPECT_EQ(count(2, gui::SiteTableModel::kReads), kFlagsReads);
  EXPECT_EQ(count(2, gui::SiteTableModel::kTotal), kFlagsReads);
  EXPECT_EQ(model.total_reads() + model.total_writes(), kHitsWrites + kMissesWrites + kFlagsReads);
  EXPECT_THAT(
      model.SiteLabel(0).toStdString(),
      HasSubstr(absl::StrCat("Work (field_writer.c:", FieldWriterLine("g_stats.hits = i;"), ")")));
  // The source around the site, its line marked.
  const std::string src =
      model.index(0, 0).data(gui::SiteTableModel::kSourceRole).toString().toStdString();
  EXPECT_THAT(src, HasSubstr("tests/targets/field_writer.c:"));
  bool marked = false;
  for (absl::string_view line : absl::StrSplit(src, '\n')) {
    if (absl::StartsWith(line, "▶")) {
      marked = true;
      EXPECT_THAT(std::string(line), HasSubstr("g_stats.hits = i;"));
    }
  }
  EXPECT_TRUE(marked) << src;
  EXPECT_EQ(model.RowOfIp(U(model.index(1, 0).data(gui::SiteTableModel::kIpRole))), 1);

  // One field: only its site.
  Selection sel;
  sel.fields = {Field("misses")};
  model.SetData(snap_, snap_, sel);
  ASSERT_EQ(model.rowCount(), 1);
  EXPECT_EQ(count(0, gui::SiteTableModel::kWrites), kMissesWrites);
  EXPECT_EQ(text(0, gui::SiteTableModel::kFields), "misses");
  // A field nobody touched: no sites.
  sel.fields = {Field("tag")};
  model.SetData(snap_, snap_, sel);
  EXPECT_EQ(model.rowCount(), 0);
}

TEST_F(ModelsTest, ThreadsMatchWhatEachThreadSaysItDid) {
  gui::ThreadModel model;
  Tester tester(&model, Tester::FailureReportingMode::Fatal);
  model.SetData(snap_, Selection{});
  ASSERT_EQ(model.rowCount(), kThreads);
  for (int r = 0; r < model.rowCount(); ++r) {
    const int tid = model.index(r, gui::ThreadModel::kTid).data().toInt();
    ASSERT_TRUE(rec_->truth.count(tid)) << tid;
    const guitest::Truth& t = rec_->truth.at(tid);
    EXPECT_EQ(model.ReadsAt(r), static_cast<uint64_t>(t.flags_r));
    EXPECT_EQ(model.WritesAt(r), static_cast<uint64_t>(t.hits_w + t.misses_w));
    EXPECT_EQ(U(model.index(r, gui::ThreadModel::kTotal).data()),
              static_cast<uint64_t>(t.flags_r + t.hits_w + t.misses_w));
  }
  Selection sel;
  sel.fields = {Field("hits")};
  model.SetData(snap_, sel);
  ASSERT_EQ(model.rowCount(), kThreads);
  for (int r = 0; r < model.rowCount(); ++r) {
    EXPECT_EQ(model.WritesAt(r), static_cast<uint64_t>(rec_->truth.at(model.TidAt(r)).hits_w));
    EXPECT_EQ(model.ReadsAt(r), 0u);
  }
  sel.fields = {Field("inner.a")};
  model.SetData(snap_, sel);
  EXPECT_EQ(model.rowCount(), 0);
}

TEST_F(ModelsTest, CacheLinesOfTheObjectWithTheirWriters) {
  gui::CacheLineModel model;
  Tester tester(&model, Tester::FailureReportingMode::Fatal);
  model.SetData(snap_, snap_, Selection{});
  ASSERT_EQ(model.rowCount(), 1);  // 32 bytes, 64-byte aligned
  EXPECT_EQ(U(model.index(0, gui::CacheLineModel::kWrites).data()), kHitsWrites + kMissesWrites);
  EXPECT_EQ(U(model.index(0, gui::CacheLineModel::kWriters).data()), 3u);
  EXPECT_EQ(U(model.index(0, 0).data(gui::CacheLineModel::kLineRole)),
            profile().objects()[0].addr.value & ~63ULL);
  EXPECT_THAT(model.index(0, gui::CacheLineModel::kFields).data().toString().toStdString(),
              ::testing::StartsWith("hits, misses, flags, tag"));
  // The threads write the same fields: whatever the transfers, no false sharing.
  EXPECT_FALSE(model.index(0, 0).data(gui::CacheLineModel::kFalseSharingRole).toBool());
  EXPECT_EQ(model.findings(), 0);
  EXPECT_THAT(model.index(0, 0).data(gui::CacheLineModel::kEvidenceRole).toString().toStdString(),
              HasSubstr("no false sharing"));
}

// false_sharing: two threads write g_shared.a and g_shared.b (one line) and g_padded.a and
// g_padded.b (64 bytes apart). Only g_shared's line is a finding, with its evidence.
TEST(CacheLineModel, FalseSharingIsHighlightedWithItsEvidence) {
  const Recording rec = guitest::Record("fs", {"--write", "g_shared", "g_padded"},
                                        {guitest::TargetPath("false_sharing"), "2000"});
  ASSERT_EQ(rec.exit_code, 0) << rec.err;
  ASSERT_THAT(rec.out, HasSubstr("done a=1999 b=1999"));
  gui::LoadRequest req;
  req.path = rec.path;
  auto snap = gui::LoadSnapshot(req);
  ASSERT_TRUE(snap.ok()) << snap.status();
  gui::CacheLineModel model;
  Tester tester(&model, Tester::FailureReportingMode::Fatal);
  Selection sel;
  sel.object = 0;  // g_shared
  model.SetData(*snap, *snap, sel);
  ASSERT_EQ(model.rowCount(), 1);
  EXPECT_EQ(model.findings(), 1);
  const QModelIndex line = model.index(0, 0);
  EXPECT_TRUE(line.data(gui::CacheLineModel::kFalseSharingRole).toBool());
  EXPECT_TRUE(line.data(Qt::BackgroundRole).value<QColor>().isValid());
  EXPECT_EQ(model.index(0, gui::CacheLineModel::kVerdict).data().toString(), "false sharing");
  EXPECT_EQ(U(model.index(0, gui::CacheLineModel::kWrites).data()), 4000u);
  EXPECT_EQ(U(model.index(0, gui::CacheLineModel::kWriters).data()), 2u);
  EXPECT_GT(U(model.index(0, gui::CacheLineModel::kFalseTransfers).data()), 0u);
  const std::string evidence =
      line.data(gui::CacheLineModel::kEvidenceRole).toString().toStdString();
  EXPECT_THAT(evidence, HasSubstr("FALSE SHARING"));
  EXPECT_THAT(evidence, HasSubstr("2000 writes to g_shared.a (2000)"));
  EXPECT_THAT(evidence, HasSubstr("2000 writes to g_shared.b (2000)"));
  EXPECT_THAT(evidence, HasSubstr("left+0x"));
  EXPECT_THAT(evidence, HasSubstr("right+0x"));

  sel.object = 1;  // g_padded: a and b on two lines, one writer each
  model.SetData(*snap, *snap, sel);
  ASSERT_EQ(model.rowCount(), 2);
  EXPECT_EQ(model.findings(), 0);
  for (int r = 0; r < 2; ++r) {
    EXPECT_FALSE(model.index(r, 0).data(gui::CacheLineModel::kFalseSharingRole).toBool());
    EXPECT_FALSE(model.index(r, 0).data(Qt::BackgroundRole).isValid());
    EXPECT_EQ(U(model.index(r, gui::CacheLineModel::kWriters).data()), 1u);
    EXPECT_EQ(U(model.index(r, gui::CacheLineModel::kWrites).data()), 2000u);
    EXPECT_EQ(model.index(r, gui::CacheLineModel::kVerdict).data().toString(), "one writer");
  }
}

}  // namespace
}  // namespace kwatch
