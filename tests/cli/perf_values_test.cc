// Perf stream mode values: each breakpoint sample carries the registers after the access, so a
// plain mov's exact bytes and value are known (value_at "access"), whatever the addressing
// mode, also after the target exited; anything else (read-modify-write) keeps the value read
// at drain time, marked as such. Checked against what the fixtures write. The runs need no
// delivered traps to start; the values only where traps arrive (KW_REQUIRE_DEBUG_TRAPS).
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "tests/cli/cli_test_util.h"
#include "tests/test_util.h"
#include "tests/watch/debug_traps.h"

namespace {

using ::kwatch::clitest::JsonRun;
using ::kwatch::clitest::ParseJsonLines;
using ::kwatch::clitest::ReadTruth;
using ::kwatch::clitest::RunKwatch;
using ::kwatch::clitest::SourceLine;
using ::kwatch::clitest::TruthFile;
using ::kwatch::testing::RunResult;
using ::kwatch::testing::TargetPath;
using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using json = nlohmann::json;

std::string TempFile(const std::string& name) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/", name, "-", getpid());
  for (const char* suffix : {"", "-wal", "-shm"}) {
    std::filesystem::remove(path + suffix);
  }
  return path;
}

uint64_t Hex(const json& j) {
  return std::stoull(j.get<std::string>(), nullptr, 16);
}

// What field_writer's one worker does in iteration i, in order: (access, field, value).
std::vector<std::tuple<std::string, std::string, long>> FieldWriterTruth(long iters) {
  std::vector<std::tuple<std::string, std::string, long>> out;
  for (long i = 0; i < iters; ++i) {
    out.emplace_back("w", "g_stats.hits", i);
    if (i % 2 == 0) {
      out.emplace_back("w", "g_stats.misses", i);
    }
    if (i % 4 == 0) {
      out.emplace_back("r", "g_stats.flags", 0);  // nobody writes flags
    }
  }
  return out;
}

TEST(PerfValues, EveryAccessOfAStructHasItsFieldAndExactValue) {
  constexpr long kIters = 200;
  const std::string truth_path = TruthFile("perf-values");
  const RunResult r =
      RunKwatch({"--backend", "perf", "--json", "--rw", "g_stats", "--", TargetPath("field_writer"),
                 "1", absl::StrCat(kIters), "--truth", truth_path});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const JsonRun run = ParseJsonLines(r.out);
  ASSERT_EQ(run.watches.size(), 1u);
  EXPECT_EQ(run.summary["backend"], "perf");
  const uint64_t base = Hex(run.watches[0]["addr"]);
  KW_REQUIRE_DEBUG_TRAPS();
  EXPECT_EQ(run.summary["lost"], 0);
  const auto want = FieldWriterTruth(kIters);
  ASSERT_EQ(run.events.size(), want.size());
  // Each batch is in time order, but a slot's ring drained before another's may hand its
  // later samples to the next batch: compare in time order.
  std::vector<json> events = run.events;
  std::stable_sort(events.begin(), events.end(), [](const json& a, const json& b) {
    return a["time_ns"].get<uint64_t>() < b["time_ns"].get<uint64_t>();
  });
  const int hits_line = SourceLine("g_stats.hits = i;");
  for (size_t k = 0; k < want.size(); ++k) {
    SCOPED_TRACE(k);
    const json& e = events[k];
    const auto& [access, field, value] = want[k];
    EXPECT_EQ(e["access"], access);
    EXPECT_EQ(e["field"], field);
    EXPECT_EQ(e["value_at"], "access");
    EXPECT_EQ(e["value"], value);
    EXPECT_TRUE(e["old_value"].is_null());  // perf mode never knows the bytes before
    const uint64_t offset = field == "g_stats.hits" ? 0 : field == "g_stats.misses" ? 8 : 12;
    const int size = field == "g_stats.hits" ? 8 : field == "g_stats.misses" ? 4 : 2;
    EXPECT_EQ(Hex(e["access_addr"]), base + offset);
    EXPECT_EQ(e["access_size"], size);
    if (field == "g_stats.hits") {
      EXPECT_EQ(e["line"], hits_line);
    }
  }
  // The summary counts each field from the exact bytes too.
  const json& w = run.summary["watches"][0];
  std::map<std::string, std::pair<long, long>> fields;
  for (const json& f : w["fields"]) {
    fields[f["field"]] = {f["reads"].get<long>(), f["writes"].get<long>()};
  }
  EXPECT_EQ(fields["g_stats.hits"], std::make_pair(0L, kIters));
  EXPECT_EQ(fields["g_stats.misses"], std::make_pair(0L, kIters / 2));
  EXPECT_EQ(fields["g_stats.flags"], std::make_pair(kIters / 4, 0L));
  EXPECT_EQ(fields.count("g_stats"), 0u);
}

TEST(PerfValues, TextLinesShowTheFieldAndTheValueAtTheAccess) {
  const RunResult r =
      RunKwatch({"--backend", "perf", "--rw", "g_stats", "--", TargetPath("field_writer"), "1", "5",
                 "--truth", TruthFile("perf-values-text")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("VALUE (~ = at drain)"));
  KW_REQUIRE_DEBUG_TRAPS();
  std::vector<std::pair<double, std::tuple<std::string, std::string, long>>> lines;
  for (absl::string_view line : absl::StrSplit(r.out, '\n')) {
    const std::vector<std::string> cols = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (cols.size() >= 6 && cols[3].starts_with("g_stats")) {
      double t = 0;
      long v = 0;
      ASSERT_TRUE(absl::SimpleAtod(cols[0], &t)) << line;
      ASSERT_TRUE(absl::SimpleAtoi(cols[4], &v)) << line;  // no "~": exact
      lines.push_back({t, {cols[2], cols[3], v}});
      EXPECT_THAT(std::string(line), HasSubstr("Work+0x"));
    }
  }
  std::stable_sort(lines.begin(), lines.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::tuple<std::string, std::string, long>> got;
  for (const auto& l : lines) {
    got.push_back(l.second);
  }
  EXPECT_EQ(got, FieldWriterTruth(5));
}

// layouts runs once and exits: g_stats.hits is stored by two movs (1, then (1 + 1) * 3),
// g_counter by `addq $1` then `addq $2` (read-modify-write: the value is not in a register).
TEST(PerfValues, ReadModifyWriteKeepsTheDrainValueMarkedAsSuch) {
  const RunResult r = RunKwatch({"--backend", "perf", "--json", "--write", "g_stats.hits",
                                 "g_counter", "--", TargetPath("layouts")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const JsonRun run = ParseJsonLines(r.out);
  ASSERT_EQ(run.watches.size(), 2u);
  KW_REQUIRE_DEBUG_TRAPS();
  ASSERT_EQ(run.events.size(), 4u) << r.out;
  std::vector<long> hits;
  int counter = 0;
  for (const json& e : run.events) {
    if (e["expr"] == "g_stats.hits") {
      EXPECT_EQ(e["value_at"], "access");
      hits.push_back(e["value"].get<long>());
    } else {
      ASSERT_EQ(e["expr"], "g_counter");
      ++counter;
      EXPECT_EQ(e["value_at"], "drain");
      // Read once the batch was drained: the final 3, or nothing when the target was gone.
      EXPECT_TRUE(e["value"].is_null() || e["value"] == 3) << e.dump();
      // The address is RIP-relative: the exact bytes are known without registers.
      EXPECT_EQ(e["access_addr"], run.watches[1]["addr"]);
      EXPECT_EQ(e["access_size"], 8);
    }
  }
  EXPECT_EQ(hits, (std::vector<long>{1, 6}));
  EXPECT_EQ(counter, 2);

  const RunResult text =
      RunKwatch({"--backend", "perf", "--write", "g_counter", "--", TargetPath("layouts")});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  int lines = 0;
  for (absl::string_view line : absl::StrSplit(text.out, '\n')) {
    const std::vector<std::string> cols = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (cols.size() >= 6 && cols[3] == "g_counter") {
      ++lines;
      EXPECT_TRUE(cols[4] == "?" || cols[4] == "~3") << line;
    }
  }
  EXPECT_EQ(lines, 2);
}

// A recording of a perf session keeps the exact values: `kwatch report` lists the last values
// written (no "was": perf mode does not know the bytes before).
TEST(PerfValues, RecordingAndReportShowTheLastValuesWritten) {
  const std::string db = TempFile("perf-values.kwdb");
  const RunResult rec =
      RunKwatch({"--backend", "perf", "-q", "--rw", "g_stats", "-o", db, "--",
                 TargetPath("field_writer"), "1", "100", "--truth", TruthFile("perf-rec")});
  ASSERT_EQ(rec.exit_code, 0) << rec.err;
  KW_REQUIRE_DEBUG_TRAPS();
  EXPECT_THAT(rec.out, ContainsRegex("g_stats.hits +95, 96, 97, 98, 99 +tid "));
  EXPECT_THAT(rec.out, ContainsRegex("g_stats.misses +90, 92, 94, 96, 98 +tid "));
  const RunResult text = RunKwatch({"report", db, "--color=never"});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_THAT(text.out, ContainsRegex("g_stats.hits +95, 96, 97, 98, 99 +tid "));
  EXPECT_THAT(text.out, ContainsRegex("g_stats.misses +90, 92, 94, 96, 98 +tid "));
  EXPECT_THAT(text.out, ::testing::Not(HasSubstr("(was ")));
  const RunResult js = RunKwatch({"report", db, "--format=json"});
  ASSERT_EQ(js.exit_code, 0) << js.err;
  const json j = json::parse(js.out);
  for (const json& f : j["watches"][0]["fields"]) {
    if (f["path"] == "g_stats.hits") {
      ASSERT_FALSE(f["last_values"].empty());
      EXPECT_EQ(f["last_values"].back()["value"], 99);
      EXPECT_EQ(f["last_values"].back()["exact"], true);
    }
  }
}

}  // namespace

// Two threads store i = 0..N-1 into the same word as fast as they can (kill_target's tight
// loop). The value each event reports is the one its own store wrote, from the registers at
// the trap: never the other thread's, which may already be in memory when kwatch looks. In
// perf stream mode and in stop mode, every thread's values are exactly 0, 1, ..., N-1.
TEST(PerfValues, RacingWritersEachSeeTheirOwnValues) {
  constexpr long kCalls = 3000;
  const std::string go = TempFile("racing-go");
  { std::ofstream(go).put('1'); }
  for (const char* mode : {"perf", "stop"}) {
    SCOPED_TRACE(mode);
    const RunResult r = RunKwatch({"--backend", mode, "--json", "--write", "g_val", "--",
                                   TargetPath("kill_target"), "2", absl::StrCat(kCalls), "0", go});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_THAT(r.out, HasSubstr(absl::StrCat("done calls=", 2 * kCalls)));
    std::string json_lines;  // kwatch's lines, without the target's own ("ready", "done ...")
    for (absl::string_view line : absl::StrSplit(r.out, '\n', absl::SkipEmpty())) {
      if (absl::StartsWith(line, "{")) {
        absl::StrAppend(&json_lines, line, "\n");
      }
    }
    const JsonRun run = ParseJsonLines(json_lines);
    KW_REQUIRE_DEBUG_TRAPS();
    EXPECT_EQ(run.summary["lost"], 0);
    std::map<int, std::vector<long>> per_tid;
    std::vector<json> events = run.events;
    std::stable_sort(events.begin(), events.end(), [](const json& a, const json& b) {
      return a["time_ns"].get<uint64_t>() < b["time_ns"].get<uint64_t>();
    });
    for (const json& e : events) {
      ASSERT_EQ(e["value_at"], "access") << e.dump();
      per_tid[e["tid"].get<int>()].push_back(e["value"].get<long>());
    }
    ASSERT_EQ(per_tid.size(), 2u);
    std::vector<long> want(kCalls);
    for (long i = 0; i < kCalls; ++i) {
      want[i] = i;
    }
    for (const auto& [tid, values] : per_tid) {
      EXPECT_EQ(values, want) << "thread " << tid;
    }
  }
  std::filesystem::remove(go);
}
