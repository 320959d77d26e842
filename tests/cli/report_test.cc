// End-to-end tests of recordings: `kwatch ... -o FILE`, then `kwatch report FILE`, compared
// with the ground truth the target prints about itself.
#include <signal.h>
#include <sqlite3.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "tests/cli/cli_test_util.h"
#include "tests/scratch_store.h"
#include "tests/test_util.h"

namespace kwatch {
namespace {

using ::kwatch::clitest::LaunchedTarget;
using ::kwatch::clitest::ReadTruth;
using ::kwatch::clitest::RunKwatch;
using ::kwatch::clitest::SourceLine;
using ::kwatch::clitest::Truth;
using ::kwatch::clitest::TruthFile;
using ::kwatch::testing::KwatchPath;
using ::kwatch::testing::RunResult;
using ::kwatch::testing::SqlText;
using ::kwatch::testing::TargetPath;
using ::testing::HasSubstr;
using json = nlohmann::json;

std::string TempFile(const std::string& name) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/", name, "-", getpid());
  std::filesystem::remove(path);
  std::filesystem::remove(path + "-wal");
  std::filesystem::remove(path + "-shm");
  return path;
}

json ReportJson(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"report"};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.push_back("--format=json");
  const RunResult r = RunKwatch(argv);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  json j = json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(j.is_discarded()) << r.out;
  return j;
}

const json* Field(const json& watch, const std::string& path) {
  for (const json& f : watch["fields"]) {
    if (f["path"] == path) {
      return &f;
    }
  }
  ADD_FAILURE() << "no field " << path << " in " << watch["fields"].dump();
  return nullptr;
}

// field_writer 3 x 1000 watched read-write and recorded: its report has every access of every
// field, per thread, at the right source lines.
TEST(Recording, ReportHasEveryAccessPerFieldAndThread) {
  const std::string db = TempFile("fw.kwdb");
  const std::string truth_path = TruthFile("record");
  const RunResult rec = RunKwatch({"-q", "--rw", "g_stats", "-o", db, "--",
                                   TargetPath("field_writer"), "3", "1000", "--truth", truth_path});
  ASSERT_EQ(rec.exit_code, 0) << rec.err;
  EXPECT_THAT(rec.err, HasSubstr(absl::StrCat("recorded 5250 events to ", db)));
  const std::map<int, Truth> truth = ReadTruth(truth_path);
  ASSERT_EQ(truth.size(), 3u);

  const json j = ReportJson({db});
  EXPECT_EQ(j["session"]["complete"], true);
  EXPECT_EQ(j["session"]["events"], 5250);
  EXPECT_EQ(j["session"]["exit_status"], 0);
  EXPECT_EQ(j["session"]["mode"], "watch");
  EXPECT_THAT(j["session"]["command"].get<std::string>(), HasSubstr("-o " + db));
  ASSERT_EQ(j["watches"].size(), 1u);
  const json& w = j["watches"][0];
  EXPECT_EQ(w["expr"], "g_stats");
  EXPECT_EQ(w["length"], 32);
  EXPECT_EQ(w["reads"], 750);
  EXPECT_EQ(w["writes"], 4500);
  const json* hits = Field(w, "g_stats.hits");
  const json* misses = Field(w, "g_stats.misses");
  const json* flags = Field(w, "g_stats.flags");
  const json* tag = Field(w, "g_stats.tag");
  ASSERT_TRUE(hits && misses && flags && tag);
  EXPECT_EQ((*hits)["writes"], 3000);
  EXPECT_EQ((*hits)["reads"], 0);
  EXPECT_EQ((*hits)["threads"], 3);
  EXPECT_EQ((*misses)["writes"], 1500);
  EXPECT_EQ((*flags)["reads"], 750);
  EXPECT_EQ((*tag)["reads"], 0);
  EXPECT_EQ((*tag)["writes"], 0);
  ASSERT_FALSE((*hits)["top_sites"].empty());
  EXPECT_EQ((*hits)["top_sites"][0]["function"], "Work");
  EXPECT_EQ((*hits)["top_sites"][0]["line"], SourceLine("g_stats.hits = i;"));
  EXPECT_EQ((*misses)["top_sites"][0]["line"], SourceLine("g_stats.misses = (int)i;"));
  // The last value written to hits is the last iteration's i.
  ASSERT_FALSE((*hits)["last_values"].empty());
  EXPECT_EQ((*hits)["last_values"].back()["value"], 999);
  // Per thread, exactly what each thread says it did.
  ASSERT_EQ(w["threads"].size(), 3u);
  for (const json& t : w["threads"]) {
    const Truth& want = truth.at(t["tid"].get<int>());
    std::map<std::string, std::pair<long, long>> got;
    for (const json& f : t["fields"]) {
      got[f["path"]] = {f["reads"].get<long>(), f["writes"].get<long>()};
    }
    EXPECT_EQ(got["g_stats.hits"].second, want.hits_w);
    EXPECT_EQ(got["g_stats.misses"].second, want.misses_w);
    EXPECT_EQ(got["g_stats.flags"].first, want.flags_r);
  }
  // Heatmap rows sum to the field counts.
  uint64_t heat = 0;
  for (const json& row : w["heatmap"]["rows"]) {
    if (row["path"] == "g_stats.hits") {
      for (const json& n : row["writes"]) {
        heat += n.get<uint64_t>();
      }
    }
  }
  EXPECT_EQ(heat, 3000u);
}

// Four threads on two CPUs: perf's rings, one per CPU, are drained one after the other, so the
// events arrive out of time order; the recording still has them in time order (batches that do
// not overlap: events_in_order), so its profile snapshot serves the report, which gives each
// thread's exact counts, the same as a replay of every event (--from 0).
TEST(Recording, EventsOfThreadsOnSeveralCpusAreRecordedInTimeOrder) {
  const std::string db = TempFile("order.kwdb");
  const std::string truth_path = TruthFile("order");
  const RunResult rec =
      RunKwatch({"-q", "--rw", "g_stats", "-o", db, "--", TargetPath("field_writer"), "4", "20000",
                 "--truth", truth_path});
  ASSERT_EQ(rec.exit_code, 0) << rec.err;
  EXPECT_THAT(rec.err, HasSubstr(absl::StrCat("recorded 140000 events to ", db)));
  EXPECT_EQ(SqlText(db,
                    "SELECT event_count, lost_count, events_in_order, summary_events FROM "
                    "session"),
            "140000 0 1 140000");
  const std::map<int, Truth> truth = ReadTruth(truth_path);
  ASSERT_EQ(truth.size(), 4u);
  auto per_thread = [](const json& report) {
    std::map<int, Truth> got;
    for (const json& t : report["watches"][0]["threads"]) {
      Truth& g = got[t["tid"].get<int>()];
      for (const json& f : t["fields"]) {
        if (f["path"] == "g_stats.hits") {
          g.hits_w = f["writes"].get<long>();
        } else if (f["path"] == "g_stats.misses") {
          g.misses_w = f["writes"].get<long>();
        } else if (f["path"] == "g_stats.flags") {
          g.flags_r = f["reads"].get<long>();
        }
      }
    }
    return got;
  };
  const json whole = ReportJson({db});
  const json replayed = ReportJson({db, "--from=0"});
  for (const json* j : {&whole, &replayed}) {
    const std::map<int, Truth> got = per_thread(*j);
    ASSERT_EQ(got.size(), 4u) << (*j)["watches"][0]["threads"].dump();
    for (const auto& [tid, want] : truth) {
      ASSERT_TRUE(got.contains(tid)) << tid;
      EXPECT_EQ(got.at(tid).hits_w, want.hits_w) << tid;
      EXPECT_EQ(got.at(tid).misses_w, want.misses_w) << tid;
      EXPECT_EQ(got.at(tid).flags_r, want.flags_r) << tid;
    }
  }
  // The last value written to hits, in time order, is the same whichever way the report reads.
  EXPECT_EQ((*Field(whole["watches"][0], "g_stats.hits"))["last_values"],
            (*Field(replayed["watches"][0], "g_stats.hits"))["last_values"]);
}

// A live session ends with the same profile: in JSON under "profile", in text as the report.
TEST(Recording, LiveSessionEndsWithTheSameProfile) {
  const std::string truth_path = TruthFile("live-profile");
  const RunResult r = RunKwatch({"-q", "--json", "--rw", "g_stats", "--",
                                 TargetPath("field_writer"), "2", "500", "--truth", truth_path});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json summary = json::parse(r.out.substr(r.out.rfind("{\"type\":\"summary\"")));
  const json& w = summary["profile"]["watches"][0];
  EXPECT_EQ((*Field(w, "g_stats.hits"))["writes"], 1000);
  EXPECT_EQ((*Field(w, "g_stats.misses"))["writes"], 500);
  EXPECT_EQ((*Field(w, "g_stats.flags"))["reads"], 250);
  EXPECT_TRUE(summary["profile"]["false_sharing"].is_array());

  // The text summary ends with the same profile, whatever the backend: the last values
  // written are exact in both; page mode also knows the bytes before each write.
  const RunResult text = RunKwatch({"-q", "--rw", "g_stats", "--", TargetPath("field_writer"), "1",
                                    "100", "--truth", TruthFile("live-text")});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_THAT(text.out, HasSubstr("== kwatch summary: 175 events"));
  EXPECT_THAT(text.out, HasSubstr("storage profile: 175 events from 1 thread"));
  EXPECT_THAT(text.out, HasSubstr("heatmap: reads+writes per field"));
  if (text.out.find("(perf breakpoint stream)") != std::string::npos) {
    // From the registers; the column is as wide as the misses' values.
    EXPECT_THAT(text.out, ::testing::ContainsRegex("g_stats.hits +95, 96, 97, 98, 99 +tid "));
  } else {
    EXPECT_THAT(text.out, HasSubstr("98 (was 97), 99 (was 98)  tid "));
  }
  const RunResult page =
      RunKwatch({"-q", "--backend=page", "--rw", "g_stats", "--", TargetPath("field_writer"), "1",
                 "100", "--truth", TruthFile("live-page")});
  ASSERT_EQ(page.exit_code, 0) << page.err;
  EXPECT_THAT(page.out, HasSubstr("storage profile: 175 events from 1 thread"));
  EXPECT_THAT(page.out, HasSubstr("98 (was 97), 99 (was 98)  tid "));
}

// Page mode stops the target at its system calls (a pthread barrier lives on the watched page):
// the summary says what the kernel did with the protected pages, in JSON and in text.
TEST(Recording, SummarySaysWhatTheKernelDidWithWatchedPages) {
  const RunResult r = RunKwatch({"-q", "--json", "--backend=page", "--rw", "g_shared", "--",
                                 TargetPath("false_sharing"), "500"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("done a=499 b=499"));
  const json summary = json::parse(r.out.substr(r.out.rfind("{\"type\":\"summary\"")));
  ASSERT_TRUE(summary.contains("kernel")) << summary.dump();
  EXPECT_GT(summary["kernel"]["syscall_stops"].get<uint64_t>(), 0u);
  EXPECT_EQ((*Field(summary["profile"]["watches"][0], "g_shared.a"))["writes"], 500);

  const RunResult text = RunKwatch(
      {"-q", "--backend=page", "--rw", "g_shared", "--", TargetPath("false_sharing"), "100"});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_THAT(text.out, ::testing::ContainsRegex("kernel: [0-9]+ system-call stops"));
}

// Text, CSV, and the filters: one thread, one field, a time window after the end.
TEST(Recording, TextCsvAndFilters) {
  const std::string db = TempFile("filters.kwdb");
  const std::string truth_path = TruthFile("filters");
  const RunResult rec = RunKwatch({"-q", "--rw", "g_stats", "-o", db, "--",
                                   TargetPath("field_writer"), "2", "400", "--truth", truth_path});
  ASSERT_EQ(rec.exit_code, 0) << rec.err;
  const std::map<int, Truth> truth = ReadTruth(truth_path);
  ASSERT_EQ(truth.size(), 2u);
  const int tid = truth.begin()->first;

  const RunResult text = RunKwatch({"report", db, "--color=never"});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_THAT(text.out, HasSubstr("recorded  1400 events"));
  EXPECT_THAT(text.out, HasSubstr("target exited (exit status 0)"));
  EXPECT_THAT(text.out, HasSubstr("heatmap: reads+writes per field"));
  EXPECT_THAT(text.out, HasSubstr("false sharing"));

  const RunResult csv = RunKwatch({"report", db, "--format=csv", "--field=misses"});
  ASSERT_EQ(csv.exit_code, 0) << csv.err;
  const std::vector<std::string> lines = absl::StrSplit(csv.out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 2u) << csv.out;
  EXPECT_EQ(lines[0], "watch,field,offset,size,reads,writes,threads,top_site");
  EXPECT_THAT(lines[1], ::testing::StartsWith("g_stats,g_stats.misses,8,4,0,400,2,Work+0x"));
  EXPECT_THAT(lines[1], ::testing::EndsWith(absl::StrCat(
                            " (field_writer.c:", SourceLine("g_stats.misses = (int)i;"), ")")));

  const json one = ReportJson({db, absl::StrCat("--thread=", tid)});
  const json& w = one["watches"][0];
  EXPECT_EQ(w["reads"], truth.at(tid).flags_r);
  EXPECT_EQ(w["writes"], truth.at(tid).hits_w + truth.at(tid).misses_w);

  const json late = ReportJson({db, "--from=3600"});
  EXPECT_EQ(late["watches"][0]["reads"], 0);
  EXPECT_EQ(late["watches"][0]["writes"], 0);
}

// Two threads writing g_shared.a and g_shared.b (one cache line) are false sharing; the same
// writes to g_padded.a and g_padded.b, 64 bytes apart, are not.
TEST(Recording, FalseSharingIsFoundOnlyWhereFieldsShareALine) {
  const std::string db = TempFile("fs.kwdb");
  const RunResult rec = RunKwatch({"-q", "--write", "g_shared", "g_padded", "-o", db, "--",
                                   TargetPath("false_sharing"), "3000"});
  ASSERT_EQ(rec.exit_code, 0) << rec.err;
  EXPECT_THAT(rec.out, HasSubstr("done a=2999 b=2999"));
  int left = 0;
  int right = 0;
  for (absl::string_view line : absl::StrSplit(rec.out, '\n')) {
    if (absl::ConsumePrefix(&line, "left ")) {
      ASSERT_TRUE(absl::SimpleAtoi(line, &left));
    } else if (absl::ConsumePrefix(&line, "right ")) {
      ASSERT_TRUE(absl::SimpleAtoi(line, &right));
    }
  }
  ASSERT_GT(left, 0);
  ASSERT_GT(right, 0);
  const json j = ReportJson({db});
  ASSERT_EQ(j["watches"].size(), 2u);
  EXPECT_EQ((*Field(j["watches"][0], "g_shared.a"))["writes"], 3000);
  EXPECT_EQ((*Field(j["watches"][0], "g_shared.b"))["writes"], 3000);
  EXPECT_EQ((*Field(j["watches"][1], "g_padded.a"))["writes"], 3000);
  EXPECT_EQ((*Field(j["watches"][1], "g_padded.b"))["writes"], 3000);
  const std::string shared_line = j["watches"][0]["address"];
  ASSERT_EQ(j["false_sharing"].size(), 1u) << j["false_sharing"].dump(2);
  const json& f = j["false_sharing"][0];
  EXPECT_EQ(f["line"], shared_line);  // g_shared is aligned to its line
  EXPECT_GT(f["false_transfers"].get<uint64_t>(), 0u);
  // The fields of the line, and what each thread wrote there: disjoint fields, none shared.
  std::vector<std::string> paths;
  for (const json& x : f["fields"]) {
    paths.push_back(x["path"]);
  }
  EXPECT_EQ(paths, (std::vector<std::string>{"g_shared.a", "g_shared.b", "g_shared.flags"}));
  EXPECT_TRUE(f["shared_fields"].empty()) << f["shared_fields"].dump();
  std::map<int, std::pair<std::string, uint64_t>> writers;
  for (const json& t : f["threads"]) {
    ASSERT_EQ(t["fields"].size(), 1u) << t.dump();
    writers[t["tid"].get<int>()] = {t["fields"][0]["path"], t["fields"][0]["writes"]};
    EXPECT_EQ(t["writes"], 3000);
  }
  EXPECT_EQ(writers, (std::map<int, std::pair<std::string, uint64_t>>{
                         {left, {"g_shared.a", 3000}}, {right, {"g_shared.b", 3000}}}));

  const RunResult text = RunKwatch({"report", db, "--color=never"});
  EXPECT_THAT(text.out, HasSubstr(absl::StrCat("line ", shared_line)));
}

// kwatch killed with SIGKILL in the middle of a recording: the file still opens, the report
// says it was cut short and covers the batches committed before.
TEST(Recording, CutShortBySigkillStillReports) {
  const std::string db = TempFile("killed.kwdb");
  auto k = kwatch::testing::Spawned::Start({KwatchPath(), "-q", "--write", "g_stats.hits", "-o", db,
                                            "--", TargetPath("field_writer"), "1", "1000000000",
                                            "--truth", TruthFile("killed-rec")});
  ASSERT_TRUE(k.ok()) << k.status();
  ASSERT_TRUE((*k)->WaitForStderr("armed").ok()) << (*k)->err();
  const pid_t target = LaunchedTarget((*k)->pid());
  ASSERT_GT(target, 0);
  // Wait until at least one batch is committed (the writer commits every drain round).
  for (int i = 0; i < 100; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const RunResult peek = RunKwatch({"report", db, "--format=json"});
    const json j = json::parse(peek.out, nullptr, false);
    if (!j.is_discarded() && j["session"]["events"].get<uint64_t>() >= 100) {
      break;
    }
  }
  ASSERT_EQ(::kill((*k)->pid(), SIGKILL), 0);
  (void)(*k)->Finish();
  ::kill(target, SIGKILL);  // launched without --kill-on-exit: it would run for minutes

  const RunResult r = RunKwatch({"report", db, "--format=json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("was cut short"));
  const json j = json::parse(r.out);
  EXPECT_EQ(j["session"]["complete"], false);
  const uint64_t events = j["session"]["events"];
  EXPECT_GE(events, 100u);
  EXPECT_EQ((*Field(j["watches"][0], "g_stats.hits"))["writes"], events);
}

// -o on an existing recording: the old file stays as it was until the new recording is
// complete. kwatch killed mid-session leaves it untouched (the new one, cut short, is beside
// it at FILE.new-PID); a session that ends normally replaces it.
TEST(Recording, AnExistingRecordingIsReplacedOnlyByACompleteOne) {
  const std::string db = TempFile("replaced.kwdb");
  const RunResult first = RunKwatch(
      {"-q", "--write", "g_stats.hits", "-o", db, "--", TargetPath("field_writer"), "1", "300"});
  ASSERT_EQ(first.exit_code, 0) << first.err;
  const json before = ReportJson({db});
  const uint64_t events = before["session"]["events"];
  ASSERT_GT(events, 0u);

  auto k = kwatch::testing::Spawned::Start({KwatchPath(), "-q", "--write", "g_stats.hits", "-o", db,
                                            "--", TargetPath("field_writer"), "1", "1000000000"});
  ASSERT_TRUE(k.ok()) << k.status();
  ASSERT_TRUE((*k)->WaitForStderr("armed").ok()) << (*k)->err();
  const pid_t target = LaunchedTarget((*k)->pid());
  ASSERT_GT(target, 0);
  const std::string aside = absl::StrCat(db, ".new-", (*k)->pid());
  for (int i = 0; i < 100 && !std::filesystem::exists(aside); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ASSERT_EQ(::kill((*k)->pid(), SIGKILL), 0);
  (void)(*k)->Finish();
  ::kill(target, SIGKILL);

  const json after = ReportJson({db});
  EXPECT_EQ(after["session"]["complete"], true);
  EXPECT_EQ(after["session"]["events"], events);
  const RunResult partial = RunKwatch({"report", aside, "--format=json"});
  EXPECT_EQ(partial.exit_code, 0) << partial.err;
  EXPECT_THAT(partial.err, HasSubstr("was cut short"));

  const RunResult third = RunKwatch(
      {"-q", "--write", "g_stats.hits", "-o", db, "--", TargetPath("field_writer"), "1", "50"});
  ASSERT_EQ(third.exit_code, 0) << third.err;
  const json replaced = ReportJson({db});
  EXPECT_EQ(replaced["session"]["complete"], true);
  EXPECT_LT(replaced["session"]["events"].get<uint64_t>(), events);
  EXPECT_THAT(third.err, HasSubstr(absl::StrCat(" events to ", db, " (kwatch report ", db, ")")));
  std::filesystem::remove(aside);
  std::filesystem::remove(db);
}

TEST(Recording, BadFilesAreExplained) {
  const RunResult missing = RunKwatch({"report", "/nonexistent/run.kwdb"});
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_THAT(missing.err, HasSubstr("/nonexistent/run.kwdb: no such recording"));

  const std::string garbage = TempFile("garbage.kwdb");
  {
    std::ofstream out(garbage);
    out << "this is not a database, it is some text that a user passed by mistake\n";
  }
  const RunResult g = RunKwatch({"report", garbage});
  EXPECT_EQ(g.exit_code, 1);
  EXPECT_THAT(g.err, HasSubstr("not a kwatch recording"));

  // Another program's SQLite database.
  const std::string foreign = TempFile("foreign.db");
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(foreign.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(
      sqlite3_exec(db, "CREATE TABLE t(x); INSERT INTO t VALUES (1);", nullptr, nullptr, nullptr),
      SQLITE_OK);
  sqlite3_close(db);
  const RunResult f = RunKwatch({"report", foreign});
  EXPECT_EQ(f.exit_code, 1);
  EXPECT_THAT(f.err, HasSubstr("not a kwatch recording"));

  // A recording from a newer kwatch.
  const std::string newer = TempFile("newer.kwdb");
  const RunResult rec =
      RunKwatch({"-q", "--write", "g_stats.hits", "-o", newer, "--", TargetPath("field_writer"),
                 "1", "10", "--truth", TruthFile("newer")});
  ASSERT_EQ(rec.exit_code, 0) << rec.err;
  ASSERT_EQ(sqlite3_open(newer.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "PRAGMA user_version = 999;", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);
  const RunResult n = RunKwatch({"report", newer});
  EXPECT_EQ(n.exit_code, 1);
  EXPECT_THAT(n.err, HasSubstr("recorded by a newer kwatch (schema 999)"));

  // A file whose pages were overwritten in the middle.
  const std::string damaged = TempFile("damaged.kwdb");
  const RunResult rec2 =
      RunKwatch({"-q", "--write", "g_stats.hits", "-o", damaged, "--", TargetPath("field_writer"),
                 "1", "2000", "--truth", TruthFile("damaged")});
  ASSERT_EQ(rec2.exit_code, 0) << rec2.err;
  {
    std::fstream io(damaged, std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(4096 * 2);
    const std::string junk(4096 * 3, '\xa5');
    io.write(junk.data(), static_cast<std::streamsize>(junk.size()));
  }
  const RunResult d = RunKwatch({"report", damaged});
  EXPECT_EQ(d.exit_code, 1) << d.out;
  EXPECT_THAT(d.err, HasSubstr(damaged));
  EXPECT_THAT(d.err, ::testing::AnyOf(HasSubstr("corrupt"), HasSubstr("malformed")));

  // A file cut to half its size (a copy that did not finish).
  const std::string truncated = TempFile("truncated.kwdb");
  std::filesystem::copy_file(newer, truncated);
  std::filesystem::resize_file(truncated, std::filesystem::file_size(truncated) / 2);
  ASSERT_EQ(sqlite3_open(truncated.c_str(), &db), SQLITE_OK);
  sqlite3_exec(db, "PRAGMA user_version = 1;", nullptr, nullptr, nullptr);
  sqlite3_close(db);
  const RunResult t = RunKwatch({"report", truncated});
  EXPECT_EQ(t.exit_code, 1) << t.out;
  EXPECT_THAT(t.err, HasSubstr(truncated));
  EXPECT_THAT(t.err, ::testing::AnyOf(HasSubstr("corrupt"), HasSubstr("malformed")));

  // Recording to a place that cannot be written stops before launching anything.
  const RunResult unwritable =
      RunKwatch({"-q", "--write", "g_stats.hits", "-o", "/nonexistent-dir/x.kwdb", "--",
                 TargetPath("field_writer"), "1", "10"});
  EXPECT_NE(unwritable.exit_code, 0);
  EXPECT_THAT(unwritable.err, HasSubstr("/nonexistent-dir/x.kwdb"));
  EXPECT_THAT(unwritable.out, ::testing::Not(HasSubstr("tid")));
}

TEST(Recording, PngHeatmapIsWritten) {
  const std::string db = TempFile("png.kwdb");
  const RunResult rec =
      RunKwatch({"-q", "--rw", "g_stats", "-o", db, "--", TargetPath("field_writer"), "2", "300",
                 "--truth", TruthFile("png")});
  ASSERT_EQ(rec.exit_code, 0) << rec.err;
  const std::string png = TempFile("heat.png");
  const RunResult r = RunKwatch({"report", db, "--png", png});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err + r.out, HasSubstr(png));
  std::ifstream in(png, std::ios::binary);
  std::string magic(8, '\0');
  in.read(magic.data(), 8);
  EXPECT_EQ(magic, "\x89PNG\r\n\x1a\n");
  EXPECT_GT(std::filesystem::file_size(png), 2000u);
}

}  // namespace
}  // namespace kwatch
