// watch/recording_summary.h: the profile a recording keeps while it is written gives exactly
// the profile a replay of every event gives (same text, JSON and CSV report, same time columns
// per field and per thread), whatever the session's length, the time columns asked for and
// where the snapshot stopped; and it is not used where it cannot be exact.
#include "watch/recording_summary.h"

#include <sqlite3.h>
#include <unistd.h>

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "core/store/trace_reader.h"
#include "core/store/trace_writer.h"
#include "tests/crafted_recording.h"
#include "tests/scratch_store.h"
#include "watch/profile/report_render.h"
#include "watch/recording.h"

namespace kwatch::watch {
namespace {

constexpr uint64_t kStart = 5'000'000'000;
constexpr uint64_t kStruct = 0x7000;
constexpr uint64_t kArray = 0x9000;

std::string TempPath(const std::string& name) {
  return absl::StrCat(::testing::TempDir(), "/summary_", ::getpid(), "_", name, ".kwdb");
}

core::store::WatchRecord StructWatch() {
  core::store::WatchRecord w;
  w.id = 0;
  w.expr = "g";
  w.address = core::RemoteAddr{kStruct};
  w.length = 64;
  w.kind = "rw";
  w.backend = "perf";
  w.type_name = "struct s";
  for (int i = 0; i < 8; ++i) {
    w.fields.push_back(core::symbols::FieldLayout{.path = absl::StrCat(".f", i),
                                                  .type_name = "int",
                                                  .offset = static_cast<uint64_t>(8 * i),
                                                  .size = 4,
                                                  .is_leaf = true});
  }
  return w;
}

core::store::WatchRecord ArrayWatch() {
  core::store::WatchRecord w;
  w.id = 3;
  w.expr = "t";
  w.address = core::RemoteAddr{kArray};
  w.length = 256;
  w.kind = "w";
  w.backend = "page";
  w.type_name = "long[32]";
  for (int i = 0; i < 32; ++i) {
    w.fields.push_back(core::symbols::FieldLayout{.path = absl::StrCat("[", i, "]"),
                                                  .type_name = "long",
                                                  .offset = static_cast<uint64_t>(8 * i),
                                                  .size = 8,
                                                  .is_leaf = true});
  }
  return w;
}

struct Session {
  uint64_t events = 0;
  uint64_t span_ns = 0;  // events spread over [0, span_ns) after the start
  uint64_t seed = 1;
  size_t batch = 4096;        // events per Flush
  bool finish = true;         // else the writer dies before Finish (cut short)
  bool out_of_order = false;  // a batch earlier than the one before
  bool summary = true;
  bool rows = false;  // events one row each (as schema 6 and older stored them)
};

// Events of 6 threads over both watches: reads, writes, execs, unknown watches, events before
// the start, accesses spanning fields, 80 sites (over the per-field cap), values.
std::vector<core::AccessEvent> Events(const Session& s) {
  std::mt19937_64 rng(s.seed);
  std::vector<core::AccessEvent> out;
  out.reserve(s.events);
  for (uint64_t i = 0; i < s.events; ++i) {
    core::AccessEvent e;
    const uint64_t base = s.span_ns * i / std::max<uint64_t>(s.events, 1);
    e.time_ns = kStart + base + rng() % 50;
    if (i < 3) {
      e.time_ns = kStart - 1000 + i;  // before the start: column 0
    }
    e.pid = 77;
    e.tid = static_cast<pid_t>(100 + rng() % 6);
    e.cpu = static_cast<uint32_t>(rng() % 2);
    const uint64_t r = rng() % 100;
    e.watch_id = r < 60 ? 0 : (r < 98 ? 3 : 9);  // 9: no such watch
    const uint64_t obj = e.watch_id == 3 ? kArray : kStruct;
    e.addr = core::RemoteAddr{obj};
    e.len = e.watch_id == 3 ? 256 : 64;
    e.ip = core::RemoteAddr{0x401000 + (rng() % 80) * 4};
    e.trap_ip = e.ip;
    const uint64_t k = rng() % 10;
    e.kind = k < 4 ? core::AccessKind::kRead
                   : (k < 9 ? core::AccessKind::kWrite : core::AccessKind::kExec);
    e.access_addr = core::RemoteAddr{obj + (rng() % (e.len / 4)) * 4};
    e.access_size = rng() % 7 == 0 ? 16 : (rng() % 5 == 0 ? 0 : 4);
    e.value = rng() % 1000;
    if (rng() % 2 == 0) {
      e.old_value = rng() % 1000;
    }
    e.value_exact = rng() % 3 != 0;
    out.push_back(e);
  }
  return out;
}

std::string Record(const std::string& name, const Session& s) {
  const std::string path = TempPath(name);
  core::store::SessionRecord rec;
  rec.command_line = "kwatch --rw g t -o x.kwdb";
  rec.pid = 77;
  rec.start_mono_ns = kStart;
  rec.start_wall_ns = 1;
  rec.mode = "watch";
  rec.backend = "perf";
  auto w = core::store::TraceWriter::Create(
      path, rec, core::store::TraceWriter::kDefaultBatchSize,
      s.rows ? core::store::EventStorage::kRows : core::store::EventStorage::kBlocks);
  EXPECT_TRUE(w.ok()) << w.status();
  if (s.summary) {
    (*w)->SetSummarySource(MakeProfileSummarySource(kStart));
  }
  EXPECT_TRUE((*w)->AddWatch(StructWatch()).ok());
  EXPECT_TRUE((*w)->AddWatch(ArrayWatch()).ok());
  std::vector<core::AccessEvent> events = Events(s);
  if (s.out_of_order && events.size() > 2 * s.batch) {
    // The second batch's events come first.
    std::rotate(events.begin(), events.begin() + static_cast<std::ptrdiff_t>(s.batch),
                events.begin() + static_cast<std::ptrdiff_t>(2 * s.batch));
  }
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_TRUE((*w)->Append(events[i]).ok());
    if (i % s.batch == s.batch - 1) {
      EXPECT_TRUE((*w)->Flush().ok());
    }
  }
  if (s.finish) {
    core::store::SessionEnd end;
    end.end_mono_ns = kStart + s.span_ns;
    end.end_wall_ns = 2;
    end.exit_reason = "target exited";
    EXPECT_TRUE((*w)->Finish(end).ok());
  }
  w->reset();
  return path;
}

// What the report did before recordings kept their profile: every event replayed.
profile::StorageProfile Replayed(const core::store::TraceReader& r, profile::ProfileOptions opts) {
  std::vector<profile::WatchedObject> objects;
  for (const core::store::WatchRecord& w : r.watches()) {
    objects.push_back(ObjectFromRecord(w));
  }
  opts.start_ns = r.session().start_mono_ns;
  profile::StorageProfile p(std::move(objects), opts);
  EXPECT_TRUE(r.ForEachEvent({}, [&](const core::AccessEvent& e) {
                 p.Add(e);
                 return true;
               }).ok());
  return p;
}

profile::SiteName Namer(core::RemoteAddr ip) {
  return profile::SiteName{absl::StrCat("fn", ip.value % 7), ip.value % 16, "a.c",
                           static_cast<int>(ip.value % 100), ""};
}

// Every output of the report and every time row the viewer reads, equal.
void ExpectSame(const profile::StorageProfile& a, const profile::StorageProfile& b) {
  profile::ReportRenderOptions ropts;
  ropts.width = 140;
  EXPECT_EQ(profile::RenderText(a, Namer, ropts), profile::RenderText(b, Namer, ropts));
  EXPECT_EQ(profile::RenderJson(a, Namer, ropts).dump(1),
            profile::RenderJson(b, Namer, ropts).dump(1));
  EXPECT_EQ(profile::RenderCsv(a, Namer, ropts), profile::RenderCsv(b, Namer, ropts));
  ASSERT_EQ(a.bins().columns(), b.bins().columns());
  EXPECT_EQ(a.bins().width_ns(), b.bins().width_ns());
  EXPECT_EQ(a.late_events(), b.late_events());
  ASSERT_EQ(a.fields().size(), b.fields().size());
  for (uint32_t f = 0; f < a.fields().size(); ++f) {
    for (const bool w : {false, true}) {
      const auto ra = a.FieldBins(f, w);
      const auto rb = b.FieldBins(f, w);
      EXPECT_EQ(std::vector<uint64_t>(ra.begin(), ra.end()),
                std::vector<uint64_t>(rb.begin(), rb.end()))
          << a.fields()[f].path << (w ? " writes" : " reads");
    }
  }
  ASSERT_EQ(a.threads().size(), b.threads().size());
  for (uint32_t t = 0; t < a.threads().size(); ++t) {
    EXPECT_EQ(a.threads()[t].tid, b.threads()[t].tid);
    for (uint32_t f = 0; f < a.fields().size(); ++f) {
      for (const bool w : {false, true}) {
        EXPECT_EQ(a.ThreadFieldBins(t, f, w), b.ThreadFieldBins(t, f, w))
            << "thread " << a.threads()[t].tid << " " << a.fields()[f].path;
      }
    }
  }
}

Session Make(uint64_t events, uint64_t span_ns, uint64_t seed) {
  Session s;
  s.events = events;
  s.span_ns = span_ns;
  s.seed = seed;
  return s;
}
Session WithBatch(Session s, size_t batch) {
  s.batch = batch;
  return s;
}

struct Case {
  const char* name;
  Session session;
  int from_summary;  // of the 5 option sets below, how many the kept profile serves
};

class SummaryExact : public ::testing::TestWithParam<Case> {};

TEST_P(SummaryExact, SameProfileAsReplayForEveryColumnWidth) {
  const Case& c = GetParam();
  const std::string path = Record(c.name, c.session);
  auto reader = core::store::TraceReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  const core::store::TraceReader& r = **reader;
  auto kept = r.ProfileSummary();
  ASSERT_TRUE(kept.ok()) << kept.status();
  ASSERT_TRUE(kept->has_value());
  // Finished: the snapshot covers every event. Cut short ("tail"): the one stored with the
  // batch that brings 131072 events since the last (batches of 5000: 135000, then 270000: the
  // snapshot is far smaller than 4 x 131072 bytes); the 30000 after it are the tail.
  EXPECT_EQ((*kept)->events, c.session.finish ? c.session.events : 270000U);
  std::vector<profile::ProfileOptions> all;
  all.push_back(ReportProfileOptions(r, 0));    // kwatch report
  all.push_back(ReportProfileOptions(r, 0.5));  // --bucket-ms 0.5
  all.push_back(ReportProfileOptions(r, 7.3));  // --bucket-ms 7.3
  profile::ProfileOptions gui;                  // kwatch-gui's first screen: round widths
  gui.initial_bucket_ns = 20'000;
  gui.max_buckets = 333;
  all.push_back(gui);
  all.push_back(profile::ProfileOptions{});  // a cut-short recording's defaults
  int served = 0;
  for (const profile::ProfileOptions& opts : all) {
    SCOPED_TRACE(absl::StrCat("bucket_ns ", opts.bucket_ns, " initial ", opts.initial_bucket_ns,
                              " columns ", opts.max_buckets));
    auto from_summary = ProfileFromSummary(r, opts);
    ASSERT_TRUE(from_summary.ok()) << from_summary.status();
    const profile::StorageProfile replayed = Replayed(r, opts);
    if (!from_summary->has_value()) {
      // Only a fixed-width window that slides is replayed.
      EXPECT_NE(opts.bucket_ns, 0U);
      EXPECT_NE(replayed.bins().first_bucket(), 0U);
      continue;
    }
    ++served;
    EXPECT_EQ((*from_summary)->events(), c.session.events);
    ExpectSame(**from_summary, replayed);
    // ProfileFromRecording takes the same path.
    auto via = ProfileFromRecording(r, {}, opts);
    ASSERT_TRUE(via.ok());
    ExpectSame(*via, replayed);
  }
  EXPECT_EQ(served, c.from_summary);
  std::remove(path.c_str());
}

INSTANTIATE_TEST_SUITE_P(
    Sessions, SummaryExact,
    ::testing::Values(
        // 3 ms: report columns far narrower than a 16.8 ms bin.
        Case{"short", Make(3000, 3'000'000, 1), 5},
        // 12 s: columns of 100 ms, several level-0 and level-1 bins each; --bucket-ms 0.5 slides.
        Case{"medium", WithBatch(Make(60000, 12'000'000'000, 2), 777), 4},
        // 3 hours, sparse: every level; both --bucket-ms windows slide (replayed).
        Case{"long", Make(20000, 3ULL * 3600 * 1'000'000'000, 3), 3},
        // A snapshot during the session and a tail after it (cut short: default columns; both
        // --bucket-ms windows slide).
        Case{"tail",
             [] {
               Session s = WithBatch(Make(300000, 40'000'000'000, 4), 5000);
               s.finish = false;
               return s;
             }(),
             3}),
    [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

TEST(SummaryTest, NotUsedWhenBatchesOverlapInTime) {
  Session s = WithBatch(Make(20000, 2'000'000'000, 5), 1000);
  s.out_of_order = true;
  const std::string path = Record("unordered", s);
  auto reader = core::store::TraceReader::Open(path);
  ASSERT_TRUE(reader.ok());
  auto kept = (*reader)->ProfileSummary();
  ASSERT_TRUE(kept.ok());
  EXPECT_FALSE(kept->has_value());
  const profile::ProfileOptions opts = ReportProfileOptions(**reader, 0);
  auto via = ProfileFromRecording(**reader, {}, opts);
  ASSERT_TRUE(via.ok());
  ExpectSame(*via, Replayed(**reader, opts));
  std::remove(path.c_str());
}

TEST(SummaryTest, RecordingWithoutSummaryIsReplayed) {
  Session s = Make(5000, 1'000'000'000, 6);
  s.summary = false;
  const std::string path = Record("none", s);
  auto reader = core::store::TraceReader::Open(path);
  ASSERT_TRUE(reader.ok());
  auto kept = (*reader)->ProfileSummary();
  ASSERT_TRUE(kept.ok());
  EXPECT_FALSE(kept->has_value());
  auto from_summary = ProfileFromSummary(**reader, {});
  ASSERT_TRUE(from_summary.ok());
  EXPECT_FALSE(from_summary->has_value());
  std::remove(path.c_str());
}

TEST(SummaryTest, SliceIsReplayed) {
  const std::string path = Record("slice", Make(8000, 4'000'000'000, 7));
  auto reader = core::store::TraceReader::Open(path);
  ASSERT_TRUE(reader.ok());
  const core::store::TraceReader& r = **reader;
  RecordingSlice slice{1.0, 2.0, std::nullopt};
  auto p = ProfileFromRecording(r, slice, ReportProfileOptions(r, 0));
  ASSERT_TRUE(p.ok());
  uint64_t n = 0;
  core::store::EventFilter window;
  window.from_ns = kStart + 1'000'000'000;
  window.to_ns = kStart + 2'000'000'000;
  ASSERT_TRUE(r.ForEachEvent(window, [&](const core::AccessEvent&) {
                 ++n;
                 return true;
               }).ok());
  EXPECT_EQ(p->events(), n);
  EXPECT_GT(n, 1500U);
  EXPECT_LT(n, 2500U);
  std::remove(path.c_str());
}

TEST(SummaryTest, TablesHoldTheCounts) {
  // One thread writes field .f1 3 times at 1 ms and reads .f1 once at 20 ms: level 0 has bins
  // 0 and 1, the coarser levels bin 0 with all four.
  const std::string path = TempPath("tables");
  core::store::SessionRecord rec;
  rec.start_mono_ns = kStart;
  rec.mode = "watch";
  auto w = core::store::TraceWriter::Create(path, rec);
  ASSERT_TRUE(w.ok());
  (*w)->SetSummarySource(MakeProfileSummarySource(kStart));
  ASSERT_TRUE((*w)->AddWatch(StructWatch()).ok());
  for (int i = 0; i < 4; ++i) {
    core::AccessEvent e;
    e.time_ns = kStart + (i < 3 ? 1'000'000 : 20'000'000);
    e.pid = 1;
    e.tid = 42;
    e.watch_id = 0;
    e.addr = core::RemoteAddr{kStruct};
    e.len = 64;
    e.access_addr = core::RemoteAddr{kStruct + 8};
    e.access_size = 4;
    e.kind = i < 3 ? core::AccessKind::kWrite : core::AccessKind::kRead;
    ASSERT_TRUE((*w)->Append(e).ok());
  }
  ASSERT_TRUE((*w)->Finish({}).ok());
  w->reset();
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  std::string rows;
  sqlite3_exec(
      db, "SELECT level, bin, tid, field, reads, writes FROM profile_bins ORDER BY 1, 2",
      [](void* out, int n, char** v, char**) {
        auto* s = static_cast<std::string*>(out);
        for (int i = 0; i < n; ++i) {
          absl::StrAppend(s, i == 0 ? "" : " ", v[i]);
        }
        absl::StrAppend(s, "\n");
        return 0;
      },
      &rows, nullptr);
  std::string summary;
  sqlite3_exec(
      db, "SELECT summary_events FROM session",
      [](void* out, int, char** v, char**) {
        *static_cast<std::string*>(out) = v[0];
        return 0;
      },
      &summary, nullptr);
  sqlite3_close(db);
  EXPECT_EQ(rows,
            "0 0 42 1 0 3\n"
            "0 1 42 1 1 0\n"
            "1 0 42 1 1 3\n"
            "2 0 42 1 1 3\n"
            "3 0 42 1 1 3\n");
  EXPECT_EQ(summary, "4");
  std::remove(path.c_str());
}

TEST(SummaryTest, DamagedSnapshotIsAClearError) {
  const std::string path = Record("damaged", Make(2000, 1'000'000'000, 8));
  // Keep the time range (24 bytes), the magic and the version (6): the options are cut off.
  ASSERT_TRUE(
      testing::CraftSql(path, "UPDATE profile_snapshot SET data = substr(data, 1, 30)").ok());
  auto reader = core::store::TraceReader::Open(path);
  ASSERT_TRUE(reader.ok());
  auto p = ProfileFromRecording(**reader, {}, ReportProfileOptions(**reader, 0));
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(p.status().message(),
            absl::StrCat("not a kwatch recording or corrupted: ", path,
                         ": the profile snapshot is damaged: truncated options"));
  std::remove(path.c_str());
}

TEST(SummaryTest, BinsNamingNoSuchThreadAreAClearError) {
  const std::string path = Record("bins", Make(2000, 2'000'000'000, 9));
  ASSERT_TRUE(testing::CraftSql(path, "UPDATE profile_bins SET tid = tid + 1000000").ok());
  auto reader = core::store::TraceReader::Open(path);
  ASSERT_TRUE(reader.ok());
  auto p = ProfileFromRecording(**reader, {}, ReportProfileOptions(**reader, 0));
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(p.status().message(),
            absl::StrCat("not a kwatch recording or corrupted: ", path,
                         ": profile_bins names a thread or field the profile has not"));
  std::remove(path.c_str());
}

std::vector<core::AccessEvent> AllEvents(const core::store::TraceReader& r) {
  std::vector<core::AccessEvent> out;
  EXPECT_TRUE(r.ForEachEvent({}, [&](const core::AccessEvent& e) {
                 out.push_back(e);
                 return true;
               }).ok());
  return out;
}

std::string ReportText(const core::store::TraceReader& r, bool json) {
  auto p = ProfileFromRecording(r, {}, ReportProfileOptions(r, 0));
  EXPECT_TRUE(p.ok()) << p.status();
  if (!p.ok()) {
    return "";
  }
  profile::ReportRenderOptions ropts;
  return json ? profile::RenderJson(*p, Namer, ropts).dump(1)
              : profile::RenderText(*p, Namer, ropts);
}

// The same events, one by one, after an upgrade as before it.
void ExpectSameEvents(const std::vector<core::AccessEvent>& after,
                      const std::vector<core::AccessEvent>& before) {
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i) {
    ASSERT_EQ(after[i].time_ns, before[i].time_ns) << i;
    ASSERT_EQ(after[i].tid, before[i].tid) << i;
    ASSERT_EQ(after[i].access_addr, before[i].access_addr) << i;
    ASSERT_EQ(after[i].value, before[i].value) << i;
    ASSERT_EQ(after[i].old_value, before[i].old_value) << i;
    ASSERT_EQ(after[i].kind, before[i].kind) << i;
  }
}

std::string Sql(const std::string& path, const std::string& sql) {
  return ::kwatch::testing::SqlText(path, sql);
}

TEST(UpgradeTest, AnOlderRecordingReportsTheSameAfterTheUpgrade) {
  Session s = WithBatch(Make(30000, 5'000'000'000, 11), 3000);
  s.summary = false;
  s.rows = true;
  const std::string path = Record("upgrade", s);
  // What schema 6 had: none of schema 7's columns and tables.
  ASSERT_TRUE(testing::CraftSql(path,
                                "ALTER TABLE session DROP COLUMN summary_events;"
                                "ALTER TABLE session DROP COLUMN event_blocks;"
                                "DROP TABLE event_blocks; DROP TABLE profile_snapshot;"
                                "DROP TABLE profile_bins; PRAGMA user_version = 6;")
                  .ok());
  std::string text;
  std::string json;
  std::vector<core::AccessEvent> events;
  {
    auto r = core::store::TraceReader::Open(path);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ((*r)->schema(), 6);
    text = ReportText(**r, false);
    json = ReportText(**r, true);
    events = AllEvents(**r);
  }
  auto n = UpgradeRecording(path);
  ASSERT_TRUE(n.ok()) << n.status();
  ASSERT_TRUE(n->has_value());
  EXPECT_EQ(**n, 30000U);
  EXPECT_EQ(Sql(path, "PRAGMA user_version"), "8");
  EXPECT_EQ(Sql(path, "SELECT event_blocks, summary_events, event_count, complete FROM session"),
            "1 30000 30000 1");
  EXPECT_EQ(Sql(path, "SELECT count(*), sum(count) FROM event_blocks"), "4 30000");
  EXPECT_EQ(Sql(path, "SELECT count(*) FROM events"), "0");
  auto r = core::store::TraceReader::Open(path);
  ASSERT_TRUE(r.ok()) << r.status();
  auto kept = (*r)->ProfileSummary();
  ASSERT_TRUE(kept.ok());
  ASSERT_TRUE(kept->has_value());
  EXPECT_EQ(ReportText(**r, false), text);
  EXPECT_EQ(ReportText(**r, true), json);
  ExpectSameEvents(AllEvents(**r), events);
  // Current now: nothing to do.
  auto again = UpgradeRecording(path);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->has_value());
  std::remove(path.c_str());
}

// A current recording whose batches overlap in time (what kwatch wrote for perf sessions of
// several threads before it put events in time order) is rewritten in time order: its profile
// is kept and serves the report, which says what the replay said.
TEST(UpgradeTest, ARecordingWhoseBatchesOverlapIsRewrittenInTimeOrder) {
  Session s = WithBatch(Make(20000, 2'000'000'000, 13), 1000);
  s.out_of_order = true;
  const std::string path = Record("overlap", s);
  EXPECT_EQ(Sql(path, "SELECT events_in_order, event_blocks FROM session"), "0 1");
  std::string json;
  std::vector<core::AccessEvent> events;
  {
    auto r = core::store::TraceReader::Open(path);
    ASSERT_TRUE(r.ok()) << r.status();
    auto kept = (*r)->ProfileSummary();
    ASSERT_TRUE(kept.ok());
    EXPECT_FALSE(kept->has_value());
    json = ReportText(**r, true);
    events = AllEvents(**r);
  }
  auto n = UpgradeRecording(path);
  ASSERT_TRUE(n.ok()) << n.status();
  ASSERT_TRUE(n->has_value());
  EXPECT_EQ(**n, 20000U);
  EXPECT_EQ(Sql(path, "SELECT events_in_order, summary_events, event_count FROM session"),
            "1 20000 20000");
  auto r = core::store::TraceReader::Open(path);
  ASSERT_TRUE(r.ok()) << r.status();
  auto kept = (*r)->ProfileSummary();
  ASSERT_TRUE(kept.ok());
  EXPECT_TRUE(kept->has_value());
  EXPECT_EQ(ReportText(**r, true), json);
  ExpectSameEvents(AllEvents(**r), events);
  auto again = UpgradeRecording(path);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->has_value());
  std::remove(path.c_str());
}

TEST(UpgradeTest, ARecordingCutShortIsLeftAsItIs) {
  Session s = Make(3000, 1'000'000'000, 12);
  s.rows = true;
  s.finish = false;
  const std::string path = Record("cut", s);
  auto n = UpgradeRecording(path);
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(n.status().message(),
            absl::StrCat(path,
                         ": was cut short; only a finished recording is upgraded (`kwatch export "
                         "--sql OUT ",
                         path, "` copies any)"));
  EXPECT_EQ(Sql(path, "SELECT event_blocks, count(*) FROM session"), "0 1");
  std::remove(path.c_str());
}

}  // namespace
}  // namespace kwatch::watch
