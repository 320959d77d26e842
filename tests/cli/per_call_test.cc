// End-to-end tests of watches armed per call (`kwatch --write 'r->len' --in compute`, and
// gdb's scope syntax `run::sum`) on tests/targets/per_call.c, whose functions write through
// their argument and their local a known number of times per call: counts per call and in
// total are compared exactly with what the target did.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "tests/cli/cli_test_util.h"
#include "tests/test_util.h"

namespace kwatch {
namespace {

using ::kwatch::clitest::JsonRun;
using ::kwatch::clitest::ParseJsonLines;
using ::kwatch::clitest::RunKwatch;
using ::kwatch::testing::KwatchPath;
using ::kwatch::testing::RunResult;
using ::kwatch::testing::TargetPath;
using ::testing::HasSubstr;
using ::testing::Not;

// Events per (tid, call), and the address each call's events touched.
struct PerCall {
  std::map<std::pair<int, int>, int> events;
  std::map<std::pair<int, int>, std::set<std::string>> addrs;
};

PerCall GroupByCall(const JsonRun& run) {
  PerCall out;
  for (const auto& e : run.events) {
    const std::pair<int, int> key{e["tid"].get<int>(), e["call"].get<int>()};
    ++out.events[key];
    out.addrs[key].insert(e["addr"].get<std::string>());
  }
  return out;
}

// The summary's per-call counts of its only per-call watch.
const nlohmann::json& CallStats(const JsonRun& run) {
  static const nlohmann::json kNone;
  if (!run.summary.contains("calls") || run.summary["calls"].size() != 1) {
    ADD_FAILURE() << "no per-call counts in " << run.summary.dump();
    return kNone;
  }
  return run.summary["calls"][0];
}

// 4 threads x 50 calls of compute(r, 3), r alternately on the thread's stack and on its heap:
// every call's 3 writes of r->len, and nothing else (r->flags is not watched; run and recurse
// write other objects).
// `by`: --calls-by (the agent arms each call in the target, or kwatch through ptrace).
void CountsFourThreads(const std::string& by) {
  const RunResult r = RunKwatch({"--json", "--calls-by", by, "--write", "r->len", "--in", "compute",
                                 "--", TargetPath("per_call"), "4", "50", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr(by == "agent" ? "watches per call run in the target"
                                             : "watches per call run through ptrace"));
  EXPECT_THAT(r.err, HasSubstr("compute_writes=600 "));
  const JsonRun run = ParseJsonLines(r.out);
  EXPECT_EQ(run.events.size(), 600u);
  EXPECT_EQ(run.summary["events"], 600);
  const PerCall pc = GroupByCall(run);
  EXPECT_EQ(pc.events.size(), 200u);  // 200 calls, each its own
  std::set<int> calls;
  std::set<int> tids;
  for (const auto& [key, n] : pc.events) {
    EXPECT_EQ(n, 3) << "tid " << key.first << " call " << key.second;
    EXPECT_EQ(pc.addrs.at(key).size(), 1u);  // one object per call
    calls.insert(key.second);
    tids.insert(key.first);
  }
  EXPECT_EQ(calls.size(), 200u);  // numbered across threads
  EXPECT_EQ(*calls.begin(), 1);
  EXPECT_EQ(*calls.rbegin(), 200);
  EXPECT_EQ(tids.size(), 4u);
  for (const auto& e : run.events) {
    EXPECT_EQ(e["field"], "r->len");
    EXPECT_EQ(e["access"], "w");
    EXPECT_EQ(e["function"], "compute");
  }
  // One call_end per call, with the call's own count and object.
  ASSERT_EQ(run.call_ends.size(), 200u);
  std::set<std::string> objects;
  for (const auto& c : run.call_ends) {
    EXPECT_EQ(c["function"], "compute");
    EXPECT_EQ(c["armed"], true);
    EXPECT_EQ(c["returned"], true);
    EXPECT_EQ(c["events"], 3);
    const std::pair<int, int> key{c["tid"].get<int>(), c["call"].get<int>()};
    ASSERT_TRUE(pc.addrs.contains(key)) << c.dump();
    EXPECT_EQ(*pc.addrs.at(key).begin(), c["addr"]);
    objects.insert(c["addr"].get<std::string>());
  }
  // Per thread its stack object and its heap object, as the events placed them (a thread's
  // heap object may reuse the address of one freed by a thread that ended before it started).
  std::set<std::string> printed;
  for (const auto& [key, addrs] : pc.addrs) {
    printed.insert(addrs.begin(), addrs.end());
  }
  EXPECT_EQ(objects, printed);
  EXPECT_GE(objects.size(), 5u);
  const nlohmann::json& st = CallStats(run);
  EXPECT_EQ(st["calls"], 200);
  EXPECT_EQ(st["watched"], 200);
  EXPECT_EQ(st["not_watched"], 0);
  EXPECT_EQ(st["events_min"], 3);
  EXPECT_EQ(st["events_max"], 3);
  EXPECT_EQ(st["events_total"], 600);
  EXPECT_EQ(st["running"], 0);
  // The profile counts every call's accesses at their offset in the object.
  ASSERT_EQ(run.summary["watches"].size(), 1u);
  EXPECT_EQ(run.summary["watches"][0]["fields"][0]["field"], "r->len");
  EXPECT_EQ(run.summary["watches"][0]["fields"][0]["writes"], 600);
}

TEST(KwatchPerCall, CountsEveryCallOfFourThreadsExactlyInTheTarget) {
  CountsFourThreads("agent");
}

TEST(KwatchPerCall, CountsEveryCallOfFourThreadsExactlyThroughPtrace) {
  CountsFourThreads("ptrace");
}

// Recursion: each of the 3 nested calls watches its own object (the caller's stays armed
// while the callee runs), 2 writes each, before and after the inner call.
// 10 waves of 8 threads, 150 ms apart: 80 threads come and go, more than the agent's 64 thread
// slots. Every call of each is watched, and the breakpoints of the threads that are gone are
// closed in the target as it runs (the process holds at most the last wave's at its end).
TEST(KwatchPerCall, ThreadsThatComeAndGoAreWatchedAndTheirBreakpointsClosed) {
  const RunResult r =
      RunKwatch({"--json", "--calls-by", "agent", "--write", "r->len", "--in", "compute", "--",
                 TargetPath("per_call"), "8", "20", "0", "--waves", "10"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("compute_writes=4800 "));
  const JsonRun run = ParseJsonLines(r.out);
  EXPECT_EQ(run.events.size(), 4800u);
  EXPECT_EQ(run.summary["lost"], 0);
  const nlohmann::json& st = CallStats(run);
  EXPECT_EQ(st["calls"], 1600);
  EXPECT_EQ(st["watched"], 1600);
  EXPECT_EQ(st["events_min"], 3);
  EXPECT_EQ(st["events_max"], 3);
  const size_t at = r.err.find("perf_fds=");
  ASSERT_NE(at, std::string::npos) << r.err;
  EXPECT_LE(std::stoi(r.err.substr(at + 9)), 8) << "breakpoints of threads that are gone";
}

// A call that runs for seconds (compute sleeps 4 s after its first write): its first access is
// printed while it runs, read live from its thread's breakpoint, and is not printed again when
// the call's samples come back at its end.
TEST(KwatchPerCall, AccessesOfALongCallArePrintedWhileItRuns) {
  auto k = kwatch::testing::Spawned::Start(
      {KwatchPath(), "--json", "--calls-by", "agent", "--write", "r->len", "--in", "compute", "--",
       TargetPath("per_call"), "1", "1", "0", "--usec", "4000000"});
  ASSERT_TRUE(k.ok());
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE((*k)->WaitForStdout("\"type\":\"event\"", 10).ok()) << (*k)->err();
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(waited, 3.0) << "the first access came only when the call ended";
  EXPECT_THAT((*k)->out(), Not(HasSubstr("call_end")));
  auto r = (*k)->Finish();
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->exit_code, 0) << r->err;
  const JsonRun run = ParseJsonLines(r->out);
  EXPECT_EQ(run.events.size(), 3u);  // each access once
  ASSERT_EQ(run.call_ends.size(), 1u);
  EXPECT_EQ(run.call_ends[0]["events"], 3);
}

// --calls-by agent where the agent cannot take the calls (stop mode's exact old values need the
// thread stopped at each access): an error that says why, and the target is not left running.
TEST(KwatchPerCall, CallsByAgentSaysWhyItCannot) {
  const RunResult r = RunKwatch({"--stop", "--calls-by", "agent", "--write", "r->len", "--in",
                                 "compute", "--", TargetPath("per_call"), "1", "2", "0"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("--calls-by agent: "));
  EXPECT_THAT(r.err, HasSubstr("exact values (stop mode) need the thread stopped"));
  EXPECT_THAT(r.err, Not(HasSubstr("compute_writes=")));  // the target never ran its work
}

TEST(KwatchPerCall, EachRecursiveCallWatchesItsOwnObject) {
  const RunResult r = RunKwatch({"--json", "--write", "r->len", "--in", "recurse", "--",
                                 TargetPath("per_call"), "1", "0", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const JsonRun run = ParseJsonLines(r.out);
  const PerCall pc = GroupByCall(run);
  ASSERT_EQ(pc.events.size(), 3u) << r.out;
  std::set<std::string> objects;
  for (const auto& [key, n] : pc.events) {
    EXPECT_EQ(n, 2) << "call " << key.second;
    objects.insert(*pc.addrs.at(key).begin());
  }
  EXPECT_EQ(objects.size(), 3u);
  // The innermost call returns first: its out-of-scope line comes first.
  ASSERT_EQ(run.call_ends.size(), 3u);
  EXPECT_EQ(run.call_ends[0]["call"], 3);
  EXPECT_EQ(run.call_ends[2]["call"], 1);
  EXPECT_EQ(CallStats(run)["events_total"], 6);
}

// --until: each call's watch ends at the line after the inner call (its second write is not
// seen); the innermost call never gets there and keeps its watch to its return (2 writes).
TEST(KwatchPerCall, UntilEndsEachCallsWatchAtAPoint) {
  const int line = clitest::TargetSourceLine("per_call.c", "g_sink = inner.len;");
  ASSERT_GT(line, 0);
  const RunResult r =
      RunKwatch({"--json", "--write", "r->len", "--in", "recurse", "--until",
                 absl::StrCat("per_call.c:", line), "--", TargetPath("per_call"), "1", "0", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const JsonRun run = ParseJsonLines(r.out);
  const PerCall pc = GroupByCall(run);
  ASSERT_EQ(pc.events.size(), 3u) << r.out;
  for (const auto& [key, n] : pc.events) {
    EXPECT_EQ(n, key.second == 3 ? 2 : 1) << "call " << key.second;
  }
  ASSERT_EQ(run.call_ends.size(), 3u);
  for (const auto& c : run.call_ends) {
    EXPECT_EQ(c["returned"], true);
    if (c["call"] == 3) {
      EXPECT_EQ(c["why"], "");
    } else {
      EXPECT_THAT(c["why"].get<std::string>(), HasSubstr("reached --until recurse+"));
    }
  }
  EXPECT_EQ(CallStats(run)["abandoned"], 0);
}

// 6 nested calls in each of 2 threads, 4 debug registers per thread: the 4 outer calls of
// each thread are watched, the 2 innermost are not (said, by reason); the watched ones are
// exact.
TEST(KwatchPerCall, CallsBeyondTheThreadsRegistersAreCountedNotWatched) {
  const RunResult r = RunKwatch({"--json", "-q", "--write", "r->len", "--in", "recurse", "--",
                                 TargetPath("per_call"), "2", "0", "5"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const JsonRun run = ParseJsonLines(r.out);
  const nlohmann::json& st = CallStats(run);
  EXPECT_EQ(st["calls"], 12);
  EXPECT_EQ(st["watched"], 8);
  EXPECT_EQ(st["not_watched"], 4);
  ASSERT_EQ(st["why_not"].size(), 1u) << st.dump();
  EXPECT_EQ(st["why_not"][0]["why"], "no debug register of the calling thread was free");
  EXPECT_EQ(st["why_not"][0]["calls"], 4);
  EXPECT_EQ(st["events_min"], 2);
  EXPECT_EQ(st["events_max"], 2);
  EXPECT_EQ(run.summary["events"], 16);
}

// A local while its frame lives, written `run::sum` as gdb scopes it: 6 writes per call
// (sum = 0, then 5 additions), 2 threads x 30 calls.
TEST(KwatchPerCall, WatchesALocalInScopeWithGdbsScopeSyntax) {
  const RunResult r =
      RunKwatch({"--json", "--write", "run::sum", "--", TargetPath("per_call"), "2", "30", "0"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("run_writes=360 "));
  const JsonRun run = ParseJsonLines(r.out);
  EXPECT_EQ(run.events.size(), 360u);
  const PerCall pc = GroupByCall(run);
  EXPECT_EQ(pc.events.size(), 60u);
  for (const auto& [key, n] : pc.events) {
    EXPECT_EQ(n, 6);
  }
  for (const auto& e : run.events) {
    EXPECT_EQ(e["field"], "sum");
    EXPECT_EQ(e["function"], "run");
  }
  EXPECT_EQ(CallStats(run)["function"], "run");
  EXPECT_EQ(CallStats(run)["events_total"], 360);
}

// Stop mode: each write's exact old and new value, per call. A stack object starts at 0 in
// each call (0 -> 1 -> 2 -> 3); the heap object keeps counting across calls.
TEST(KwatchPerCall, StopModeGivesEachCallsOldAndNewValues) {
  const RunResult r = RunKwatch({"--json", "--stop", "--write", "r->len", "--in", "compute", "--",
                                 TargetPath("per_call"), "1", "6", "0"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const JsonRun run = ParseJsonLines(r.out);
  ASSERT_EQ(run.events.size(), 18u) << r.out;
  std::map<int, std::vector<std::pair<int, int>>> by_call;  // call -> (old, new)
  for (const auto& e : run.events) {
    by_call[e["call"].get<int>()].emplace_back(e["old_value"].get<int>(), e["value"].get<int>());
  }
  ASSERT_EQ(by_call.size(), 6u);
  for (const auto& [call, values] : by_call) {
    ASSERT_EQ(values.size(), 3u);
    // Calls 1, 3, 5 get the stack object (fresh), 2, 4, 6 the heap one (3 more each time).
    const int start = call % 2 == 1 ? 0 : 3 * (call / 2 - 1);
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(values[i].first, start + i) << "call " << call;
      EXPECT_EQ(values[i].second, start + i + 1) << "call " << call;
    }
  }
}

// Attached (-p): the calls made after kwatch armed are watched, exactly.
TEST(KwatchPerCall, WatchesTheCallsOfAnAttachedProcess) {
  auto target = kwatch::testing::Spawned::Start({TargetPath("per_call"), "2", "40", "0", "--wait"});
  ASSERT_TRUE(target.ok()) << target.status();
  ASSERT_TRUE((*target)->WaitForStdout("ready").ok()) << (*target)->out();
  auto k =
      kwatch::testing::Spawned::Start({KwatchPath(), "--json", "-q", "--write", "r->len", "--in",
                                       "compute", "-p", absl::StrCat((*target)->pid())});
  ASSERT_TRUE(k.ok()) << k.status();
  ASSERT_TRUE((*k)->WaitForStderr("armed").ok()) << (*k)->err();
  ASSERT_EQ(kill((*target)->pid(), SIGUSR1), 0);
  auto tr = (*target)->Finish();
  ASSERT_TRUE(tr.ok()) << tr.status();
  EXPECT_EQ(tr->exit_code, 0) << tr->err;
  auto kr = (*k)->Finish();
  ASSERT_TRUE(kr.ok()) << kr.status();
  ASSERT_EQ(kr->exit_code, 0) << kr->err;
  const JsonRun run = ParseJsonLines(kr->out);
  EXPECT_EQ(run.summary["events"], 240);
  EXPECT_EQ(CallStats(run)["calls"], 80);
  EXPECT_EQ(CallStats(run)["events_min"], 3);
  EXPECT_EQ(CallStats(run)["events_max"], 3);
}

// -o: the recording counts each call's accesses at their offset in the object.
TEST(KwatchPerCall, RecordsEveryCallsAccessesAtTheirOffsets) {
  const std::string file = absl::StrCat(::testing::TempDir(), "/per_call-", getpid(), ".kw");
  unlink(file.c_str());
  const RunResult r = RunKwatch({"-q", "--write", "r->len", "--in", "compute", "-o", file, "--",
                                 TargetPath("per_call"), "2", "25", "0"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const RunResult rep = RunKwatch({"report", "--format", "json", file});
  ASSERT_EQ(rep.exit_code, 0) << rep.err;
  const nlohmann::json j = nlohmann::json::parse(rep.out);
  ASSERT_EQ(j["watches"].size(), 1u) << rep.out;
  const nlohmann::json& fields = j["watches"][0]["fields"];
  ASSERT_GE(fields.size(), 1u);
  EXPECT_EQ(fields[0]["path"], "r->len");
  EXPECT_EQ(fields[0]["writes"], 150);
  unlink(file.c_str());
}

// kwatch SIGKILLed in the middle of a watched call (the first, seen in the stream, sleeps
// 200 ms after its first write): the INT3s and the call's return address, which kwatch had
// replaced, are put back by its guardian, and the target finishes its calls and exits 0. (As
// with every ptrace path, a trap kwatch had not collected when it died would still reach the
// target, kwatch_killed_test.cc: here the only thread is asleep in the call when it dies.)
TEST(KwatchPerCall, KwatchKilledMidCallsLeavesTheTargetRunning) {
  auto target = kwatch::testing::Spawned::Start(
      {TargetPath("per_call"), "1", "4", "0", "--wait", "--usec", "200000"});
  ASSERT_TRUE(target.ok()) << target.status();
  ASSERT_TRUE((*target)->WaitForStdout("ready").ok()) << (*target)->out();
  auto k = kwatch::testing::Spawned::Start(
      {KwatchPath(), "--write", "r->len", "--in", "compute", "-p", absl::StrCat((*target)->pid())});
  ASSERT_TRUE(k.ok()) << k.status();
  ASSERT_TRUE((*k)->WaitForStderr("armed").ok()) << (*k)->err();
  ASSERT_EQ(kill((*target)->pid(), SIGUSR1), 0);
  ASSERT_TRUE((*k)->WaitForStdout("r->len (call 1)").ok()) << (*k)->out();
  ASSERT_EQ(kill((*k)->pid(), SIGKILL), 0);
  auto kr = (*k)->Finish();
  ASSERT_TRUE(kr.ok()) << kr.status();
  EXPECT_EQ(kr->exit_code, 128 + SIGKILL);
  auto tr = (*target)->Finish(120);
  ASSERT_TRUE(tr.ok()) << tr.status();
  EXPECT_EQ(tr->exit_code, 0) << tr->err;
  EXPECT_THAT(tr->err, HasSubstr("compute_writes=12 "));
}

// Mistakes, each with what to do.
TEST(KwatchPerCall, BadInputGetsClearErrors) {
  const std::string prog = TargetPath("per_call");
  struct Case {
    std::vector<std::string> args;
    std::string says;
  };
  const std::vector<Case> cases = {
      {{"--write", "run::summ", "--", prog, "1", "1", "0"},
       "no variable 'summ' at run; did you mean 'sum'?"},
      {{"--write", "r->lenn", "--in", "compute", "--", prog, "1", "1", "0"},
       "no member 'lenn'; did you mean 'len'?"},
      {{"--write", "r->len", "--in", "computee", "--", prog, "1", "1", "0"},
       "did you mean 'compute'?"},
      {{"--write", "r->len", "--in", "compute", "--at", "recurse", "--", prog, "1", "1", "0"},
       "--at 'recurse' is not inside compute"},
      {{"--write", "r->len", "--at", "compute+4", "--", prog, "1", "1", "0"},
       "--at SPEC goes with --in FUNC"},
      {{"--write", "r->len", "--in", "compute", "--until", "run", "--", prog, "1", "1", "0"},
       "--until 'run' is not inside compute"},
      {{"--write", "r->len", "--in", "compute", "--backend", "page", "--", prog, "1", "1", "0"},
       "--in: a watch per call takes the debug registers"},
      {{"--write", "r->len", "--in", "compute", "-f", "--", prog, "1", "1", "0"}, "--in: with -f"},
      {{"--write", "jiffies", "--in", "compute"}, "--in: kernel watches have no calls"},
      {{"--exec", "compute", "--in", "run", "--", prog, "1", "1", "0"},
       "--in: --exec watches code"},
  };
  for (const Case& c : cases) {
    const RunResult r = RunKwatch(c.args);
    EXPECT_NE(r.exit_code, 0) << c.says;
    EXPECT_THAT(r.err, HasSubstr(c.says));
    EXPECT_THAT(r.err, ::testing::Not(HasSubstr("compute_writes")));  // never ran its work
  }
}

}  // namespace
}  // namespace kwatch
