// `kwatch probe -o FILE --agg ...` records the aggregations' final results, and `kwatch report
// FILE` prints them as the session did (text block, JSON objects), against
// tests/targets/probe_args.c: add_ints is called 5 times, fact(5) recurses with n = 5..1.

#include <sqlite3.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <tuple>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "tests/cli/probe_test_util.h"
#include "tests/test_util.h"

namespace kwatch {
namespace {

using ::kwatch::testing::json;
using ::kwatch::testing::JsonRun;
using ::kwatch::testing::KwatchPath;
using ::kwatch::testing::KwatchProbe;
using ::kwatch::testing::ParseJson;
using ::kwatch::testing::PrivateTargetPath;
using ::kwatch::testing::RunResult;
using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::Not;

std::string TempKwdb(const std::string& name) {
  const std::string path =
      absl::StrCat(::testing::TempDir(), "/agg-", name, "-", getpid(), ".kwdb");
  std::remove(path.c_str());
  return path;
}

RunResult Report(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {KwatchPath(), "report"};
  argv.insert(argv.end(), args.begin(), args.end());
  auto r = ::kwatch::testing::Run(argv);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : RunResult{};
}

// The end-of-session block for probe_args, the target's thread being `tid`.
std::string ExpectedBlock(long tid) {
  const std::string row = absl::StrFormat("    %-40s %d\n", absl::StrCat("tid=", tid), 5);
  return absl::StrCat("== aggregations ==\n",                                             //
                      "add_ints: count() by tid\n", row,                                  //
                      "fact: count() by tid\n", row,                                      //
                      "fact: hist(n)\n",                                                  //
                      "    [1, 2)                            1 |", std::string(25, '@'),  //
                      std::string(25, ' '), "|\n",                                        //
                      "    [2, 4)                            2 |", std::string(50, '@'),  //
                      "|\n",                                                              //
                      "    [4, 8)                            2 |", std::string(50, '@'),  //
                      "|\n");
}

const std::vector<std::string> kAggArgs = {"--agg",        "count() by tid", "--agg",
                                           "fact:hist(n)", "add_ints a b",   "fact n"};

TEST(ProbeAggregationRecording, ReportPrintsTheSessionsBlockExactly) {
  const std::string db = TempKwdb("text");
  std::vector<std::string> args = {"-q", "-o", db};
  args.insert(args.end(), kAggArgs.begin(), kAggArgs.end());
  args.insert(args.end(), {"--", PrivateTargetPath("probe_args")});
  const RunResult live = KwatchProbe(args);
  ASSERT_EQ(live.exit_code, 0) << live.err;
  EXPECT_THAT(live.err, HasSubstr("kwatch: recorded 10 probe hits to " + db));

  // The target is single-threaded: its one thread is the process the recording names.
  const RunResult js = Report({db, "--format", "json"});
  ASSERT_EQ(js.exit_code, 0) << js.err;
  const json doc = json::parse(js.out);
  const long tid = doc["session"]["pid"].get<long>();
  ASSERT_GT(tid, 0);

  const std::string block = ExpectedBlock(tid);
  EXPECT_THAT(live.out, EndsWith("\n" + block)) << live.out;
  const RunResult text = Report({db});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  // After the probes, as the session printed it at its end.
  EXPECT_THAT(text.out, EndsWith("\n\n" + block)) << text.out;
  EXPECT_THAT(text.out, HasSubstr("== probes\n")) << text.out;

  // JSON: the objects `kwatch probe --json` prints, in order.
  const json key = {{"tid", tid}};
  auto agg = [](const std::string& event, const std::string& call) {
    return json{{"type", "aggregate"}, {"event", event}, {"agg", call}, {"time", nullptr}};
  };
  std::vector<json> want;
  for (const char* event : {"add_ints", "fact"}) {
    json j = agg(event, "count() by tid");
    j["key"] = key;
    j["value"] = 5;
    j["count"] = 5;
    want.push_back(j);
  }
  for (const auto& [low, high, count] :
       std::vector<std::tuple<int, int, int>>{{1, 2, 1}, {2, 4, 2}, {4, 8, 2}}) {
    json j = agg("fact", "hist(n)");
    j["key"] = nullptr;
    j["low"] = low;
    j["high"] = high;
    j["count"] = count;
    want.push_back(j);
  }
  ASSERT_TRUE(doc.contains("aggregates")) << js.out;
  EXPECT_EQ(doc["aggregates"], json(want)) << doc["aggregates"].dump();
}

TEST(ProbeAggregationRecording, ReportJsonHasTheLiveJsonObjects) {
  const std::string db = TempKwdb("json");
  std::vector<std::string> args = {"--json", "-q", "-o", db};
  args.insert(args.end(), kAggArgs.begin(), kAggArgs.end());
  args.insert(args.end(), {"--", PrivateTargetPath("probe_args")});
  const RunResult live = KwatchProbe(args);
  ASSERT_EQ(live.exit_code, 0) << live.err;
  const JsonRun run = ParseJson(live.out);
  ASSERT_EQ(run.aggregates.size(), 5U) << live.out;
  const RunResult js = Report({db, "--format", "json"});
  ASSERT_EQ(js.exit_code, 0) << js.err;
  EXPECT_EQ(json::parse(js.out)["aggregates"], json(run.aggregates)) << js.out;
}

TEST(ProbeAggregationRecording, AProbeRecordingWithoutAggregationsReportsNone) {
  const std::string db = TempKwdb("none");
  const RunResult live =
      KwatchProbe({"-q", "-o", db, "add_ints a b", "--", PrivateTargetPath("probe_args")});
  ASSERT_EQ(live.exit_code, 0) << live.err;
  const RunResult text = Report({db});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_THAT(text.out, Not(HasSubstr("aggregations")));
  EXPECT_THAT(text.out,
              EndsWith(" in 1 thread\n    a                 0 (1)  1 (1)  2 (1)  3 (1)  4 (1)\n"
                       "    b                 0 (1)  10 (1)  20 (1)  30 (1)  40 (1)\n\n"))
      << text.out;
  // The same file as a schema 4 recording (hits in rows, no aggregation tables) reports the
  // same.
  const std::string old = TempKwdb("none-schema4");
  auto exported = ::kwatch::testing::Run({KwatchPath(), "export", "--sql", old, db});
  ASSERT_TRUE(exported.ok() && exported->exit_code == 0) << (exported.ok() ? exported->err : "");
  sqlite3* raw = nullptr;
  ASSERT_EQ(sqlite3_open(old.c_str(), &raw), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(raw,
                         "DROP TABLE aggregates; DROP TABLE aggregate_rows; "
                         "DROP TABLE aggregate_buckets; PRAGMA user_version = 4;",
                         nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(raw);
  const RunResult old_text = Report({old});
  ASSERT_EQ(old_text.exit_code, 0) << old_text.err;
  EXPECT_EQ(absl::StrReplaceAll(old_text.out, {{old, db}}), text.out);
  const RunResult js = Report({db, "--format", "json"});
  ASSERT_EQ(js.exit_code, 0) << js.err;
  EXPECT_FALSE(json::parse(js.out).contains("aggregates")) << js.out;
}

}  // namespace
}  // namespace kwatch
