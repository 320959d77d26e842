// End-to-end tests of `kwatch`: run it on tests/targets/field_writer and compare what it saw
// with the ground truth the target prints about itself.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "tests/cli/cli_test_util.h"
#include "tests/test_util.h"
#include "tests/watch/debug_traps.h"

namespace kwatch {
namespace {

using ::kwatch::testing::KwatchPath;
using ::kwatch::testing::RunResult;
using ::kwatch::testing::TargetPath;
using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using json = nlohmann::json;
using ::kwatch::clitest::JsonRun;
using ::kwatch::clitest::LaunchedTarget;
using ::kwatch::clitest::ParseJsonLines;
using ::kwatch::clitest::ReadTruth;
using ::kwatch::clitest::RunKwatch;
using ::kwatch::clitest::SourceLine;
using ::kwatch::clitest::Truth;
using ::kwatch::clitest::TruthFile;

// Per-tid counts of events of one access kind.
std::map<int, long> CountByTid(const std::vector<json>& events, const std::string& access) {
  std::map<int, long> out;
  for (const auto& e : events) {
    if (e["access"] == access) {
      out[e["tid"].get<int>()]++;
    }
  }
  return out;
}

TEST(KwatchLaunch, EveryWriteOfAFieldPerThreadExactly) {
  const std::string truth_path = TruthFile("launch");
  const RunResult r = RunKwatch({"--write", "g_stats.hits", "--json", "--",
                                 TargetPath("field_writer"), "3", "1000", "--truth", truth_path});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto truth = ReadTruth(truth_path);
  ASSERT_EQ(truth.size(), 3u);
  const JsonRun run = ParseJsonLines(r.out);
  ASSERT_EQ(run.watches.size(), 1u);
  EXPECT_EQ(run.watches[0]["display"], "g_stats.hits");
  EXPECT_EQ(run.watches[0]["len"], 8);
  EXPECT_EQ(run.watches[0]["kind"], "write");
  EXPECT_EQ(run.events.size(), 3000u);
  const int line = SourceLine("g_stats.hits = i;");
  for (const auto& e : run.events) {
    EXPECT_EQ(e["access"], "w");
    EXPECT_EQ(e["field"], "g_stats.hits");
    EXPECT_EQ(e["function"], "Work");
    EXPECT_EQ(e["line"], line) << e.dump();
    EXPECT_THAT(e["file"].get<std::string>(), HasSubstr("field_writer.c"));
  }
  const auto by_tid = CountByTid(run.events, "w");
  for (const auto& [tid, t] : truth) {
    EXPECT_EQ(by_tid.count(tid) ? by_tid.at(tid) : 0, t.hits_w) << "tid " << tid;
  }
  EXPECT_EQ(run.summary["lost"], 0);
  EXPECT_EQ(run.summary["events"], 3000);
  EXPECT_EQ(run.summary["exit_code"], 0);
  EXPECT_EQ(run.summary["stop_reason"], "target exited");
  const json& w = run.summary["watches"][0];
  EXPECT_EQ(w["writes"], 3000);
  EXPECT_EQ(w["reads"], 0);
  ASSERT_EQ(w["fields"].size(), 1u);
  EXPECT_EQ(w["fields"][0]["field"], "g_stats.hits");
  EXPECT_EQ(w["fields"][0]["writes"], 3000);
  ASSERT_EQ(w["threads"].size(), 3u);
  for (const auto& t : w["threads"]) {
    EXPECT_EQ(t["writes"], truth.at(t["tid"].get<int>()).hits_w);
  }
  ASSERT_EQ(w["sites"].size(), 1u);
  EXPECT_EQ(w["sites"][0]["line"], line);
  EXPECT_EQ(w["sites"][0]["writes"], 3000);
}

// --exec takes code as `kwatch probe` and gdb's `break` write it: a function's entry, an offset
// into it, a source line (its first statement). field_writer 3 1000: Work runs once per thread,
// and `g_stats.hits = i;` 1000 times in each.
TEST(KwatchLaunch, ExecuteWatchesOnAFunctionAnOffsetAndALine) {
  const int line = SourceLine("g_stats.hits = i;");
  struct Case {
    std::string where;
    size_t events;
    std::string display;
  };
  for (const Case& c : std::vector<Case>{
           {"Work", 3, "Work"},
           {"field_writer.c:" + std::to_string(line), 3000, ""},
       }) {
    const RunResult r = RunKwatch({"--exec", c.where, "--json", "--", TargetPath("field_writer"),
                                   "3", "1000", "--truth", TruthFile("exec-code")});
    ASSERT_EQ(r.exit_code, 0) << c.where << ": " << r.err;
    const JsonRun run = ParseJsonLines(r.out);
    ASSERT_EQ(run.watches.size(), 1u);
    EXPECT_EQ(run.watches[0]["kind"], "execute") << c.where;
    EXPECT_EQ(run.watches[0]["len"], 1) << c.where;
    if (!c.display.empty()) {
      EXPECT_EQ(run.watches[0]["display"], c.display);
    } else {
      EXPECT_THAT(run.watches[0]["display"].get<std::string>(), HasSubstr(c.where + " (Work+0x"));
    }
    KW_REQUIRE_DEBUG_TRAPS();
    EXPECT_EQ(run.events.size(), c.events) << c.where;
    for (const auto& e : run.events) {
      EXPECT_EQ(e["function"], "Work") << e.dump();
      if (c.events == 3000) {
        EXPECT_EQ(e["line"], line) << e.dump();
      }
    }
  }
  // An offset: the instruction there, exactly the one the watch names.
  const RunResult off = RunKwatch({"--exec", "Work+0x4", "--json", "--", TargetPath("field_writer"),
                                   "2", "10", "--truth", TruthFile("exec-offset")});
  ASSERT_EQ(off.exit_code, 0) << off.err;
  const JsonRun run = ParseJsonLines(off.out);
  EXPECT_EQ(run.watches[0]["display"], "Work+0x4");
  ASSERT_EQ(run.events.size(), 2u);
  EXPECT_EQ(run.events[0]["offset"], 4);
  // Bad places say what is wrong before anything runs.
  for (const auto& [where, message] : std::vector<std::pair<std::string, std::string>>{
           {"Work+0x100000", "'Work+0x100000': Work is "},
           {"field_writer.c:100000", "'field_writer.c:100000': no code for field_writer.c:100000"},
       }) {
    const RunResult bad = RunKwatch({"--exec", where, "--", TargetPath("field_writer"), "1", "1",
                                     "--truth", TruthFile("exec-bad")});
    EXPECT_NE(bad.exit_code, 0) << where;
    EXPECT_THAT(bad.err, HasSubstr(message)) << where;
  }
}

TEST(KwatchLaunch, ReadWriteWatchTellsReadsFromWrites) {
  const std::string truth_path = TruthFile("rw");
  const RunResult r = RunKwatch({"--rw", "g_stats.flags", "--json", "--",
                                 TargetPath("field_writer"), "2", "4000", "--truth", truth_path});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto truth = ReadTruth(truth_path);
  const JsonRun run = ParseJsonLines(r.out);
  const auto reads = CountByTid(run.events, "r");
  ASSERT_EQ(truth.size(), 2u);
  for (const auto& [tid, t] : truth) {
    EXPECT_EQ(reads.count(tid) ? reads.at(tid) : 0, t.flags_r);
  }
  EXPECT_TRUE(CountByTid(run.events, "w").empty());
  EXPECT_EQ(run.summary["watches"][0]["reads"], 2000);
  EXPECT_EQ(run.summary["watches"][0]["fields"][0]["field"], "g_stats.flags");
  EXPECT_EQ(run.summary["lost"], 0);
  for (const auto& e : run.events) {
    EXPECT_EQ(e["line"], SourceLine("g_sink += g_stats.flags;"));
  }
}

TEST(KwatchLaunch, ReadWatchFiltersWritesInSoftware) {
  const std::string truth_path = TruthFile("read");
  const RunResult r = RunKwatch({"--read", "g_stats.misses", "--json", "--",
                                 TargetPath("field_writer"), "2", "1000", "--truth", truth_path});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("x86 has no read-only watchpoint"));
  const JsonRun run = ParseJsonLines(r.out);
  EXPECT_TRUE(run.events.empty());
  EXPECT_EQ(run.summary["filtered"], 1000);  // 2 threads x 500 stores, none read
  EXPECT_EQ(run.summary["watches"][0]["kind"], "read");
}

TEST(KwatchLaunch, TextOutputShowsFieldSiteAndSummary) {
  const RunResult r = RunKwatch({"--write", "g_stats.misses", "--", TargetPath("field_writer"), "1",
                                 "10", "--truth", TruthFile("text")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("g_stats.misses"));
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat("Work+0x")));
  EXPECT_THAT(r.out,
              HasSubstr(absl::StrCat("field_writer.c:", SourceLine("g_stats.misses = (int)i;"))));
  EXPECT_THAT(r.out, HasSubstr("== kwatch summary: 5 events"));
  EXPECT_THAT(r.out, HasSubstr("0 lost"));
  EXPECT_THAT(r.out, HasSubstr("exited with status 0"));
  EXPECT_THAT(r.err, HasSubstr("armed 1 watch"));
}

TEST(KwatchLaunch, ExitsWithTheCommandsStatus) {
  const RunResult r = RunKwatch({"-q", "--write", "g_stats.hits", "--", TargetPath("field_writer"),
                                 "1", "3", "--exit", "7", "--truth", TruthFile("exit")});
  EXPECT_EQ(r.exit_code, 7) << r.err;
  EXPECT_THAT(r.out, HasSubstr("exited with status 7"));
}

TEST(KwatchLaunch, CountStopsAfterNEvents) {
  const RunResult r =
      RunKwatch({"--json", "--count", "25", "--kill-on-exit", "--write", "g_stats.hits", "--",
                 TargetPath("field_writer"), "2", "100000000", "--truth", TruthFile("count")});
  const JsonRun run = ParseJsonLines(r.out);
  EXPECT_EQ(run.events.size(), 25u);
  EXPECT_EQ(run.summary["events"], 25);
  EXPECT_THAT(run.summary["stop_reason"].get<std::string>(), HasSubstr("--count 25 reached"));
  EXPECT_EQ(run.summary["signal"], SIGKILL);
}

TEST(KwatchLaunch, TargetKilledMidSessionStillGetsASummary) {
  auto k = kwatch::testing::Spawned::Start({KwatchPath(), "--json", "--write", "g_stats.hits", "--",
                                            TargetPath("field_writer"), "1", "1000000000",
                                            "--truth", TruthFile("killed")});
  ASSERT_TRUE(k.ok()) << k.status();
  ASSERT_TRUE((*k)->WaitForStderr("armed").ok()) << (*k)->err();
  const pid_t target = LaunchedTarget((*k)->pid());
  ASSERT_GT(target, 0);
  // Kill it once kwatch has seen it working (however loaded the machine is).
  ASSERT_TRUE((*k)->WaitForStdout("\"type\":\"event\"").ok()) << (*k)->err();
  ASSERT_EQ(kill(target, SIGKILL), 0);
  auto r = (*k)->Finish();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->exit_code, 128 + SIGKILL) << r->err;
  const JsonRun run = ParseJsonLines(r->out);
  ASSERT_FALSE(run.summary.is_null()) << r->err;
  EXPECT_EQ(run.summary["stop_reason"], "target killed by KILL");
  EXPECT_GT(run.summary["events"].get<long>(), 0);
  EXPECT_EQ(run.summary["lost"], 0);
}

TEST(KwatchLaunch, TheTargetsOwnCrashIsDeliveredAndReported) {
  const RunResult r =
      RunKwatch({"--json", "-q", "--write", "g_stats.hits", "--", TargetPath("field_writer"), "1",
                 "10", "--crash", "--truth", TruthFile("crash")});
  EXPECT_EQ(r.exit_code, 128 + SIGSEGV) << r.err;
  const JsonRun run = ParseJsonLines(r.out);
  EXPECT_EQ(run.summary["events"], 10);
  EXPECT_EQ(run.summary["stop_reason"], "target killed by SEGV");
  EXPECT_EQ(run.summary["signal"], SIGSEGV);
}

TEST(KwatchLaunch, ExactOldAndNewValuesInPageMode) {
  const RunResult r =
      RunKwatch({"--json", "--backend", "page", "--write", "g_stats.misses", "--",
                 TargetPath("field_writer"), "1", "20", "--truth", TruthFile("values")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const JsonRun run = ParseJsonLines(r.out);
  ASSERT_EQ(run.events.size(), 10u);
  // One thread writes misses = i for even i: 0, 2, ..., 18, each over the previous value.
  long expected_old = 0;
  for (size_t k = 0; k < run.events.size(); ++k) {
    const json& e = run.events[k];
    EXPECT_EQ(e["value_at"], "access");
    EXPECT_EQ(e["value"], static_cast<long>(2 * k));
    EXPECT_EQ(e["old_value"], expected_old);
    expected_old = static_cast<long>(2 * k);
  }
  EXPECT_EQ(run.summary["backend"], "page");
}

// An opaque handle (tests/targets/opaque: main.c declares `struct handle`, handle.c defines
// it): the member is found through the other unit's definition, and every bump is counted.
TEST(KwatchLaunch, AMemberBehindAnOpaqueHandleIsWatched) {
  const RunResult r = RunKwatch({"--json", "--backend", "page", "--write", "g_handle->counter",
                                 "--", TargetPath("opaque"), "9"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("bumped 9"));
  const JsonRun run = ParseJsonLines(r.out);
  ASSERT_EQ(run.watches.size(), 1u);
  EXPECT_EQ(run.watches[0]["type_name"], "long");
  EXPECT_EQ(run.watches[0]["len"], 8);
  ASSERT_EQ(run.events.size(), 9u);
  for (size_t k = 0; k < run.events.size(); ++k) {
    EXPECT_EQ(run.events[k]["field"], "g_handle->counter");
    EXPECT_EQ(run.events[k]["value"], static_cast<long>(k + 1));
    EXPECT_EQ(run.events[k]["function"], "handle_bump");
  }
}

// Both units of the opaque target have a `static long bumps`: gdb's 'FILE'::NAME picks one;
// the bare name is refused with both spellings, and the target still runs to its end.
TEST(KwatchLaunch, AStaticIsNamedByItsFile) {
  const RunResult r = RunKwatch({"--json", "--backend", "page", "--write", "'handle.c'::bumps",
                                 "--", TargetPath("opaque"), "6"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const JsonRun run = ParseJsonLines(r.out);
  ASSERT_EQ(run.events.size(), 6u);
  for (size_t k = 0; k < run.events.size(); ++k) {
    EXPECT_EQ(run.events[k]["expr"], "'handle.c'::bumps");
    EXPECT_EQ(run.events[k]["value"], static_cast<long>(2 * (k + 1)));  // handle.c adds 2
    EXPECT_EQ(run.events[k]["function"], "handle_bump");
  }

  const RunResult bare = RunKwatch({"--write", "bumps", "--", TargetPath("opaque"), "6"});
  EXPECT_EQ(bare.exit_code, 1);
  EXPECT_THAT(bare.err, HasSubstr("'bumps' is ambiguous: 2 statics of that name in opaque: '"));
  EXPECT_THAT(bare.err, HasSubstr("opaque/main.c'::bumps; write one of them"));
}

// A static data member of a class template, named as gdb names it (and as GCC does not:
// its DWARF says Box<long int>), with a member path after it.
TEST(KwatchLaunch, ATemplateStaticIsWatched) {
  const RunResult r = RunKwatch({"--json", "--backend", "page", "--write", "Box<int>::inst.second",
                                 "ns::Box<long int>::value", "--", TargetPath("templates"), "6"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("wrote 6"));
  const JsonRun run = ParseJsonLines(r.out);
  ASSERT_EQ(run.watches.size(), 2u);
  EXPECT_EQ(run.watches[0]["display"], "Box<int>::inst.second");
  EXPECT_EQ(run.watches[0]["type_name"], "long");
  EXPECT_EQ(run.watches[1]["display"], "ns::Box<long>::value");
  std::vector<long> second;
  std::vector<long> value;
  for (const auto& e : run.events) {
    EXPECT_EQ(e["function"], "main");
    if (e["field"] == "Box<int>::inst.second") {
      second.push_back(e["value"].get<long>());
    } else {
      EXPECT_EQ(e["field"], "ns::Box<long>::value");
      value.push_back(e["value"].get<long>());
    }
  }
  EXPECT_EQ(second, (std::vector<long>{100, 101, 102, 103, 104, 105}));  // = 100 + i
  EXPECT_EQ(value, (std::vector<long>{2, 4, 6, 8, 10, 12}));             // += 2
}

// An object known only by its address, as a program prints it (a record on the heap): the cast
// gives the watch the member's place and name, and every write the program did is counted.
TEST(KwatchAttach, AMemberThroughACastOfAnAddress) {
  auto target = kwatch::testing::Spawned::Start({TargetPath("casts"), "7", "--wait"});
  ASSERT_TRUE(target.ok()) << target.status();
  ASSERT_TRUE((*target)->WaitForStdout("ready").ok()) << (*target)->out();
  std::istringstream out((*target)->out());
  std::string word;
  std::string record;
  out >> word >> record;
  ASSERT_EQ(word, "record") << (*target)->out();
  const std::string expr = absl::StrCat("((struct record *)", record, ")->arr[2].x");
  auto k = kwatch::testing::Spawned::Start({KwatchPath(), "--json", "--backend", "page", "--write",
                                            expr, "-p", absl::StrCat((*target)->pid())});
  ASSERT_TRUE(k.ok()) << k.status();
  ASSERT_TRUE((*k)->WaitForStderr("armed").ok()) << (*k)->err();
  ASSERT_EQ(kill((*target)->pid(), SIGUSR1), 0);
  auto r = (*k)->Finish();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->exit_code, 0) << r->err;
  auto tr = (*target)->Finish();
  ASSERT_TRUE(tr.ok()) << tr.status();
  EXPECT_EQ(tr->exit_code, 0);
  EXPECT_THAT(tr->err, HasSubstr("wrote 7"));
  const JsonRun run = ParseJsonLines(r->out);
  ASSERT_EQ(run.watches.size(), 1u);
  EXPECT_EQ(run.watches[0]["display"], expr);
  EXPECT_EQ(run.watches[0]["type_name"], "int");
  EXPECT_EQ(run.watches[0]["len"], 4);
  ASSERT_EQ(run.events.size(), 7u) << r->out;
  for (size_t i = 0; i < run.events.size(); ++i) {
    EXPECT_EQ(run.events[i]["field"], expr);
    EXPECT_EQ(run.events[i]["access"], "w");
    EXPECT_EQ(run.events[i]["value"], static_cast<long>(i + 1));  // arr[2].x = i + 1
    EXPECT_EQ(run.events[i]["function"], "main");
  }
  EXPECT_EQ(run.summary["stop_reason"], "target exited");
}

// A union counts once, whichever member an access went through (the hardware cannot tell
// which was meant): g_rec.u takes its 4-byte and its 2-byte stores, the anonymous union is
// named by its members. Values read as their C types, on the live lines and in the report.
TEST(KwatchLaunch, AUnionCountsOnceAndValuesReadAsTheirTypes) {
  const RunResult as_json = RunKwatch(
      {"--json", "--backend", "page", "--write", "g_rec", "--", TargetPath("unions"), "3"});
  ASSERT_EQ(as_json.exit_code, 0) << as_json.err;
  const JsonRun run = ParseJsonLines(as_json.out);
  EXPECT_EQ(run.events.size(), 24u);  // 8 stores a round
  EXPECT_EQ(run.summary["events"], 24);
  std::map<std::string, int> writes;
  for (const json& f : run.summary["watches"][0]["fields"]) {
    writes[f["field"].get<std::string>()] = f["writes"].get<int>();
  }
  const std::map<std::string, int> want = {
      {"g_rec.u", 6},   {"g_rec.{a,b}", 3}, {"g_rec.f", 3},   {"g_rec.d", 3},
      {"g_rec.neg", 3}, {"g_rec.uc", 3},    {"g_rec.ptr", 3},
  };
  EXPECT_EQ(writes, want);

  const RunResult r =
      RunKwatch({"--backend", "page", "--write", "g_rec", "--", TargetPath("unions"), "3"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // Live lines: a union, a float, a double, a negative int, an unsigned char, a pointer.
  for (const char* line : {" g_rec\\.u +0x0 -> 0x1 ", " g_rec\\.f +0 -> 0\\.5 ",
                           " g_rec\\.d +-0\\.25 -> -0\\.5 ", " g_rec\\.neg +-2 -> -3 ",
                           " g_rec\\.uc +251 -> 252 ", " g_rec\\.ptr +0x0 -> 0x[0-9a-f]{9,} "}) {
    EXPECT_THAT(r.out, ContainsRegex(line));
  }
  // The report's last values.
  for (const char* row :
       {"g_rec\\.u +0x1 \\(was 0x0\\), 0x2 \\(was 0xffff\\), 0x3 \\(was 0xfffe\\) ",
        "g_rec\\.neg +-1 \\(was 0\\), -2 \\(was -1\\), -3 \\(was -2\\) ",
        "g_rec\\.uc +251 \\(was 0\\), 252 \\(was 251\\), 253 \\(was 252\\) ",
        "g_rec\\.f +0\\.5 \\(was 0\\), 1 \\(was 0\\.5\\), 1\\.5 \\(was 1\\) ",
        "g_rec\\.d +-0\\.25 \\(was 0\\), -0\\.5 \\(was -0\\.25\\), -0\\.75 ",
        "g_rec\\.ptr +0x[0-9a-f]{9,} \\(was 0x0\\), 0x0 \\(was 0x[0-9a-f]{9,}\\)"}) {
    EXPECT_THAT(r.out, ContainsRegex(row));
  }
}

// A store inside an inlined function (ScaleHits, always_inline, in StoreScaled) is named by
// the inlined function and where it was inlined, live, in the profile and from a recording.
TEST(KwatchLaunch, ASiteInAnInlinedFunctionNamesItAndItsCaller) {
  const std::string out = ::testing::TempDir() + "inlined_" + std::to_string(::getpid()) + ".kwdb";
  std::remove(out.c_str());
  const RunResult r = RunKwatch(
      {"--backend", "page", "-o", out, "--write", "g_stats.hits", "--", TargetPath("layouts")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, ContainsRegex(" 1 -> 6 +ScaleHits inlined in StoreScaled\\+0x[0-9a-f]+ "
                                   "\\(layouts\\.c:[0-9]+\\)"));
  EXPECT_THAT(r.out, HasSubstr("StoreHits+0x0 (layouts.c:"));  // not inlined: as before
  const RunResult report = RunKwatch({"report", out});
  ASSERT_EQ(report.exit_code, 0) << report.err;
  EXPECT_THAT(report.out,
              ContainsRegex("0 +1 +ScaleHits inlined in StoreScaled\\+0x[0-9a-f]+ \\(layouts"));
  const RunResult as_json = RunKwatch({"report", "--format", "json", out});
  ASSERT_EQ(as_json.exit_code, 0) << as_json.err;
  EXPECT_THAT(as_json.out, HasSubstr("\"function\": \"StoreScaled\",\n"
                                     "          \"inlined\": \"ScaleHits\","));
  std::remove(out.c_str());
}

// A pointer's values are addresses: the live lines show them in hex (g_last alternates between
// the handle and NULL), JSON keeps numbers.
TEST(KwatchLaunch, PointerValuesAreShownInHex) {
  const RunResult as_json = RunKwatch(
      {"--json", "--backend", "page", "--write", "g_last", "--", TargetPath("opaque"), "4"});
  ASSERT_EQ(as_json.exit_code, 0) << as_json.err;
  const JsonRun run = ParseJsonLines(as_json.out);
  ASSERT_EQ(run.events.size(), 4u);
  const uint64_t handle = run.events[0]["value"].get<uint64_t>();
  EXPECT_NE(handle, 0u);
  const RunResult r =
      RunKwatch({"--backend", "page", "--write", "g_last", "--", TargetPath("opaque"), "4"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<std::string> values;
  for (const absl::string_view line : absl::StrSplit(r.out, '\n')) {
    if (absl::StrContains(line, " g_last ") && absl::StrContains(line, " -> ")) {
      values.emplace_back(line);
    }
  }
  ASSERT_EQ(values.size(), 4u) << r.out;
  // Addresses differ between runs (ASLR): compare the shape, and that NULL is 0x0.
  EXPECT_THAT(values[0], ContainsRegex(" 0x0 -> 0x[0-9a-f]{9,} "));
  EXPECT_THAT(values[1], ContainsRegex(" 0x[0-9a-f]{9,} -> 0x0 "));
  EXPECT_THAT(values[2], ContainsRegex(" 0x0 -> 0x[0-9a-f]{9,} "));
  EXPECT_THAT(values[3], ContainsRegex(" 0x[0-9a-f]{9,} -> 0x0 "));
}

// Ctrl-C, SIGTERM and SIGHUP all stop kwatch cleanly, and the target keeps working.
class KwatchStopSignal : public ::testing::TestWithParam<int> {};

TEST_P(KwatchStopSignal, StopsCleanlyAndLeavesTheTargetWorking) {
  const int sig = GetParam();
  const std::string truth_path = TruthFile(absl::StrCat("stop", sig));
  std::remove(truth_path.c_str());
  auto k = kwatch::testing::Spawned::Start({KwatchPath(), "--json", "--rw", "g_stats.hits", "--",
                                            TargetPath("field_writer"), "2", "400000", "--truth",
                                            truth_path});
  ASSERT_TRUE(k.ok()) << k.status();
  ASSERT_TRUE((*k)->WaitForStderr("armed").ok()) << (*k)->err();
  ASSERT_TRUE((*k)->WaitForStdout("\"type\":\"event\"").ok()) << (*k)->err();
  ASSERT_EQ(kill((*k)->pid(), sig), 0);
  auto r = (*k)->Finish();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->exit_code, 0) << r->err;
  const JsonRun run = ParseJsonLines(r->out);
  EXPECT_EQ(run.summary["stop_reason"], absl::StrCat("interrupted by ", sigabbrev_np(sig)));
  EXPECT_GT(run.summary["events"].get<long>(), 0);
  EXPECT_THAT(r->err, HasSubstr("keeps running"));
  // Unwatched and untraced now, the target finishes its work and writes its ground truth:
  // nothing kwatch changed in it (protected pages, registers) was left behind.
  for (int i = 0; i < 200 && ReadTruth(truth_path).size() < 2; ++i) {
    usleep(50 * 1000);
  }
  EXPECT_EQ(ReadTruth(truth_path).size(), 2u);
}

INSTANTIATE_TEST_SUITE_P(Signals, KwatchStopSignal, ::testing::Values(SIGINT, SIGTERM, SIGHUP),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return std::string(sigabbrev_np(info.param));
                         });

TEST(KwatchLaunch, WholeStructInPageModeCountsEachField) {
  const std::string truth_path = TruthFile("struct");
  const RunResult r = RunKwatch({"--json", "-q", "--backend", "page", "--rw", "g_stats", "--",
                                 TargetPath("field_writer"), "3", "400", "--truth", truth_path});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto truth = ReadTruth(truth_path);
  long hits = 0;
  long misses = 0;
  long flags = 0;
  for (const auto& [tid, t] : truth) {
    hits += t.hits_w;
    misses += t.misses_w;
    flags += t.flags_r;
  }
  const JsonRun run = ParseJsonLines(r.out);
  const json& w = run.summary["watches"][0];
  EXPECT_EQ(w["display"], "g_stats");
  std::map<std::string, std::pair<long, long>> fields;  // name -> (reads, writes)
  for (const auto& f : w["fields"]) {
    fields[f["field"].get<std::string>()] = {f["reads"].get<long>(), f["writes"].get<long>()};
  }
  EXPECT_EQ(fields.size(), 3u);
  EXPECT_EQ(fields["g_stats.hits"], std::make_pair(0L, hits));
  EXPECT_EQ(fields["g_stats.misses"], std::make_pair(0L, misses));
  EXPECT_EQ(fields["g_stats.flags"], std::make_pair(flags, 0L));
  EXPECT_EQ(run.summary["events"], hits + misses + flags);
}

TEST(KwatchLaunch, AForkedChildIsNotFollowedAndNotHarmed) {
  // The child inherits the watched (protected or breakpointed) memory; kwatch must clean it
  // up so that the child's 100 writes neither crash it nor count.
  for (const std::string backend : {"auto", "page"}) {
    const std::string truth_path = TruthFile("fork");
    const RunResult r =
        RunKwatch({"--json", "-q", "--backend", backend, "--write", "g_stats.hits", "--",
                   TargetPath("field_writer"), "2", "50", "--fork", "--truth", truth_path});
    ASSERT_EQ(r.exit_code, 0) << backend << ": " << r.err;
    const JsonRun run = ParseJsonLines(r.out);
    EXPECT_EQ(run.summary["events"], 100) << backend;  // the parent's 2 x 50, not the child's
  }
}

TEST(KwatchLaunch, ExecEndsTheWatchesAndTheNewImageRunsUntouched) {
  // field_writer writes g_stats.hits 2 x 30 times, then execs a program that exits 3.
  const std::string sh = "/bin/false";  // exits 1 in the new image
  const RunResult r =
      RunKwatch({"--json", "-q", "--write", "g_stats.hits", "--", TargetPath("field_writer"), "2",
                 "30", "--truth", TruthFile("exec"), "--exec", sh});
  EXPECT_EQ(r.exit_code, 1) << r.err;  // the new image's status
  EXPECT_THAT(r.err, HasSubstr("called exec"));
  const JsonRun run = ParseJsonLines(r.out);
  EXPECT_EQ(run.summary["events"], 60);
  EXPECT_THAT(run.summary["stop_reason"].get<std::string>(),
              HasSubstr("the watches ended when the target called exec"));
  EXPECT_EQ(run.summary["exit_code"], 1);
}

TEST(KwatchLaunch, JobControlStopAndContinueKeepCountsExact) {
  const std::string truth_path = TruthFile("jobctl");
  auto k = kwatch::testing::Spawned::Start({KwatchPath(), "--json", "--write", "g_stats.hits", "--",
                                            TargetPath("field_writer"), "2", "3000", "--truth",
                                            truth_path});
  ASSERT_TRUE(k.ok()) << k.status();
  ASSERT_TRUE((*k)->WaitForStderr("armed").ok()) << (*k)->err();
  const pid_t target = LaunchedTarget((*k)->pid());
  ASSERT_GT(target, 0);
  ASSERT_TRUE((*k)->WaitForStdout("\"type\":\"event\"").ok()) << (*k)->err();
  ASSERT_EQ(kill(target, SIGSTOP), 0);
  ASSERT_TRUE((*k)->WaitForStderr("stopped by STOP").ok()) << (*k)->err();
  usleep(200 * 1000);
  ASSERT_EQ(kill(target, SIGCONT), 0);
  auto r = (*k)->Finish();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->exit_code, 0) << r->err;
  const JsonRun run = ParseJsonLines(r->out);
  EXPECT_EQ(run.summary["events"], 6000);
  EXPECT_EQ(run.summary["stop_reason"], "target exited");
  EXPECT_EQ(ReadTruth(truth_path).size(), 2u);
}

TEST(KwatchAttach, CountsExactlyOnARunningProcess) {
  const std::string truth_path = TruthFile("attach");
  auto target = kwatch::testing::Spawned::Start(
      {TargetPath("field_writer"), "4", "500", "--wait", "--truth", truth_path});
  ASSERT_TRUE(target.ok());
  ASSERT_TRUE((*target)->WaitForStdout("ready").ok());
  auto k = kwatch::testing::Spawned::Start(
      {KwatchPath(), "--json", "--rw", "g_stats.misses", "-p", absl::StrCat((*target)->pid())});
  ASSERT_TRUE(k.ok());
  ASSERT_TRUE((*k)->WaitForStderr("armed").ok()) << (*k)->err();
  ASSERT_EQ(kill((*target)->pid(), SIGUSR1), 0);
  auto r = (*k)->Finish();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->exit_code, 0) << r->err;
  auto tr = (*target)->Finish();
  ASSERT_TRUE(tr.ok());
  EXPECT_EQ(tr->exit_code, 0);
  const auto truth = ReadTruth(truth_path);
  ASSERT_EQ(truth.size(), 4u);
  const JsonRun run = ParseJsonLines(r->out);
  const auto writes = CountByTid(run.events, "w");
  for (const auto& [tid, t] : truth) {
    EXPECT_EQ(writes.count(tid) ? writes.at(tid) : 0, t.misses_w) << "tid " << tid;
  }
  EXPECT_TRUE(CountByTid(run.events, "r").empty());
  EXPECT_EQ(run.summary["events"], 1000);
  EXPECT_EQ(run.summary["lost"], 0);
  EXPECT_EQ(run.summary["stop_reason"], "target exited");
}

TEST(KwatchAttach, DetachLeavesTheTargetRunningAndUnharmed) {
  const std::string truth_path = TruthFile("detach");
  auto target = kwatch::testing::Spawned::Start(
      {TargetPath("field_writer"), "2", "300", "--wait", "--truth", truth_path, "--exit", "5"});
  ASSERT_TRUE(target.ok());
  ASSERT_TRUE((*target)->WaitForStdout("ready").ok());
  const RunResult r = RunKwatch(
      {"--write", "g_stats.hits", "--duration", "0.3", "-p", absl::StrCat((*target)->pid())});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("--duration 0.3s elapsed"));
  EXPECT_THAT(r.err, HasSubstr("keeps running"));
  ASSERT_EQ(kill((*target)->pid(), SIGUSR1), 0);
  auto tr = (*target)->Finish();
  ASSERT_TRUE(tr.ok());
  EXPECT_EQ(tr->exit_code, 5);  // ran to its end, untraced and unwatched
  EXPECT_EQ(ReadTruth(truth_path).size(), 2u);
}

// --- Bad input: each gets a message a user can act on. ---

TEST(KwatchErrors, UnknownVariableSuggestsNearMatches) {
  const RunResult r =
      RunKwatch({"--write", "g_stat.hits", "--", TargetPath("field_writer"), "1", "1"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("did you mean 'g_stats'"));
}

TEST(KwatchErrors, FunctionGivenToWrite) {
  const RunResult r = RunKwatch({"--write", "Work", "--", TargetPath("field_writer"), "1", "1"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("is a function"));
}

TEST(KwatchErrors, ExpressionThatDoesNotParseSaysWhere) {
  const RunResult r =
      RunKwatch({"--write", "g_stats.", "--", TargetPath("field_writer"), "1", "1"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("column"));
}

TEST(KwatchErrors, UnknownMemberListsMembers) {
  const RunResult r =
      RunKwatch({"--write", "g_stats.hitz", "--", TargetPath("field_writer"), "1", "1"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("hits"));
  EXPECT_THAT(r.err, HasSubstr("misses"));
}

TEST(KwatchErrors, UnalignedFieldIsSplitIntoAlignedChunks) {
  // g_stats.tag is 8 bytes at offset 14, not 8-aligned: three registers (2 + 4 + 2 bytes).
  const RunResult r =
      RunKwatch({"--backend", "perf", "--json", "-q", "--write", "g_stats.tag", "--",
                 TargetPath("field_writer"), "1", "1", "--truth", TruthFile("split-tag")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const JsonRun run = ParseJsonLines(r.out);
  const json& w = run.summary["watches"][0];
  const uint64_t addr = std::stoull(w["addr"].get<std::string>(), nullptr, 16);
  ASSERT_EQ(w["slots"].size(), 3u) << w.dump();
  const std::pair<uint64_t, int> want[] = {{addr, 2}, {addr + 2, 4}, {addr + 6, 2}};
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(std::stoull(w["slots"][i]["addr"].get<std::string>(), nullptr, 16), want[i].first);
    EXPECT_EQ(w["slots"][i]["len"], want[i].second);
  }
  EXPECT_EQ(w["exact_cover"], true);
}

TEST(KwatchErrors, OversizedRangeIsRefusedWithTheRule) {
  // g_matrix (int[3][4], 48 bytes) cannot be covered by four 8-byte registers.
  const RunResult r = RunKwatch({"--backend", "perf", "--overcommit", "fail", "--write", "g_matrix",
                                 "--", TargetPath("layouts")});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("'g_matrix' (48 bytes at 0x"));
  EXPECT_THAT(r.err, HasSubstr("a thread or CPU has only 4"));
}

TEST(KwatchErrors, NoSuchPid) {
  const RunResult r = RunKwatch({"--write", "x", "-p", "999999999"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("no process with pid 999999999"));
}

TEST(KwatchErrors, ProgramThatCannotBeExecuted) {
  const RunResult r = RunKwatch({"--write", "x", "--", "/nonexistent/prog"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("cannot execute '/nonexistent/prog'"));
}

TEST(KwatchErrors, NoTargetLooksTheNameUpInTheKernelAndSaysSo) {
  // No -p and no command: a kernel watch. The name resolves nowhere (an error, 1; 2 is for
  // usage errors), and the note says where kwatch looked, for a user who forgot -p.
  const RunResult r = RunKwatch({"--write", "x"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("kwatch: note: no target was given (-p PID or a command after "
                               "`--`), so kwatch watched the kernel"));
}

TEST(KwatchErrors, TracingWithoutPermissionNamesTheCapability) {
  // An unprivileged user (nobody) may not trace a root process.
  auto target = kwatch::testing::Spawned::Start({TargetPath("field_writer"), "1", "1", "--wait"});
  ASSERT_TRUE(target.ok());
  ASSERT_TRUE((*target)->WaitForStdout("ready").ok());
  // The build tree may not be reachable by nobody (a checkout under /root): run a copy.
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / absl::StrCat("kwatch-nobody-", getpid());
  std::filesystem::create_directories(dir);
  const std::filesystem::path copy = dir / "kwatch";
  std::filesystem::copy_file(KwatchPath(), copy, std::filesystem::copy_options::overwrite_existing);
  std::filesystem::permissions(dir, std::filesystem::perms(0755));
  std::filesystem::permissions(copy, std::filesystem::perms(0755));
  int errp[2];
  ASSERT_EQ(pipe(errp), 0);
  const std::string pid = absl::StrCat((*target)->pid());
  const std::string kw = copy.string();
  const pid_t child = fork();
  if (child == 0) {
    dup2(errp[1], 2);
    if (setgid(65534) != 0 || setuid(65534) != 0) {
      _exit(99);
    }
    execl(kw.c_str(), kw.c_str(), "--write", "g_stats.hits", "-p", pid.c_str(), nullptr);
    _exit(98);
  }
  close(errp[1]);
  std::string err;
  char buf[4096];
  for (ssize_t n; (n = read(errp[0], buf, sizeof(buf))) > 0;) {
    err.append(buf, static_cast<size_t>(n));
  }
  close(errp[0]);
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_NE(WEXITSTATUS(status), 99) << "cannot switch to uid 65534 (are tests running as root?)";
  EXPECT_EQ(WEXITSTATUS(status), 1) << err;
  EXPECT_THAT(err, HasSubstr("needs root or CAP_SYS_PTRACE"));
  kill((*target)->pid(), SIGUSR1);
  std::filesystem::remove_all(dir);
}

// Out of file descriptors (one per thread and debug register in stop mode): the thread that
// cannot be armed is named with the reason and the limit to raise, and the session ends
// cleanly instead of leaving new threads in traced stop forever with nothing said.
TEST(App, AThreadThatCannotBeArmedIsNamedAndNoThreadIsLeftStopped) {
  auto k = kwatch::testing::Spawned::Start(
      {"/bin/sh", "-c",
       absl::StrCat("ulimit -n 32; exec ", KwatchPath(), " --stop --write release -q -- ",
                    TargetPath("remote_call"), " threads 60")});
  ASSERT_TRUE(k.ok()) << k.status();
  auto r = (*k)->Finish(/*timeout_s=*/30);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->exit_code, 1) << r->err;
  EXPECT_THAT(r->err, ::testing::ContainsRegex(
                          "kwatch: error: arming the debug registers of new thread [0-9]+: "
                          "perf_event_open\\(.*\\): Too many open files; kwatch holds one "
                          "descriptor per thread and debug register: raise its limit \\(ulimit "
                          "-n, now 32\\)"));
  // The launched target went with the session: no thread of it is left in traced stop.
  const size_t at = r->err.find("armed 1 watch on pid ");
  ASSERT_NE(at, std::string::npos) << r->err;
  const pid_t target = std::atoi(r->err.c_str() + at + std::strlen("armed 1 watch on pid "));
  ASSERT_GT(target, 0);
  for (int i = 0; i < 100 && ::kill(target, 0) == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_NE(::kill(target, 0), 0) << "target " << target << " is still there";
}

}  // namespace
}  // namespace kwatch
