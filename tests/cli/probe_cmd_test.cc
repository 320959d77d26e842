// End-to-end tests of `kwatch probe`: the real binary on fixtures whose calls and arguments
// are known (tests/targets/uprobe_loop.c, probe_args.c, probe_cli_pause.c).
#include <grp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "tests/cli/probe_test_util.h"
#include "tests/test_util.h"

namespace kwatch {
namespace {

using ::kwatch::testing::KwatchPath;
using ::kwatch::testing::KwatchProbe;
using ::kwatch::testing::RunResult;
using ::kwatch::testing::Spawned;
using ::kwatch::testing::SubreaperScope;
using ::testing::HasSubstr;
using ::testing::Not;
using json = nlohmann::json;
using ::kwatch::testing::JsonRun;
using ::kwatch::testing::OfEvent;
using ::kwatch::testing::ParseJson;
using ::kwatch::testing::PrivateCopies;
using ::kwatch::testing::PrivateTargetPath;

std::string TargetPath(const std::string& name) {
  return PrivateTargetPath(name);
}

// The 1-based line of tests/targets/NAME that contains `needle`.
int SourceLine(const std::string& file, const std::string& needle) {
  std::ifstream in(std::string(KWATCH_SOURCE_DIR) + "/tests/targets/" + file);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.find(needle) != std::string::npos) {
      return n;
    }
  }
  ADD_FAILURE() << "no line with " << needle << " in " << file;
  return -1;
}

// sum over i < n of 3i + 100 (uprobe_loop, one thread).
long LoopSum(long n) {
  return 3 * n * (n - 1) / 2 + 100 * n;
}

// Checks uprobe_loop's hits of 'tick i r->len' and 'tick%return $retval' for `n` calls of
// one thread: i = 0..n-1 in order, r->len = 100, return values 3i + 100 in order.
void ExpectLoopHits(const JsonRun& run, long n) {
  const std::vector<json> entries = OfEvent(run.hits, "tick");
  const std::vector<json> returns = OfEvent(run.hits, "tick__return");
  ASSERT_EQ(entries.size(), static_cast<size_t>(n)) << run.summary.dump();
  ASSERT_EQ(returns.size(), static_cast<size_t>(n)) << run.summary.dump();
  const int line = SourceLine("uprobe_loop.c", "return 3 * i + r->len;");
  for (long i = 0; i < n; ++i) {
    ASSERT_EQ(entries[i]["args"]["i"], i) << entries[i].dump();
    ASSERT_EQ(entries[i]["args"]["r->len"], 100) << entries[i].dump();
    ASSERT_EQ(returns[i]["args"]["arg1"], 3 * i + 100) << returns[i].dump();
    ASSERT_EQ(entries[i]["function"], "tick");
    ASSERT_EQ(entries[i]["offset"], 0);
    ASSERT_EQ(entries[i]["line"], line);
    ASSERT_EQ(returns[i]["is_return"], true);
    ASSERT_THAT(returns[i]["caller"].get<std::string>(), HasSubstr("run+"));
  }
  // Entry and return alternate, in time order.
  for (size_t k = 0; k < run.hits.size(); ++k) {
    ASSERT_EQ(run.hits[k]["event"], k % 2 == 0 ? "tick" : "tick__return") << k;
    if (k > 0) {
      ASSERT_GE(run.hits[k]["time_ns"].get<uint64_t>(), run.hits[k - 1]["time_ns"].get<uint64_t>());
    }
  }
}

// The pid kwatch names in its "armed ... on pid N" line.
pid_t ArmedPid(const std::string& err) {
  std::smatch m;
  const std::regex re("armed .* on pid ([0-9]+)");
  if (!std::regex_search(err, m, re)) {
    return 0;
  }
  return std::stoi(m[1]);
}

std::string TempPath(const std::string& name) {
  return absl::StrCat(::testing::TempDir(), "/probe_cmd_test.", getpid(), ".", name);
}

TEST(ProbeCmd, EntryArgumentsAndReturnValuesExact) {
  const RunResult r = KwatchProbe(
      {"--json", "tick i r->len", "tick%return $retval", "--", TargetPath("uprobe_loop"), "1000"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const JsonRun run = ParseJson(r.out);
  ExpectLoopHits(run, 1000);
  EXPECT_THAT(run.other, ::testing::ElementsAre(absl::StrCat("sum=", LoopSum(1000))));
  EXPECT_EQ(run.summary["hits"], 2000);
}

TEST(ProbeCmd, UprobeBackendGivesTheSameHitsAndValues) {
  const RunResult r = KwatchProbe({"--json", "--backend", "uprobe", "tick i r->len",
                                   "tick%return $retval", "--", TargetPath("uprobe_loop"), "1000"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const JsonRun run = ParseJson(r.out);
  ExpectLoopHits(run, 1000);
  EXPECT_THAT(run.other, ::testing::ElementsAre(absl::StrCat("sum=", LoopSum(1000))));
  EXPECT_EQ(run.summary["backend"], "uprobe");
  EXPECT_EQ(run.summary["hits"], 2000);
  EXPECT_EQ(run.summary["exit_code"], 0);
  for (const json& p : run.summary["probes"]) {
    EXPECT_EQ(p["hits"], 1000) << p.dump();
    EXPECT_EQ(p["lost"], 0) << p.dump();
  }
}

TEST(ProbeCmd, UprobeBackendSaysWhatItCouldNotSample) {
  // r->name points into .rodata, not the stack: the uprobe backend has no copy of it.
  const RunResult r = KwatchProbe({"--json", "--backend", "uprobe", "tick r->name:string", "--",
                                   TargetPath("uprobe_loop"), "3"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const JsonRun run = ParseJson(r.out);
  ASSERT_EQ(run.hits.size(), 3u);
  for (const json& h : run.hits) {
    EXPECT_EQ(h["args"]["r->name_string"], "(not sampled)");
  }
  EXPECT_THAT(run.summary["notes"].dump(), HasSubstr("3 argument values showed (not sampled)"));
  // The ptrace backend reads the string at the hit.
  const RunResult p =
      KwatchProbe({"--json", "tick r->name:string", "--", TargetPath("uprobe_loop"), "3"});
  ASSERT_EQ(p.exit_code, 0) << p.err;
  for (const json& h : ParseJson(p.out).hits) {
    EXPECT_EQ(h["args"]["r->name_string"], "loop");
  }
}

TEST(ProbeCmd, FourThreadsEachCountedExactly) {
  // "agent": the probe through a jump to a trampoline; "agent --no-jump": through the agent's
  // INT3 handler.
  for (const std::string backend : {"ptrace", "uprobe", "agent", "agent --no-jump"}) {
    SCOPED_TRACE(backend);
    std::vector<std::string> args = {"--json", "--backend"};
    for (absl::string_view w : absl::StrSplit(backend, ' ')) {
      args.emplace_back(w);
    }
    if (backend == "uprobe") {
      // Rings big enough for every sample even if kwatch gets no CPU meanwhile.
      args.insert(args.end(), {"--ring-pages", "4096"});
    }
    args.insert(args.end(),
                {"tick i r->len", "--", TargetPath("uprobe_loop"), "2000", "--threads", "4"});
    const RunResult r = KwatchProbe(args);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const JsonRun run = ParseJson(r.out);
    ASSERT_EQ(run.hits.size(), 8000u) << run.summary.dump() << "\n" << r.err;
    // Each thread calls tick(i, r) for i = 0..1999 with its own r->len (100 + thread index).
    std::map<int, std::vector<long>> by_tid;
    std::map<int, std::set<long>> lens;
    for (const json& h : run.hits) {
      by_tid[h["tid"].get<int>()].push_back(h["args"]["i"].get<long>());
      lens[h["tid"].get<int>()].insert(h["args"]["r->len"].get<long>());
    }
    ASSERT_EQ(by_tid.size(), 4u);
    std::set<long> all_lens;
    for (const auto& [tid, is] : by_tid) {
      ASSERT_EQ(is.size(), 2000u) << tid;
      for (long i = 0; i < 2000; ++i) {
        ASSERT_EQ(is[i], i) << tid;
      }
      ASSERT_EQ(lens[tid].size(), 1u);
      all_lens.insert(*lens[tid].begin());
    }
    EXPECT_EQ(all_lens, (std::set<long>{100, 101, 102, 103}));
    long sum = 0;
    for (long t = 0; t < 4; ++t) {
      sum += 3 * 2000 * 1999 / 2 + (100 + t) * 2000;
    }
    EXPECT_THAT(run.other, ::testing::ElementsAre(absl::StrCat("sum=", sum)));
  }
}

TEST(ProbeCmd, AgentBackendGivesTheSameHitsAndValuesOnEachPath) {
  for (const bool jump : {true, false}) {
    SCOPED_TRACE(jump ? "jump" : "int3");
    std::vector<std::string> args = {"--json", "--backend", "agent"};
    if (!jump) {
      args.push_back("--no-jump");
    }
    args.insert(args.end(),
                {"tick i r->len", "tick%return $retval", "--", TargetPath("uprobe_loop"), "1000"});
    const RunResult r = KwatchProbe(args);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const JsonRun run = ParseJson(r.out);
    ExpectLoopHits(run, 1000);
    EXPECT_THAT(run.other, ::testing::ElementsAre(absl::StrCat("sum=", LoopSum(1000))));
    EXPECT_EQ(run.summary["backend"], "agent");
    EXPECT_EQ(run.summary["hits"], 2000);
    EXPECT_EQ(run.summary["exit_code"], 0);
    ASSERT_EQ(run.summary["probes"].size(), 2u);
    for (const json& p : run.summary["probes"]) {
      EXPECT_EQ(p["hits"], 1000) << p.dump();
      EXPECT_EQ(p["lost"], 0) << p.dump();
      EXPECT_EQ(p["misses"], 0) << p.dump();
      EXPECT_EQ(p["path"], jump ? "jump" : "int3") << p.dump();
      if (!jump) {
        EXPECT_EQ(p["path_reason"], "--no-jump") << p.dump();
      }
    }
    EXPECT_THAT(r.err, HasSubstr("agent backend"));
  }
}

TEST(ProbeCmd, AgentBackendTextSummaryNamesEachProbesPath) {
  // tick+0x4 lies inside the bytes a jump at tick+0x0 would overwrite: tick+0x0 takes the
  // INT3 path and says why, tick+0x4 the jump.
  const RunResult r = KwatchProbe(
      {"-q", "--backend", "agent", "tick", "tick+4", "--", TargetPath("uprobe_loop"), "10"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("agent backend (target exited)"));
  EXPECT_THAT(r.out,
              ::testing::ContainsRegex("\ntick +tick +uprobe_loop.c:[0-9]+ +10 +0 +- +0 int3\n"
                                       "    int3, not jump: no jump at tick\\+0x0 "
                                       "\\(0x[0-9a-f]+\\): another probe at tick\\+0x4 "));
  EXPECT_THAT(r.out, ::testing::ContainsRegex(
                         "\ntick_1 +tick\\+0x4 +uprobe_loop.c:[0-9]+ +10 +0 +- +0 jump\n"));
}

TEST(ProbeCmd, AgentBackendRefusesAStaticProgramAndAutoFallsBack) {
  // remote_call_static has no dynamic loader: the agent cannot be loaded into it.
  const std::string prog = TargetPath("remote_call_static");
  const RunResult a = KwatchProbe({"--backend", "agent", "main", "--", prog, "count", "3"});
  EXPECT_EQ(a.exit_code, 1) << a.err;
  EXPECT_THAT(a.err, HasSubstr("the in-process agent cannot serve"));
  EXPECT_THAT(a.err, HasSubstr("statically linked"));
  // auto: the same probe by the ptrace backend, with a note saying why.
  const RunResult b =
      KwatchProbe({"--json", "--backend", "auto", "main", "--", prog, "count", "3"});
  ASSERT_EQ(b.exit_code, 0) << b.err;
  EXPECT_THAT(b.err, HasSubstr("statically linked"));
  EXPECT_THAT(b.err, HasSubstr("the ptrace backend runs the probes"));
  const JsonRun run = ParseJson(b.out);
  EXPECT_EQ(run.summary["backend"], "ptrace");
  EXPECT_EQ(run.summary["hits"], 1);
  EXPECT_EQ(run.summary["probes"][0]["path"], "ptrace");
  EXPECT_THAT(run.other, ::testing::ElementsAre("tick 0", "tick 1", "tick 2", "sum 5"));
}

TEST(ProbeCmd, UprobeBackendCountsTheSamplesItDropped) {
  // One-page rings (5 samples) under four busy threads overflow: every call is either shown
  // or counted lost, and the summary says so.
  const RunResult r =
      KwatchProbe({"--json", "-q", "--backend", "uprobe", "--ring-pages", "1", "tick i", "--",
                   TargetPath("uprobe_loop"), "2000", "--threads", "4"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const JsonRun run = ParseJson(r.out);
  const json& p = run.summary["probes"][0];
  EXPECT_EQ(p["kernel_count"], 8000);
  EXPECT_EQ(p["hits"].get<long>() + p["lost"].get<long>(), 8000) << p.dump();
  if (p["lost"].get<long>() > 0) {
    EXPECT_THAT(run.summary["notes"].dump(),
                HasSubstr(absl::StrCat("the kernel dropped ", p["lost"].get<long>(), " samples")));
  }
}

TEST(ProbeCmd, TextLinesShowTimeTidEventLocationAndArgs) {
  // The ptrace backend's columns (AgentBackendTextSummaryNamesEachProbesPath has the agent's).
  const RunResult r =
      KwatchProbe({"--backend", "ptrace", "tick i r->len", "ret=tick%return $retval", "--",
                   TargetPath("uprobe_loop"), "2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const int line = SourceLine("uprobe_loop.c", "return 3 * i + r->len;");
  const int call = SourceLine("uprobe_loop.c", "sum += tick(i, &r);");
  std::vector<std::string> hits;
  for (absl::string_view l : absl::StrSplit(r.out, '\n')) {
    if (!l.empty() && absl::ascii_isdigit(l.front())) {
      hits.emplace_back(l);
    }
  }
  ASSERT_EQ(hits.size(), 4u) << r.out;
  const std::string entry_re =
      absl::StrCat(R"(^[0-9]+\.[0-9]{6} +[0-9]+ +tick +tick \(uprobe_loop\.c:)", line,
                   R"(\) +i=([01]) r->len=100$)");
  const std::string ret_re =
      absl::StrCat(R"(^[0-9]+\.[0-9]{6} +[0-9]+ +ret +tick%return <- )",
                   R"(run\+0x[0-9a-f]+ \(uprobe_loop\.c:)", call, R"(\) +arg1=(100|103)$)");
  EXPECT_TRUE(std::regex_match(hits[0], std::regex(entry_re))) << hits[0];
  EXPECT_TRUE(std::regex_match(hits[1], std::regex(ret_re))) << hits[1];
  EXPECT_THAT(hits[2], HasSubstr("i=1 r->len=100"));
  EXPECT_THAT(hits[3], HasSubstr("arg1=103"));
  EXPECT_THAT(r.out, HasSubstr("TIME(s)"));
  EXPECT_THAT(r.out, HasSubstr("sum=203"));
  // The summary table: event, location, source, hits, misses, nmissed (return probes).
  EXPECT_TRUE(std::regex_search(
      r.out, std::regex(absl::StrCat(R"(\ntick +tick +uprobe_loop\.c:)", line, R"( +2 +0 +-\n)"))))
      << r.out;
  EXPECT_TRUE(std::regex_search(
      r.out,
      std::regex(absl::StrCat(R"(\nret +tick%return +uprobe_loop\.c:)", line, R"( +2 +0 +0\n)"))))
      << r.out;
  EXPECT_THAT(r.out, HasSubstr("    i                2 distinct: 0 (1) 1 (1)\n"));
  EXPECT_THAT(r.out, HasSubstr("    r->len           1 distinct: 100 (2)\n"));
  EXPECT_THAT(r.out, HasSubstr("exited with status 0"));
}

TEST(ProbeCmd, JsonSummaryIsExact) {
  const RunResult r = KwatchProbe({"--json", "-q", "--backend", "ptrace", "tick i",
                                   "tick%return $retval", "--", TargetPath("uprobe_loop"), "1000"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const JsonRun run = ParseJson(r.out);
  EXPECT_TRUE(run.hits.empty());
  const json& s = run.summary;
  EXPECT_EQ(s["backend"], "ptrace");
  EXPECT_EQ(s["hits"], 2000);
  EXPECT_EQ(s["stop_reason"], "target exited");
  EXPECT_EQ(s["exit_code"], 0);
  EXPECT_EQ(s["signal"], 0);
  ASSERT_EQ(s["probes"].size(), 2u);
  const json& entry = s["probes"][0];
  EXPECT_EQ(entry["event"], "tick");
  EXPECT_EQ(entry["spec"], "tick i");
  EXPECT_EQ(entry["location"], "tick");
  EXPECT_EQ(entry["is_return"], false);
  EXPECT_EQ(entry["hits"], 1000);
  EXPECT_EQ(entry["misses"], 0);
  EXPECT_EQ(entry["nmissed"], 0);
  EXPECT_EQ(entry["line"], SourceLine("uprobe_loop.c", "return 3 * i + r->len;"));
  ASSERT_EQ(entry["args"].size(), 1u);
  EXPECT_EQ(entry["args"][0]["name"], "i");
  EXPECT_EQ(entry["args"][0]["distinct"], 1000);
  const json& ret = s["probes"][1];
  EXPECT_EQ(ret["event"], "tick__return");
  EXPECT_EQ(ret["location"], "tick%return");
  EXPECT_EQ(ret["is_return"], true);
  EXPECT_EQ(ret["hits"], 1000);
  EXPECT_EQ(ret["nmissed"], 0);
  EXPECT_EQ(ret["abandoned"], 0);
  EXPECT_EQ(ret["args"][0]["name"], "arg1");
  EXPECT_EQ(ret["args"][0]["distinct"], 1000);
}

TEST(ProbeCmd, MaxactiveBoundsTrackedReturnsAndCountsNmissed) {
  // fact(5) recurses 5 deep; with one instance only the outermost call is tracked.
  const RunResult r = KwatchProbe(
      {"--json", "--maxactive", "1", "fact%return $retval", "--", TargetPath("probe_args")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const JsonRun run = ParseJson(r.out);
  ASSERT_EQ(run.hits.size(), 1u);
  EXPECT_EQ(run.hits[0]["args"]["arg1"], 120);
  EXPECT_EQ(run.summary["probes"][0]["hits"], 1);
  EXPECT_EQ(run.summary["probes"][0]["nmissed"], 4);
  // Without the bound every level returns: 1, 2, 6, 24, 120.
  const RunResult all =
      KwatchProbe({"--json", "fact%return $retval", "--", TargetPath("probe_args")});
  ASSERT_EQ(all.exit_code, 0) << all.err;
  std::vector<long> values;
  for (const json& h : ParseJson(all.out).hits) {
    values.push_back(h["args"]["arg1"].get<long>());
  }
  EXPECT_EQ(values, (std::vector<long>{1, 2, 6, 24, 120}));
}

TEST(ProbeCmd, StringsStructMembersAndLines) {
  const int body = SourceLine("probe_args.c", "PROBE: loop body");
  const RunResult r = KwatchProbe(
      {"--json", "name_len name:string limit", "sum_item p->id p->label:string p->values[2]",
       absl::StrCat("probe_args.c:", body, " i"), "--", TargetPath("probe_args")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const JsonRun run = ParseJson(r.out);
  const std::vector<json> names = OfEvent(run.hits, "name_len");
  ASSERT_EQ(names.size(), 1u);
  EXPECT_EQ(names[0]["args"]["name_string"], "hello probe");
  EXPECT_EQ(names[0]["args"]["limit"], 64);
  const std::vector<json> items = OfEvent(run.hits, "sum_item");
  ASSERT_EQ(items.size(), 3u);
  EXPECT_EQ(items[0]["args"]["p->id"], 101);
  EXPECT_EQ(items[0]["args"]["p->label_string"], "first");
  EXPECT_EQ(items[0]["args"]["p->values[2]"], 3);
  EXPECT_EQ(items[1]["args"]["p->id"], 202);
  EXPECT_EQ(items[1]["args"]["p->label_string"], "second");
  EXPECT_EQ(items[1]["args"]["p->values[2]"], 30);
  EXPECT_EQ(items[2]["args"]["p->id"], 303);
  EXPECT_EQ(items[2]["args"]["p->label_string"], "local");
  EXPECT_EQ(items[2]["args"]["p->values[2]"], 7);
  std::vector<long> is;
  for (const json& h : run.hits) {
    if (h["line"] == body && h["function"] == "loop_lines") {
      is.push_back(h["args"]["i"].get<long>());
    }
  }
  EXPECT_EQ(is, (std::vector<long>{0, 1, 2, 3}));
}

// The C library this test runs with (the fixtures load the same one).
std::string LibcPath() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    const size_t slash = line.find('/');
    if (slash != std::string::npos && line.find("/libc.so") != std::string::npos) {
      return line.substr(slash);
    }
  }
  return "";
}

TEST(ProbeCmd, SharedLibraryProbedWithMinusX) {
  const std::string libc = LibcPath();
  ASSERT_FALSE(libc.empty());
  const RunResult r = KwatchProbe(
      {"--json", "-x", libc, "printf fmt=+0(%di):string", "--", TargetPath("probe_args")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const JsonRun run = ParseJson(r.out);
  ASSERT_EQ(run.hits.size(), 1u) << r.out;
  EXPECT_EQ(run.hits[0]["args"]["fmt"], "sum=%ld scaled=%g total=%ld\n");
  EXPECT_EQ(run.hits[0]["function"], "printf");
}

TEST(ProbeCmd, ExecEndsTheProbesAndForkedChildrenAreNotProbed) {
  // probe_engine exec 5 3: work() 5 times, then exec itself and work() 3 more times. (The
  // ptrace backend sees the exec itself; the agent's session learns of it when the agent's
  // lifeline closes and the process runs on, which a program that ends a moment after its
  // exec, as this one, does not leave it time to see.)
  const RunResult e = KwatchProbe({"--json", "--backend", "ptrace", "work", "--",
                                   TargetPath("probe_engine"), "exec", "5", "3"});
  ASSERT_EQ(e.exit_code, 0) << e.err;
  JsonRun run = ParseJson(e.out);
  EXPECT_EQ(run.hits.size(), 5u);
  EXPECT_THAT(run.summary["notes"].dump(), HasSubstr("called exec"));
  EXPECT_THAT(e.out, HasSubstr("after exec sum"));
  // probe_engine fork: work() 100 times, a child forked at i == 50 calls it 10 more times.
  const RunResult f = KwatchProbe({"--json", "work", "--", TargetPath("probe_engine"), "fork"});
  ASSERT_EQ(f.exit_code, 0) << f.err;
  run = ParseJson(f.out);
  EXPECT_EQ(run.hits.size(), 100u);
  EXPECT_THAT(f.out, HasSubstr("child exited 0 signaled 0"));
  EXPECT_THAT(run.summary["notes"].dump(), HasSubstr("forked 1 child"));
}

TEST(ProbeCmd, CountStopsAfterNAndTheTargetFinishesUnharmed) {
  const RunResult r =
      KwatchProbe({"--json", "-c", "10", "tick i", "--", TargetPath("uprobe_loop"), "100000"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const JsonRun run = ParseJson(r.out);
  ASSERT_EQ(run.hits.size(), 10u);
  for (long i = 0; i < 10; ++i) {
    EXPECT_EQ(run.hits[i]["args"]["i"], i);
  }
  EXPECT_EQ(run.summary["hits"], 10);
  EXPECT_EQ(run.summary["stop_reason"], "--count 10 reached");
  EXPECT_EQ(run.summary["probes"][0]["hits"], 10);
  // Unprobed, the rest of the calls take about a millisecond: the target may end while kwatch
  // detaches (then the summary has its exit), or after.
  if (run.summary["exit_code"].is_null()) {
    EXPECT_THAT(r.err, HasSubstr("keeps running"));
  } else {
    EXPECT_EQ(run.summary["exit_code"], 0);
  }
  // The target, detached with its code restored, ran every call and printed the right sum
  // (kwatch's stdout pipe stays open until the target closes it too).
  EXPECT_THAT(run.other, ::testing::ElementsAre(absl::StrCat("sum=", LoopSum(100000))));
}

TEST(ProbeCmd, ListLinesLikePerfProbeL) {
  const RunResult r = KwatchProbe({"-x", TargetPath("probe_args"), "-L", "loop_lines"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const int decl = SourceLine("probe_args.c", "long loop_lines(int n)");
  const int body = SourceLine("probe_args.c", "PROBE: loop body");
  const int empty = SourceLine("probe_args.c", "PROBE: no code on this line");
  std::vector<std::string> lines = absl::StrSplit(r.out, '\n');
  ASSERT_GE(lines.size(), 9u) << r.out;
  EXPECT_TRUE(std::regex_match(lines[0], std::regex(R"(<loop_lines@.*/probe_args\.c:0>)")))
      << lines[0];
  EXPECT_EQ(lines[1], "      0  __attribute__((noipa)) long loop_lines(int n) {");
  // A line with code carries its number relative to the declaration; one without has none.
  EXPECT_EQ(lines[1 + body - decl],
            absl::StrFormat("%7d      acc += tick(i) * 3;  // PROBE: loop body", body - decl));
  EXPECT_EQ(lines[1 + empty - decl], "           // PROBE: no code on this line or the one above");
  // The relative line works as a probe point.
  const RunResult hit = KwatchProbe(
      {"--json", absl::StrCat("loop_lines:", body - decl, " i"), "--", TargetPath("probe_args")});
  ASSERT_EQ(hit.exit_code, 0) << hit.err;
  EXPECT_EQ(ParseJson(hit.out).hits.size(), 4u);
}

TEST(ProbeCmd, ListFunctionsLikePerfProbeFuncs) {
  // The program's own functions, sorted; none of the C runtime's `_start`, `__libc_csu_*`
  // (perf's default filter, !_*), no PLT stub or import.
  const RunResult all = KwatchProbe({"-x", TargetPath("probe_args"), "-F"});
  ASSERT_EQ(all.exit_code, 0) << all.err;
  EXPECT_EQ(all.out,
            "add_ints\nfact\nlocal_item\nloop_lines\nmain\nmany_args\nname_len\nscale\n"
            "sum_item\ntick\n");
  const RunResult s = KwatchProbe({"-x", TargetPath("probe_args"), "--funcs", "s*"});
  ASSERT_EQ(s.exit_code, 0) << s.err;
  EXPECT_EQ(s.out, "scale\nsum_item\n");
  // A leading ! excludes; each listed name is a probe point.
  const RunResult underscore = KwatchProbe({"-x", TargetPath("probe_args"), "-F", "_*"});
  ASSERT_EQ(underscore.exit_code, 0) << underscore.err;
  EXPECT_THAT(underscore.out, HasSubstr("_start\n"));
  const RunResult none = KwatchProbe({"-x", TargetPath("probe_args"), "-F", "zz*"});
  EXPECT_EQ(none.exit_code, 1);
  EXPECT_EQ(none.err, absl::StrCat("kwatch: error: no function of ", TargetPath("probe_args"),
                                   " matches 'zz*'\n"));
  // A library, and the program of a command.
  const RunResult libc = KwatchProbe({"-x", "/lib/x86_64-linux-gnu/libc.so.6", "-F", "mallo?"});
  ASSERT_EQ(libc.exit_code, 0) << libc.err;
  EXPECT_EQ(libc.out, "malloc\n");
  const RunResult cmd = KwatchProbe({"-F", "t*", "--", TargetPath("probe_args")});
  ASSERT_EQ(cmd.exit_code, 0) << cmd.err;
  EXPECT_EQ(cmd.out, "tick\n");
  // Listing takes no spec.
  const RunResult spec = KwatchProbe({"-x", TargetPath("probe_args"), "-F", "tick"});
  EXPECT_EQ(spec.exit_code, 0) << spec.err;  // "tick" is the GLOB here
  EXPECT_EQ(spec.out, "tick\n");
}

TEST(ProbeCmd, ListVarsLikePerfProbeV) {
  // Without -x the program comes from the command after --.
  const RunResult r = KwatchProbe({"-V", "local_item", "--", TargetPath("probe_args")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out,
            "Available variables at local_item\n"
            "\t@<local_item+0>\n"
            "\t\tlong\tid\n"
            "\t\tstruct item\tlocal\n");
  const RunResult ret = KwatchProbe({"-x", TargetPath("probe_args"), "-V", "fact%return"});
  EXPECT_EQ(ret.exit_code, 1);
  EXPECT_THAT(ret.err, HasSubstr("only $retval"));
}

TEST(ProbeCmd, UnknownFunctionSuggestsANearMatch) {
  const RunResult r = KwatchProbe({"tik i", "--", TargetPath("uprobe_loop"), "3"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("unknown function 'tik' in uprobe_loop; did you mean 'tick'?"));
  // Nothing was started.
  EXPECT_THAT(r.out, Not(HasSubstr("sum=")));
}

TEST(ProbeCmd, BadArgumentIsPointedAt) {
  const RunResult r = KwatchProbe({"tick i r->len:u7", "--", TargetPath("uprobe_loop"), "3"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("unknown type 'u7'"));
  EXPECT_THAT(r.err, HasSubstr("\n  tick i r->len:u7\n         ^~~~~~~~~\n"));
  const RunResult v = KwatchProbe({"tick i nosuch", "--", TargetPath("uprobe_loop"), "3"});
  EXPECT_EQ(v.exit_code, 1);
  EXPECT_THAT(v.err, HasSubstr("no variable 'nosuch' at tick (available: i, r)"));
  EXPECT_THAT(v.err, HasSubstr("\n  tick i nosuch\n         ^~~~~~\n"));
}

TEST(ProbeCmd, MidInstructionOffsetAndUnprobeableInstructionAreRefused) {
  const RunResult r = KwatchProbe({"tick+0x1", "--", TargetPath("uprobe_loop"), "3"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("tick+0x1 is inside '"));
  EXPECT_THAT(r.err, HasSubstr("probe an instruction boundary"));
  // probe_engine's has_int3 is a lone int3: the engine refuses to displace it and the
  // launched program is not left behind.
  const RunResult i = KwatchProbe({"has_int3", "--", TargetPath("probe_engine"), "basic"});
  EXPECT_EQ(i.exit_code, 1);
  EXPECT_THAT(i.err, HasSubstr("it is a breakpoint already"));
}

TEST(ProbeCmd, UsageErrors) {
  EXPECT_EQ(KwatchProbe({"tick"}).exit_code, 2);                           // no target
  EXPECT_EQ(KwatchProbe({"--", TargetPath("uprobe_loop")}).exit_code, 2);  // no spec
  EXPECT_EQ(KwatchProbe({"-p", "1", "tick", "--", TargetPath("uprobe_loop")}).exit_code, 2);
  EXPECT_EQ(KwatchProbe({"--backend", "kprobe", "tick", "--", TargetPath("uprobe_loop")}).exit_code,
            2);
}

TEST(ProbeCmd, GuardianRestoresTheCodeWhenKwatchIsKilled) {
  SubreaperScope reaper;
  const std::string go = TempPath("go-guardian");
  std::filesystem::remove(go);
  auto k = Spawned::Start({KwatchPath(), "probe", "--backend", "ptrace", "--json", "step i",
                           "step%return $retval", "--", TargetPath("probe_cli_pause"), "100", go});
  ASSERT_TRUE(k.ok());
  ASSERT_TRUE((*k)->WaitForStderr("armed").ok()) << (*k)->err();
  const pid_t target = ArmedPid((*k)->err());
  ASSERT_GT(target, 0);
  // Phase 1 ran probed: 100 calls, sum of 2i + 1 = 100^2. Wait for its hits to be printed
  // (kwatch flushes every 50 ms), so that kwatch is idle and the target waits for `go`.
  ASSERT_TRUE((*k)->WaitForStdout("phase1 sum=10000").ok()) << (*k)->out();
  ASSERT_TRUE((*k)->WaitForStdout("\"args\":{\"i\":99}").ok()) << (*k)->out();
  // ... and the last call's return (2 * 99 + 1), which may come in the next flush.
  ASSERT_TRUE((*k)->WaitForStdout("\"args\":{\"arg1\":199}").ok()) << (*k)->out();
  ASSERT_EQ(kill((*k)->pid(), SIGKILL), 0);
  // The guardian puts the INT3 back (no return address is patched between calls).
  ASSERT_TRUE((*k)->WaitForStderr("kwatch-guard: kwatch ended without cleaning up; restored 1 "
                                  "patched location in pid " +
                                  std::to_string(target))
                  .ok())
      << (*k)->err();
  // The guardian wakes when kwatch's files close, which the kernel does before kwatch's
  // exit hands its children (the target) to this subreaper: wait until kwatch is a zombie
  // (not reaped: Finish does that) before waiting for the target.
  siginfo_t kwatch_exit{};
  ASSERT_EQ(waitid(P_PID, static_cast<id_t>((*k)->pid()), &kwatch_exit, WEXITED | WNOWAIT), 0);
  EXPECT_EQ(kwatch_exit.si_code, CLD_KILLED);
  std::ofstream(go).put('1');
  // Phase 2 runs the unpatched code: 200 calls in all, sum 200^2, exit 0.
  int status = 0;
  ASSERT_EQ(waitpid(target, &status, 0), target);
  EXPECT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0);
  auto done = (*k)->Finish();
  ASSERT_TRUE(done.ok());
  EXPECT_EQ(done->exit_code, 128 + SIGKILL);
  EXPECT_THAT(done->out, HasSubstr("phase2 sum=40000\n"));
  const JsonRun run = ParseJson(done->out);
  EXPECT_EQ(OfEvent(run.hits, "step").size(), 100u);
  EXPECT_EQ(OfEvent(run.hits, "step__return").size(), 100u);
  // The guardian exits after restoring; reap it (it is this process's orphan now).
  while (waitpid(-1, nullptr, WNOHANG) > 0) {
  }
  std::filesystem::remove(go);
}

// The attached target (not launched by kwatch) waits for `go`; kwatch probes it, then stops
// on `signal` (0: stays until the target exits).
void AttachRun(int signal) {
  const std::string go = TempPath(absl::StrCat("go-attach-", signal));
  std::filesystem::remove(go);
  auto target = Spawned::Start({TargetPath("probe_cli_pause"), "500", go});
  ASSERT_TRUE(target.ok());
  ASSERT_TRUE((*target)->WaitForStdout("phase1 sum=250000").ok());
  auto k = Spawned::Start({KwatchPath(), "probe", "--json", "-p", std::to_string((*target)->pid()),
                           "step i", "step%return $retval"});
  ASSERT_TRUE(k.ok());
  ASSERT_TRUE((*k)->WaitForStderr("armed").ok()) << (*k)->err();
  if (signal != 0) {
    ASSERT_EQ(kill((*k)->pid(), signal), 0);
    auto r = (*k)->Finish();
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->exit_code, 0) << r->err;
    const JsonRun run = ParseJson(r->out);
    EXPECT_EQ(run.summary["stop_reason"], absl::StrCat("interrupted by ", sigabbrev_np(signal)));
    EXPECT_TRUE(run.hits.empty());
    EXPECT_THAT(r->err, HasSubstr("keeps running"));
  }
  std::ofstream(go).put('1');
  if (signal == 0) {
    auto r = (*k)->Finish();
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->exit_code, 0) << r->err;
    const JsonRun run = ParseJson(r->out);
    // Phase 2: step(i) for i = 500..999, returning 2i + 1.
    const std::vector<json> entries = OfEvent(run.hits, "step");
    const std::vector<json> returns = OfEvent(run.hits, "step__return");
    ASSERT_EQ(entries.size(), 500u);
    ASSERT_EQ(returns.size(), 500u);
    for (long i = 0; i < 500; ++i) {
      ASSERT_EQ(entries[i]["args"]["i"], 500 + i);
      ASSERT_EQ(returns[i]["args"]["arg1"], 2 * (500 + i) + 1);
    }
    EXPECT_EQ(run.summary["stop_reason"], "target exited");
  }
  auto t = (*target)->Finish();
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->exit_code, 0);
  EXPECT_THAT(t->out, HasSubstr("phase2 sum=1000000\n"));
  std::filesystem::remove(go);
}

TEST(ProbeCmd, AttachedProcessProbedExactly) {
  AttachRun(0);
}

class ProbeCmdStopSignal : public ::testing::TestWithParam<int> {};

TEST_P(ProbeCmdStopSignal, RestoresDetachesAndTheTargetCarriesOn) {
  AttachRun(GetParam());
}

INSTANTIATE_TEST_SUITE_P(Signals, ProbeCmdStopSignal, ::testing::Values(SIGINT, SIGTERM, SIGHUP),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return std::string(sigabbrev_np(i.param));
                         });

TEST(ProbeCmd, InterruptMidStreamRestoresEverythingAndTheTargetFinishes) {
  // Four threads hit an entry and a return probe continuously; SIGINT lands while hits are
  // in flight and return addresses are replaced on the threads' stacks.
  const long n = 200000;
  // The ptrace backend: hits are slow enough for SIGINT to land mid-stream (the agent's
  // variant below).
  auto k = Spawned::Start({KwatchPath(), "probe", "--backend", "ptrace", "--json", "tick i",
                           "tick%return $retval", "--", TargetPath("uprobe_loop"),
                           std::to_string(n), "--threads", "4"});
  ASSERT_TRUE(k.ok());
  ASSERT_TRUE((*k)->WaitForStdout("\"event\":\"tick__return\"").ok()) << (*k)->err();
  ASSERT_EQ(kill((*k)->pid(), SIGINT), 0);
  auto r = (*k)->Finish();
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->exit_code, 0) << r->err;
  const JsonRun run = ParseJson(r->out);
  EXPECT_EQ(run.summary["stop_reason"], "interrupted by INT");
  EXPECT_GT(run.summary["hits"].get<long>(), 0);
  EXPECT_LT(run.summary["hits"].get<long>(), 8 * n);
  // Every value seen is right: per thread, the k-th call is tick(k) and returns 3k + r->len,
  // r->len being 100 + the thread's index.
  std::map<int, std::vector<long>> entries;
  std::map<int, std::vector<long>> returns;
  for (const json& h : run.hits) {
    (h["is_return"] == true ? returns : entries)[h["tid"].get<int>()].push_back(
        h["args"][h["is_return"] == true ? "arg1" : "i"].get<long>());
  }
  for (const auto& [tid, is] : entries) {
    for (size_t k = 0; k < is.size(); ++k) {
      ASSERT_EQ(is[k], static_cast<long>(k)) << tid;
    }
  }
  for (const auto& [tid, rs] : returns) {
    ASSERT_FALSE(rs.empty());
    const long len = rs[0];
    EXPECT_GE(len, 100);
    EXPECT_LE(len, 103);
    for (size_t k = 0; k < rs.size(); ++k) {
      ASSERT_EQ(rs[k], 3 * static_cast<long>(k) + len) << tid;
    }
  }
  long sum = 0;
  for (long t = 0; t < 4; ++t) {
    sum += 3 * n * (n - 1) / 2 + (100 + t) * n;
  }
  // The detached target ran to its end with the right result.
  EXPECT_THAT(run.other, ::testing::ElementsAre(absl::StrCat("sum=", sum)));
  EXPECT_THAT(r->err, HasSubstr("keeps running"));
}

TEST(ProbeCmd, AgentInterruptMidStreamRestoresEverythingAndTheTargetFinishes) {
  // Four threads through a jump-probed entry and its return probe, flat out; SIGINT lands
  // while return addresses are replaced on the threads' stacks: kwatch seizes the target,
  // restores the code, detaches, and the calls in flight return through the agent's
  // trampoline to their callers.
  const long n = 50'000'000;
  auto k = Spawned::Start({KwatchPath(), "probe", "--backend", "agent", "--json", "-q", "tick i",
                           "tick%return $retval", "--", TargetPath("uprobe_loop"),
                           std::to_string(n), "--threads", "4"});
  ASSERT_TRUE(k.ok());
  ASSERT_TRUE((*k)->WaitForStderr("agent backend").ok()) << (*k)->err();
  ::usleep(300'000);
  ASSERT_EQ(kill((*k)->pid(), SIGINT), 0);
  auto r = (*k)->Finish(120);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->exit_code, 0) << r->err;
  const JsonRun run = ParseJson(r->out);
  EXPECT_EQ(run.summary["stop_reason"], "interrupted by INT");
  EXPECT_GT(run.summary["hits"].get<long>(), 0);
  for (const json& p : run.summary["probes"]) {
    EXPECT_EQ(p["path"], "jump") << p.dump();
  }
  long sum = 0;
  for (long t = 0; t < 4; ++t) {
    sum += 3 * n * (n - 1) / 2 + (100 + t) * n;
  }
  EXPECT_THAT(run.other, ::testing::ElementsAre(absl::StrCat("sum=", sum)));
  EXPECT_THAT(r->err, HasSubstr("keeps running"));
}

// The agent counts every hit itself (KwProbe::hits): -q's counts and the summary's hits are
// exact even when records are lost. probe_cli_pause N GO: phase 2's N calls of step run while
// kwatch is stopped (SIGSTOP) and cannot drain: the thread's 1 MiB ring keeps about 18,700
// records, the others are lost and counted as such.
TEST(ProbeCmd, AgentCountsEveryHitWhenRecordsAreLost) {
  const long n = 200'000;
  for (const bool jump : {true, false}) {
    SCOPED_TRACE(jump ? "jump" : "int3");
    const std::string go = TempPath(jump ? "go-lost-jump" : "go-lost-int3");
    std::filesystem::remove(go);
    std::vector<std::string> args = {KwatchPath(), "probe", "--backend", "agent", "--json", "-q"};
    if (!jump) {
      args.emplace_back("--no-jump");
    }
    args.insert(args.end(), {"step i", "--", TargetPath("probe_cli_pause"), std::to_string(n), go});
    auto k = Spawned::Start(args);
    ASSERT_TRUE(k.ok());
    ASSERT_TRUE((*k)->WaitForStdout("phase1 sum=", 120).ok()) << (*k)->err();
    ASSERT_EQ(kill((*k)->pid(), SIGSTOP), 0);
    std::ofstream(go).put('1');
    const absl::Status phase2 = (*k)->WaitForStdout("phase2 sum=", 120);
    ASSERT_EQ(kill((*k)->pid(), SIGCONT), 0);
    ASSERT_TRUE(phase2.ok()) << (*k)->err();
    auto r = (*k)->Finish(120);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->exit_code, 0) << r->err;
    const JsonRun run = ParseJson(r->out);
    EXPECT_TRUE(run.hits.empty());
    EXPECT_THAT(run.other, ::testing::ElementsAre(absl::StrCat("phase1 sum=", n * n),
                                                  absl::StrCat("phase2 sum=", 4 * n * n)));
    EXPECT_EQ(run.summary["hits"], 2 * n) << run.summary.dump();
    ASSERT_EQ(run.summary["probes"].size(), 1u);
    const json& p = run.summary["probes"][0];
    EXPECT_EQ(p["hits"], 2 * n) << p.dump();
    EXPECT_EQ(p["path"], jump ? "jump" : "int3") << p.dump();
    EXPECT_EQ(p["misses"], 0) << p.dump();
    // At least phase 2 less one ring's worth (1 MiB: about 18,700 of these records) was lost
    // while kwatch was stopped.
    EXPECT_GT(p["lost"].get<long>(), n - 20'000) << p.dump();
    EXPECT_LT(p["lost"].get<long>(), 2 * n) << p.dump();
    std::filesystem::remove(go);
  }
}

// Four threads hitting a jump probe flat out with -q: every call counted.
TEST(ProbeCmd, AgentQuietCountsFourThreadsFlatOutExactly) {
  const long n = 1'000'000;
  const RunResult r = KwatchProbe({"--json", "-q", "--backend", "agent", "tick i", "--",
                                   TargetPath("uprobe_loop"), std::to_string(n), "--threads", "4"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const JsonRun run = ParseJson(r.out);
  EXPECT_EQ(run.summary["hits"], 4 * n) << run.summary.dump();
  EXPECT_EQ(run.summary["probes"][0]["hits"], 4 * n);
  EXPECT_EQ(run.summary["probes"][0]["path"], "jump");
  long sum = 0;
  for (long t = 0; t < 4; ++t) {
    sum += 3 * n * (n - 1) / 2 + (100 + t) * n;
  }
  EXPECT_THAT(run.other, ::testing::ElementsAre(absl::StrCat("sum=", sum)));
}

TEST(ProbeCmd, DurationStopsAndLeavesTheLaunchedTargetRunning) {
  const std::string go = TempPath("go-duration");
  std::filesystem::remove(go);
  auto k = Spawned::Start({KwatchPath(), "probe", "--json", "-d", "0.5", "step i", "--",
                           TargetPath("probe_cli_pause"), "10", go});
  ASSERT_TRUE(k.ok());
  ASSERT_TRUE((*k)->WaitForStderr("keeps running").ok()) << (*k)->err();
  std::ofstream(go).put('1');
  auto r = (*k)->Finish();
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->exit_code, 0) << r->err;
  const JsonRun run = ParseJson(r->out);
  EXPECT_EQ(run.hits.size(), 10u);
  EXPECT_EQ(run.summary["stop_reason"], "--duration 0.5s elapsed");
  EXPECT_THAT(r->out, HasSubstr("phase2 sum=400\n"));
  std::filesystem::remove(go);
}

// A directory of its own holding a copy of `names` (kwatch, fixtures), readable by anyone:
// a uprobe on the copy sees no other test's runs, and an unprivileged user can run it.

TEST(ProbeCmd, UprobeWithoutATargetProbesEveryProcessRunningTheFile) {
  PrivateCopies copies({{TargetPath("uprobe_loop"), "uprobe_loop"}});
  auto k = Spawned::Start({KwatchPath(), "probe", "--json", "--backend", "uprobe", "-x",
                           copies["uprobe_loop"], "-c", "300", "tick i"});
  ASSERT_TRUE(k.ok());
  ASSERT_TRUE((*k)->WaitForStderr("armed 1 probe on every process running it").ok()) << (*k)->err();
  // Three processes started after the probe, 100 calls each.
  for (int run = 0; run < 3; ++run) {
    auto r = kwatch::testing::Run({copies["uprobe_loop"], "100"});
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->exit_code, 0);
    EXPECT_EQ(r->out, absl::StrCat("sum=", LoopSum(100), "\n"));
  }
  auto r = (*k)->Finish();
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->exit_code, 0) << r->err;
  const JsonRun run = ParseJson(r->out);
  EXPECT_EQ(run.summary["stop_reason"], "--count 300 reached");
  EXPECT_EQ(run.summary["pid"], 0);
  std::map<int, std::vector<long>> by_pid;
  for (const json& h : run.hits) {
    by_pid[h["pid"].get<int>()].push_back(h["args"]["i"].get<long>());
  }
  ASSERT_EQ(by_pid.size(), 3u);
  for (const auto& [pid, is] : by_pid) {
    ASSERT_EQ(is.size(), 100u) << pid;
    for (long i = 0; i < 100; ++i) {
      ASSERT_EQ(is[i], i) << pid;
    }
  }
}

// Runs `argv` as user nobody (uid/gid 65534); returns the exit status and stderr.
RunResult RunAsNobody(const std::vector<std::string>& argv) {
  int errp[2];
  int outp[2];
  EXPECT_EQ(pipe(errp), 0);
  EXPECT_EQ(pipe(outp), 0);
  std::vector<char*> args;
  for (const std::string& a : argv) {
    args.push_back(const_cast<char*>(a.c_str()));  // NOLINT
  }
  args.push_back(nullptr);
  const pid_t child = fork();
  if (child == 0) {
    dup2(outp[1], 1);
    dup2(errp[1], 2);
    if (setgroups(0, nullptr) != 0 || setgid(65534) != 0 || setuid(65534) != 0) {
      _exit(99);
    }
    execv(args[0], args.data());
    _exit(98);
  }
  close(errp[1]);
  close(outp[1]);
  RunResult r;
  char buf[4096];
  for (ssize_t n; (n = read(errp[0], buf, sizeof(buf))) > 0;) {
    r.err.append(buf, static_cast<size_t>(n));
  }
  for (ssize_t n; (n = read(outp[0], buf, sizeof(buf))) > 0;) {
    r.out.append(buf, static_cast<size_t>(n));
  }
  close(errp[0]);
  close(outp[0]);
  int status = 0;
  waitpid(child, &status, 0);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  EXPECT_NE(r.exit_code, 99) << "cannot switch to uid 65534 (are tests running as root?)";
  return r;
}

TEST(ProbeCmd, PermissionErrorsNameWhatIsMissing) {
  PrivateCopies copies({{KwatchPath(), "kwatch"},
                        {TargetPath("uprobe_loop"), "uprobe_loop"},
                        {TargetPath("probe_cli_pause"), "probe_cli_pause"}});
  // Its own child: ptrace needs no privilege.
  const RunResult own = RunAsNobody(
      {copies["kwatch"], "probe", "--json", "tick i", "--", copies["uprobe_loop"], "3"});
  EXPECT_EQ(own.exit_code, 0) << own.err;
  EXPECT_EQ(ParseJson(own.out).hits.size(), 3u);
  // Another user's process.
  const std::string go = TempPath("go-nobody");
  std::filesystem::remove(go);
  auto target = Spawned::Start({copies["probe_cli_pause"], "1", go});
  ASSERT_TRUE(target.ok());
  ASSERT_TRUE((*target)->WaitForStdout("phase1").ok());
  const std::string pid = std::to_string((*target)->pid());
  const RunResult attach = RunAsNobody({copies["kwatch"], "probe", "-p", pid, "step"});
  EXPECT_EQ(attach.exit_code, 1);
  EXPECT_THAT(attach.err, HasSubstr("needs root or CAP_SYS_PTRACE")) << attach.err;
  const RunResult attach_x =
      RunAsNobody({copies["kwatch"], "probe", "-x", copies["probe_cli_pause"], "-p", pid, "step"});
  EXPECT_EQ(attach_x.exit_code, 1);
  EXPECT_THAT(attach_x.err, HasSubstr("needs root or CAP_SYS_PTRACE")) << attach_x.err;
  std::ofstream(go).put('1');
  auto t = (*target)->Finish();
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->exit_code, 0);
  std::filesystem::remove(go);
  // The uprobe PMU needs root.
  const RunResult up = RunAsNobody(
      {copies["kwatch"], "probe", "--backend", "uprobe", "tick", "--", copies["uprobe_loop"], "3"});
  EXPECT_EQ(up.exit_code, 1);
  EXPECT_THAT(up.err, HasSubstr("uprobe PMU needs root (CAP_SYS_ADMIN")) << up.err;
  EXPECT_THAT(up.out, Not(HasSubstr("sum=")));  // the launched program did not run
}

TEST(ProbeCmd, RecordingThenReportShowsTheHits) {
  const std::string db = TempPath("probes.kwdb");
  std::filesystem::remove(db);
  const RunResult r = KwatchProbe(
      {"-q", "-o", db, "tick i", "tick%return $retval", "--", TargetPath("uprobe_loop"), "1000"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("recorded 2000 probe hits to " + db));
  auto rep = kwatch::testing::Run({KwatchPath(), "report", db});
  ASSERT_TRUE(rep.ok());
  ASSERT_EQ(rep->exit_code, 0) << rep->err;
  EXPECT_THAT(rep->out, HasSubstr("2000 probe hits"));
  EXPECT_TRUE(std::regex_search(
      rep->out, std::regex(R"(\ntick +tick +.*uprobe_loop\.c:[0-9]+ +1000 hits in 1 thread\n)")))
      << rep->out;
  EXPECT_TRUE(std::regex_search(
      rep->out,
      std::regex(
          R"(\ntick__return +tick%return +.*uprobe_loop\.c:[0-9]+ +1000 hits in 1 thread\n)")))
      << rep->out;
  // The uprobe backend records the same.
  const RunResult u = KwatchProbe(
      {"-q", "--backend", "uprobe", "-o", db, "tick i", "--", TargetPath("uprobe_loop"), "500"});
  ASSERT_EQ(u.exit_code, 0) << u.err;
  auto rep2 = kwatch::testing::Run({KwatchPath(), "report", "--format", "json", db});
  ASSERT_TRUE(rep2.ok());
  ASSERT_EQ(rep2->exit_code, 0) << rep2->err;
  const json j = json::parse(rep2->out);
  ASSERT_EQ(j["probes"].size(), 1u);
  EXPECT_EQ(j["probes"][0]["hits"], 500);
  EXPECT_EQ(j["probes"][0]["spec"], "tick i");
  std::filesystem::remove(db);
}

}  // namespace
}  // namespace kwatch
