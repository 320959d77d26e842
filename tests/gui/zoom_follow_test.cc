// The viewer on long and growing recordings (issue 27, item 5): zoomed in, the heatmap reads
// the window's counts from the recording's finer profile_bins (watch::HeatInWindow) and they
// equal what the events say; follow mode reads only the events committed since its last
// look. The recordings are written here through the real TraceWriter, with the profile kept
// while recording as `kwatch -o` keeps it, so that the expected counts come from the events.
#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include <QAbstractItemModelTester>

#include "core/event.h"
#include "core/store/trace_records.h"
#include "core/store/trace_writer.h"
#include "gui/session_model.h"
#include "tests/gui/gui_test_util.h"
#include "watch/recording_summary.h"

namespace kwatch {
namespace {

using ::kwatch::gui::SessionModel;
using ::kwatch::guitest::WaitUntil;

constexpr uint64_t kStart = 5'000'000'000'000ULL;
constexpr uint64_t kStepNs = 20'000;  // 50,000 events/s
constexpr uint64_t kBase = 0x7000'0000ULL;
constexpr int kFields = 8;

core::AccessEvent MakeEvent(uint64_t i) {
  core::AccessEvent e;
  e.time_ns = kStart + i * kStepNs;
  e.pid = 100;
  e.tid = static_cast<pid_t>(100 + i % 3);
  e.cpu = 0;
  e.watch_id = 0;
  const uint64_t field = (i * 7 + i / 5) % kFields;
  e.ip = core::RemoteAddr{0x401000 + (i % 5) * 0x10};
  e.trap_ip = e.ip;
  e.addr = core::RemoteAddr{kBase};
  e.len = 8 * kFields;
  e.access_addr = core::RemoteAddr{kBase + 8 * field};
  e.access_size = 8;
  e.kind = i % 3 == 0 ? core::AccessKind::kRead : core::AccessKind::kWrite;
  e.value = i;
  e.value_exact = true;
  return e;
}

uint32_t FieldOf(uint64_t i) {
  return static_cast<uint32_t>((i * 7 + i / 5) % kFields);
}

core::store::WatchRecord Watch() {
  core::store::WatchRecord w;
  w.id = 0;
  w.expr = "g_flat";
  w.address = core::RemoteAddr{kBase};
  w.length = 8 * kFields;
  w.kind = "rw";
  w.backend = "perf";
  w.coverage = "all";
  w.type_name = "struct flat";
  for (int f = 0; f < kFields; ++f) {
    w.fields.push_back(core::symbols::FieldLayout{.path = ".f" + std::to_string(f),
                                                  .type_name = "long",
                                                  .offset = static_cast<uint64_t>(8 * f),
                                                  .size = 8});
  }
  return w;
}

// A writer of `path` with the profile kept while recording, the watch added.
std::unique_ptr<core::store::TraceWriter> NewWriter(const std::string& path) {
  core::store::SessionRecord s = core::store::SessionRecordForThisHost();
  s.command_line = "kwatch --rw g_flat -o zoom.kwdb -- ./flat";
  s.pid = 100;
  s.kwatch_version = "test";
  s.mode = "watch";
  s.backend = "perf";
  s.start_mono_ns = kStart;
  auto w = core::store::TraceWriter::Create(path, s);
  if (!w.ok()) {
    ADD_FAILURE() << w.status();
    return nullptr;
  }
  (*w)->SetSummarySource(watch::MakeProfileSummarySource(kStart));
  EXPECT_TRUE((*w)->AddWatch(Watch()).ok());
  return std::move(*w);
}

// Events [first, last) appended, a Flush every 2500 (a drain every 50 ms).
void Append(core::store::TraceWriter& w, uint64_t first, uint64_t last) {
  for (uint64_t i = first; i < last; ++i) {
    ASSERT_TRUE(w.Append(MakeEvent(i)).ok());
    if (i % 2500 == 2499) {
      ASSERT_TRUE(w.Flush().ok());
    }
  }
  ASSERT_TRUE(w.Flush().ok());
}

constexpr uint64_t kEvents = 240'000;  // 4.8 s

// A finished recording of kEvents events. `overlapping`: committed in batches that overlap in
// time (each pair of 2500-event chunks the later first), as several CPUs' rings drain.
std::string FinishedRecording(bool overlapping) {
  const std::string p = guitest::TempPath(overlapping ? "zoom_overlap.kwdb" : "zoom.kwdb");
  auto w = NewWriter(p);
  if (!overlapping) {
    Append(*w, 0, kEvents);
  } else {
    constexpr uint64_t kChunk = 2500;
    for (uint64_t c = 0; c < kEvents / kChunk; c += 2) {
      Append(*w, (c + 1) * kChunk, (c + 2) * kChunk);
      Append(*w, c * kChunk, (c + 1) * kChunk);
    }
  }
  core::store::SessionEnd end;
  end.end_mono_ns = kStart + kEvents * kStepNs;
  end.exit_status = 0;
  end.exit_reason = "target exited";
  EXPECT_TRUE(w->Finish(end).ok());
  return p;
}

const std::string& FinishedRecording() {
  static const std::string* path = new std::string(FinishedRecording(false));
  return *path;
}

// What the events say: reads and writes per (field, column) of [from, to) in columns of
// `width` ns, for one thread or all.
using Grid = std::map<std::pair<uint32_t, int>, std::pair<uint64_t, uint64_t>>;
Grid Expected(uint64_t from, uint64_t to, uint64_t width, std::optional<pid_t> tid) {
  Grid g;
  for (uint64_t i = 0; i < kEvents; ++i) {
    const core::AccessEvent e = MakeEvent(i);
    const uint64_t t = e.time_ns - kStart;
    if (t < from || t >= to || (tid.has_value() && e.tid != *tid)) {
      continue;
    }
    auto& cell = g[{FieldOf(i), static_cast<int>((t - from) / width)}];
    (e.kind == core::AccessKind::kWrite ? cell.second : cell.first) += 1;
  }
  return g;
}

// Zooms to [from, to) in `columns` columns and compares every cell with the events.
void ExpectZoomExact(SessionModel& session, uint64_t from, uint64_t to, uint32_t columns,
                     std::optional<pid_t> tid) {
  session.SetViewRange(std::make_pair(from, to), columns);
  ASSERT_TRUE(WaitUntil([&] {
    return !session.zoom_pending() && session.heatmap()->zoom() != nullptr &&
           session.heatmap()->zoom()->request.from_ns == from &&
           session.heatmap()->zoom()->request.columns == columns &&
           session.heatmap()->zoom()->request.tid == tid;
  }));
  const gui::HeatmapModel& m = *session.heatmap();
  const uint64_t width = (to - from + columns - 1) / columns;
  ASSERT_EQ(m.columnCount(), static_cast<int>((to - from + width - 1) / width));
  EXPECT_EQ(m.ColumnStartNs(0), from);
  EXPECT_EQ(m.ColumnStartNs(m.columnCount()), to);
  EXPECT_EQ(m.bucket_ns(), width);
  const Grid want = Expected(from, to, width, tid);
  uint64_t total = 0;
  for (int row = 0; row < m.rowCount(); ++row) {
    const uint32_t f = m.FieldAt(row);
    for (int c = 0; c < m.columnCount(); ++c) {
      const auto it = want.find({f, c});
      const std::pair<uint64_t, uint64_t> rw =
          it == want.end() ? std::pair<uint64_t, uint64_t>{0, 0} : it->second;
      ASSERT_EQ(m.Reads(row, c), rw.first) << "field " << f << " column " << c;
      ASSERT_EQ(m.Writes(row, c), rw.second) << "field " << f << " column " << c;
      total += rw.first + rw.second;
    }
  }
  EXPECT_EQ(m.total(), total);
  EXPECT_GT(total, 0u);
}

TEST(ZoomTest, AOneSecondWindowReadsTheFinerBinsAndCountsExactlyWhatTheEventsSay) {
  SessionModel session;
  QAbstractItemModelTester tester(session.heatmap(),
                                  QAbstractItemModelTester::FailureReportingMode::Fatal);
  ASSERT_TRUE(guitest::OpenAndWait(session, FinishedRecording()));
  const int whole_columns = session.heatmap()->columnCount();
  // One second, its edges inside 16.8 ms bins: 16 columns of 62.5 ms.
  const uint64_t from = 1'300'123'457;
  const uint64_t to = from + 1'000'000'000;
  ExpectZoomExact(session, from, to, 16, std::nullopt);
  const watch::WindowHeat& heat = session.heatmap()->zoom()->heat;
  EXPECT_EQ(heat.finest_level, 0);  // 16.8 ms bins inside each column
  EXPECT_GT(heat.bin_reads, 0u);
  // Only the column edges' events: far fewer than the window's 50,000.
  EXPECT_LT(heat.events_read, 20'000u) << heat.events_read;
  RecordProperty("one_second_bin_reads", static_cast<int>(heat.bin_reads));
  RecordProperty("one_second_events_read", static_cast<int>(heat.events_read));
  RecordProperty("one_second_load_ms",
                 static_cast<int>(session.heatmap()->zoom()->load_seconds * 1000));
  // One thread.
  session.SetThreadFilter(101);
  ExpectZoomExact(session, from, to, 16, 101);
  session.SetThreadFilter(std::nullopt);
  // Columns narrower than a bin: the window's events.
  ExpectZoomExact(session, from, to, 240, std::nullopt);
  EXPECT_EQ(session.heatmap()->zoom()->heat.finest_level, -1);
  // A long window: 268 ms bins inside its 560 ms columns.
  ExpectZoomExact(session, 200'000'000, 4'700'000'000, 8, std::nullopt);
  EXPECT_EQ(session.heatmap()->zoom()->heat.finest_level, 0);
  EXPECT_LT(session.heatmap()->zoom()->heat.events_read, 20'000u);
  // Back to the whole recording: the snapshot's own columns.
  session.SetViewRange(std::nullopt);
  EXPECT_EQ(session.heatmap()->zoom(), nullptr);
  EXPECT_EQ(session.heatmap()->columnCount(), whole_columns);
  EXPECT_EQ(session.heatmap()->total(), kEvents);
}

// Batches that overlap in time: the snapshot is not used (it saw another order than a replay),
// but counts do not depend on the order, and the window still reads the bins.
TEST(ZoomTest, BatchesOverlappingInTimeStillZoomThroughTheBins) {
  const std::string path = FinishedRecording(true);
  SessionModel session;
  ASSERT_TRUE(guitest::OpenAndWait(session, path));
  const uint64_t from = 2'000'000'001;
  ExpectZoomExact(session, from, from + 1'000'000'000, 16, std::nullopt);
  EXPECT_EQ(session.heatmap()->zoom()->heat.finest_level, 0);
  EXPECT_LT(session.heatmap()->zoom()->heat.events_read, 20'000u);
}

// Per field: reads + writes in the shown (main) profile.
std::array<uint64_t, kFields> FieldTotals(const SessionModel& s) {
  std::array<uint64_t, kFields> out{};
  for (uint32_t f = 0; f < kFields; ++f) {
    out[f] = s.main_snapshot()->profile->field_counts(f).total();
  }
  return out;
}

TEST(FollowTest, AGrowingRecordingGrowsByExactlyTheAppendedEventsReadAlone) {
  const std::string path = guitest::TempPath("follow_grow.kwdb");
  auto w = NewWriter(path);
  ASSERT_NE(w, nullptr);
  constexpr uint64_t kFirst = 30'000;
  Append(*w, 0, kFirst);
  SessionModel session;
  session.SetFollowInterval(50);
  session.Open(QString::fromStdString(path), /*follow=*/true);
  ASSERT_TRUE(WaitUntil([&] {
    return session.main_snapshot() != nullptr && session.main_snapshot()->recorded_events == kFirst;
  }));
  EXPECT_TRUE(session.following());
  EXPECT_FALSE(session.main_snapshot()->incremental);  // the first load reads it whole
  const std::array<uint64_t, kFields> before = FieldTotals(session);
  const uint64_t heat_before = session.heatmap()->total();
  EXPECT_EQ(heat_before, kFirst);

  constexpr uint64_t kMore = 7'001;
  Append(*w, kFirst, kFirst + kMore);
  ASSERT_TRUE(
      WaitUntil([&] { return session.main_snapshot()->recorded_events == kFirst + kMore; }));
  const gui::Snapshot& grown = *session.main_snapshot();
  EXPECT_TRUE(grown.incremental);
  EXPECT_EQ(grown.events_read, kMore);  // only the new events were read
  std::array<uint64_t, kFields> appended{};
  for (uint64_t i = kFirst; i < kFirst + kMore; ++i) {
    ++appended[FieldOf(i)];
  }
  const std::array<uint64_t, kFields> after = FieldTotals(session);
  for (int f = 0; f < kFields; ++f) {
    EXPECT_EQ(after[f] - before[f], appended[f]) << "field " << f;
  }
  EXPECT_EQ(session.heatmap()->total(), heat_before + kMore);
  EXPECT_EQ(grown.profile->events(), kFirst + kMore);

  // Follow off: nothing more is read; on again: the rest, still incrementally.
  session.SetFollow(false);
  ASSERT_TRUE(session.WaitIdle(30000));  // a poll already under way ends first
  const uint64_t shown = session.main_snapshot()->recorded_events;
  ASSERT_EQ(shown, kFirst + kMore);
  Append(*w, kFirst + kMore, kFirst + 2 * kMore);
  WaitUntil([] { return false; }, 300);
  EXPECT_EQ(session.main_snapshot()->recorded_events, kFirst + kMore);
  session.SetFollow(true);
  ASSERT_TRUE(
      WaitUntil([&] { return session.main_snapshot()->recorded_events == kFirst + 2 * kMore; }));
  EXPECT_TRUE(session.main_snapshot()->incremental);
  EXPECT_EQ(session.main_snapshot()->events_read, kMore);
  EXPECT_EQ(session.heatmap()->total(), kFirst + 2 * kMore);

  // Complete: loaded whole once more, and following stops.
  ASSERT_TRUE(w->Finish(core::store::SessionEnd{}).ok());
  ASSERT_TRUE(WaitUntil([&] { return session.main_snapshot()->complete; }));
  EXPECT_FALSE(session.main_snapshot()->incremental);
  EXPECT_FALSE(session.following());
  EXPECT_EQ(session.heatmap()->total(), kFirst + 2 * kMore);
}

}  // namespace
}  // namespace kwatch
