// SessionModel: background loads, the selection feeding every model, follow mode, and bad
// input (missing, corrupted, empty, huge), against recordings made by the real kwatch.
#include "gui/session_model.h"

#include <filesystem>
#include <fstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <QSignalSpy>

#include "absl/strings/str_cat.h"
#include "tests/gui/gui_test_util.h"
#include "tests/test_util.h"

namespace kwatch {
namespace {

using ::kwatch::gui::SessionModel;
using ::kwatch::guitest::FieldWriterRecording;
using ::kwatch::guitest::OpenAndWait;
using ::kwatch::guitest::Recording;
using ::kwatch::guitest::WaitForDetail;
using ::kwatch::guitest::WaitUntil;
using ::testing::HasSubstr;

uint64_t SiteTotal(SessionModel& s) {
  return s.sites()->total_reads() + s.sites()->total_writes();
}

uint64_t HeatSum(const gui::HeatmapModel& m, int r0, int r1, int c0, int c1) {
  uint64_t n = 0;
  for (int r = r0; r <= r1; ++r) {
    for (int c = c0; c <= c1; ++c) {
      n += m.Count(r, c);
    }
  }
  return n;
}

TEST(SessionModel, OpensInTheBackgroundAndFillsEveryModel) {
  const Recording& rec = FieldWriterRecording();
  SessionModel session;
  QSignalSpy started(&session, &SessionModel::LoadStarted);
  QSignalSpy loaded(&session, &SessionModel::Loaded);
  QSignalSpy detail(&session, &SessionModel::DetailLoaded);
  session.Open(QString::fromStdString(rec.path));
  EXPECT_EQ(started.count(), 1);
  EXPECT_TRUE(session.loading());
  EXPECT_EQ(loaded.count(), 0);  // not before the event loop delivers the result
  ASSERT_TRUE(WaitUntil([&] { return loaded.count() == 1; }));
  EXPECT_FALSE(session.loading());
  EXPECT_EQ(detail.count(), 1);
  EXPECT_EQ(session.fields()->rowCount(), 1);
  EXPECT_EQ(session.heatmap()->rowCount(), 8);
  EXPECT_EQ(session.heatmap()->total(), 5250u);
  EXPECT_EQ(session.timeline()->total_reads() + session.timeline()->total_writes(), 5250u);
  EXPECT_EQ(SiteTotal(session), 5250u);
  EXPECT_EQ(session.threads()->rowCount(), 3);
  EXPECT_EQ(session.cache_lines()->rowCount(), 1);
  EXPECT_EQ(session.detail_snapshot(), session.main_snapshot());
  const auto threads = session.Threads();
  ASSERT_EQ(threads.size(), 3u);
  for (const auto& [tid, n] : threads) {
    const guitest::Truth& t = rec.truth.at(tid);
    EXPECT_EQ(n, static_cast<uint64_t>(t.hits_w + t.misses_w + t.flags_r));
  }
  const std::string summary = session.Summary().toStdString();
  EXPECT_THAT(summary, HasSubstr("5250 events, 3 threads"));
  EXPECT_THAT(summary, HasSubstr("backend page"));
  EXPECT_THAT(summary, HasSubstr("complete: target exited (status 0)"));
}

TEST(SessionModel, TimeSelectionLoadsASliceThatNarrowsSitesAndThreads) {
  const Recording& rec = FieldWriterRecording();
  SessionModel session;
  ASSERT_TRUE(OpenAndWait(session, rec.path));
  const gui::HeatmapModel& heat = *session.heatmap();
  int first = -1;
  int last = -1;
  for (int c = 0; c < heat.columnCount(); ++c) {
    if (heat.Count(0, c) + heat.Count(1, c) + heat.Count(2, c) > 0) {
      last = c;
      first = first < 0 ? c : first;
    }
  }
  ASSERT_GT(last, first + 4);
  const int c0 = first + 2;
  const int c1 = (first + last) / 2;
  QSignalSpy detail(&session, &SessionModel::DetailLoaded);
  session.SetTimeSelection(heat.ColumnStartNs(c0), heat.ColumnStartNs(c1 + 1));
  EXPECT_TRUE(session.detail_pending());
  ASSERT_TRUE(WaitForDetail(session));
  EXPECT_EQ(detail.count(), 1);
  ASSERT_NE(session.detail_snapshot(), session.main_snapshot());
  // The slice holds exactly the events of those columns: the sites table adds up to the
  // heatmap's cells there, per field and in all.
  const uint64_t want = HeatSum(heat, 0, 7, c0, c1);
  ASSERT_GT(want, 0u);
  EXPECT_LT(want, 5250u);
  EXPECT_EQ(SiteTotal(session), want);
  EXPECT_EQ(session.detail_snapshot()->profile->events(), want);
  uint64_t per_thread = 0;
  for (int r = 0; r < session.threads()->rowCount(); ++r) {
    per_thread += session.threads()->ReadsAt(r) + session.threads()->WritesAt(r);
  }
  EXPECT_EQ(per_thread, want);
  EXPECT_EQ(session.timeline()->rowCount(), c1 - c0 + 1);
  EXPECT_EQ(session.timeline()->total_reads() + session.timeline()->total_writes(), want);

  // A field within the range: no new load, the slice's sites of that field.
  session.SetFieldSelection({heat.FieldAt(1)});
  EXPECT_FALSE(session.detail_pending());
  ASSERT_EQ(session.sites()->rowCount(), 1);
  EXPECT_EQ(session.sites()->total_writes(), HeatSum(heat, 1, 1, c0, c1));

  // Clearing goes back to the whole recording without a load.
  session.ClearSelection();
  EXPECT_FALSE(session.detail_pending());
  EXPECT_EQ(session.detail_snapshot(), session.main_snapshot());
  EXPECT_EQ(SiteTotal(session), 5250u);
}

TEST(SessionModel, ThreadFilterAppliesToMatrixSitesAndThreads) {
  const Recording& rec = FieldWriterRecording();
  SessionModel session;
  ASSERT_TRUE(OpenAndWait(session, rec.path));
  const auto& [tid, truth] = *rec.truth.rbegin();
  const uint64_t mine = static_cast<uint64_t>(truth.hits_w + truth.misses_w + truth.flags_r);
  session.SetThreadFilter(tid);
  // The matrix changes at once (the profile keeps per-thread columns) ...
  EXPECT_EQ(session.heatmap()->total(), mine);
  EXPECT_EQ(session.timeline()->total_writes(),
            static_cast<uint64_t>(truth.hits_w + truth.misses_w));
  // ... the sites and threads after the thread's slice is loaded.
  ASSERT_TRUE(WaitForDetail(session));
  EXPECT_EQ(SiteTotal(session), mine);
  ASSERT_EQ(session.threads()->rowCount(), 1);
  EXPECT_EQ(session.threads()->TidAt(0), tid);
  session.SetThreadFilter(std::nullopt);
  EXPECT_FALSE(session.detail_pending());
  EXPECT_EQ(session.heatmap()->total(), 5250u);
  EXPECT_EQ(session.threads()->rowCount(), 3);
}

TEST(SessionModel, ANewerOpenWinsOverAnOlderOneStillLoading) {
  const Recording& a = FieldWriterRecording();
  const Recording& b = FieldWriterRecording(2, 200);
  SessionModel session;
  QSignalSpy loaded(&session, &SessionModel::Loaded);
  session.Open(QString::fromStdString(a.path));
  session.Open(QString::fromStdString(b.path));
  ASSERT_TRUE(WaitUntil([&] { return loaded.count() >= 1 && !session.loading(); }));
  QCoreApplication::processEvents();
  EXPECT_EQ(loaded.count(), 1);
  EXPECT_EQ(session.main_snapshot()->request.path, b.path);
  EXPECT_EQ(session.heatmap()->total(), 2u * (200 + 100 + 50));
}

TEST(SessionModel, MissingFileIsAClearError) {
  SessionModel session;
  QSignalSpy failed(&session, &SessionModel::LoadFailed);
  const std::string path = guitest::TempPath("missing.kwdb");
  EXPECT_FALSE(OpenAndWait(session, path));
  ASSERT_EQ(failed.count(), 1);
  EXPECT_EQ(failed[0][0].toString().toStdString(), path + ": no such recording");
  EXPECT_EQ(session.error().toStdString(), path + ": no such recording");
  EXPECT_EQ(session.main_snapshot(), nullptr);
}

TEST(SessionModel, CorruptedFilesAreClearErrorsAndKeepWhatWasShown) {
  const Recording& rec = FieldWriterRecording();
  SessionModel session;
  ASSERT_TRUE(OpenAndWait(session, rec.path));
  // Not SQLite at all.
  const std::string garbage = guitest::TempPath("garbage.kwdb");
  {
    std::ofstream out(garbage);
    for (int i = 0; i < 4096; ++i) {
      out << "this is not a recording ";
    }
  }
  EXPECT_FALSE(OpenAndWait(session, garbage));
  EXPECT_THAT(session.error().toStdString(),
              HasSubstr("not a kwatch recording or corrupted: " + garbage));
  EXPECT_EQ(session.main_snapshot()->request.path, rec.path);  // still showing the old one
  EXPECT_EQ(session.heatmap()->total(), 5250u);
  // A real recording cut in half.
  const std::string half = guitest::TempPath("half.kwdb");
  std::filesystem::copy_file(rec.path, half);
  std::filesystem::resize_file(half, std::filesystem::file_size(half) / 2);
  EXPECT_FALSE(OpenAndWait(session, half));
  EXPECT_THAT(session.error().toStdString(), HasSubstr("not a kwatch recording or corrupted"));
  EXPECT_THAT(session.error().toStdString(), HasSubstr(half));
}

TEST(SessionModel, ARecordingWithoutEventsLoadsEmpty) {
  // field_writer never touches g_stats.tag.
  const Recording rec = guitest::Record("zero", {"--rw", "g_stats.tag"},
                                        {guitest::TargetPath("field_writer"), "2", "100"});
  SessionModel session;
  ASSERT_TRUE(OpenAndWait(session, rec.path)) << session.error().toStdString();
  EXPECT_EQ(session.main_snapshot()->profile->events(), 0u);
  EXPECT_EQ(session.heatmap()->rowCount(), 1);
  EXPECT_EQ(session.heatmap()->columnCount(), 0);
  EXPECT_EQ(session.heatmap()->total(), 0u);
  EXPECT_EQ(session.sites()->rowCount(), 0);
  EXPECT_EQ(session.threads()->rowCount(), 0);
  EXPECT_EQ(session.timeline()->rowCount(), 0);
  EXPECT_THAT(session.Summary().toStdString(), HasSubstr("0 events, 0 threads"));
}

TEST(SessionModel, ThousandsOfFieldsLoadWithExactCounts) {
  const Recording rec =
      guitest::Record("big", {"--write", "g_table"}, {guitest::GuiTargetPath("big_table")});
  ASSERT_THAT(rec.out, HasSubstr("done 63"));
  SessionModel session;
  ASSERT_TRUE(OpenAndWait(session, rec.path)) << session.error().toStdString();
  const watch::profile::StorageProfile& p = *session.main_snapshot()->profile;
  ASSERT_EQ(p.fields().size(), 64u * 47u);
  EXPECT_EQ(p.events(), 128u);
  gui::HeatmapModel& heat = *session.heatmap();
  ASSERT_EQ(heat.rowCount(), 3008);
  EXPECT_EQ(heat.RowLabel(0), "[0].key");
  EXPECT_EQ(heat.RowLabel(47 * 5 + 1 + 5), "[5].cells[5]");
  EXPECT_EQ(heat.RowLabel(3007), "[63].tags[13]");
  EXPECT_EQ(heat.total(), 128u);
  // Each row's key and its cells[r % 32] were written once; nothing else.
  for (int r = 0; r < 64; ++r) {
    for (int f = 0; f < 47; ++f) {
      uint64_t n = 0;
      for (int c = 0; c < heat.columnCount(); ++c) {
        n += heat.Count(r * 47 + f, c);
      }
      const bool written = f == 0 || f == 1 + r % 32;
      ASSERT_EQ(n, written ? 1u : 0u) << heat.RowLabel(r * 47 + f).toStdString();
    }
  }
  EXPECT_EQ(session.fields()->rowCount(session.fields()->ObjectIndex(0)), 3008);
  EXPECT_EQ(session.sites()->rowCount(), 2);
  EXPECT_EQ(SiteTotal(session), 128u);
  // 64 rows of 168 bytes: 10752 bytes over 168 or 169 cache lines.
  EXPECT_GE(session.cache_lines()->rowCount(), 168);
  EXPECT_LE(session.cache_lines()->rowCount(), 169);
}

TEST(SessionModel, FollowModeShowsARecordingAsItGrows) {
  const std::string path = guitest::TempPath("follow.kwdb");
  SessionModel session;
  session.SetFollowInterval(150);
  QSignalSpy status(&session, &SessionModel::FollowStatus);
  std::vector<uint64_t> seen;
  std::vector<bool> complete;
  QObject::connect(&session, &SessionModel::Loaded, [&] {
    seen.push_back(session.main_snapshot()->profile->events());
    complete.push_back(session.main_snapshot()->complete);
  });
  // Open before kwatch creates the file: follow mode waits for it.
  session.Open(QString::fromStdString(path), /*follow=*/true);
  ASSERT_TRUE(WaitUntil([&] { return status.count() > 0; }));
  EXPECT_THAT(status[0][0].toString().toStdString(), HasSubstr("Waiting for " + path));
  // Page mode (exact: nothing lost, a fault of about 100 us an access) makes the session last
  // about a second, so that a load lands while kwatch is still recording on any host: in perf
  // stream mode the whole session fit between two polls under ASan here, ten times the writes
  // overflowed the ring, and stop mode sees nothing where the hypervisor drops debug traps.
  auto kw =
      testing::Spawned::Start({testing::KwatchPath(), "-q", "--backend", "page", "--rw", "g_stats",
                               "-o", path, "--", guitest::TargetPath("field_writer"), "2", "3000"});
  ASSERT_TRUE(kw.ok()) << kw.status();
  ASSERT_TRUE(WaitUntil([&] { return !complete.empty() && complete.back(); }, 120000))
      << "events seen: " << seen.size();
  auto done = (*kw)->Finish();
  ASSERT_TRUE(done.ok());
  EXPECT_EQ(done->exit_code, 0) << done->err;
  // At least one load while kwatch was still recording, then the complete recording with
  // every event: 2 x (3000 + 1500 + 750).
  ASSERT_GE(seen.size(), 2u);
  EXPECT_FALSE(complete.front());
  EXPECT_EQ(seen.back(), 10500u);
  EXPECT_TRUE(std::is_sorted(seen.begin(), seen.end()));
  EXPECT_EQ(session.heatmap()->total(), 10500u);
  // Following stops with the complete recording.
  EXPECT_THAT(status.last()[0].toString().toStdString(), HasSubstr("complete"));
  const size_t loads = seen.size();
  WaitUntil([] { return false; }, 500);
  EXPECT_EQ(seen.size(), loads);
}

}  // namespace
}  // namespace kwatch
