// Target lifecycle under kwatch: thousands of short-lived threads created and joined while
// a watch or a probe is active (tests/targets/thread_churn.c) keep every count exact; forked
// children carry none of kwatch's watches unless followed (-f), and followed ones are counted
// exactly per process, re-armed after exec and restored when kwatch stops
// (tests/targets/fork_watch.c).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "tests/cli/cli_test_util.h"
#include "tests/test_util.h"
#include "tests/watch/debug_traps.h"

namespace kwatch {
namespace {

using ::kwatch::testing::KwatchPath;
using ::kwatch::testing::RunResult;
using ::kwatch::testing::TargetPath;
using json = nlohmann::json;

struct Output {
  std::vector<json> lines;  // kwatch's JSON lines except the summary
  json summary;
};

Output Split(const std::string& out) {
  Output o;
  for (absl::string_view line : absl::StrSplit(out, '\n', absl::SkipEmpty())) {
    if (!absl::StartsWith(line, "{")) {
      continue;  // the target's own output, on the same stdout
    }
    json j = json::parse(std::string(line));
    if (j.value("type", "") == "summary") {
      o.summary = std::move(j);
    } else {
      o.lines.push_back(std::move(j));
    }
  }
  return o;
}

constexpr int kThreads = 1000;
constexpr int kWrites = 3;
constexpr char kTruth[] = "threads=1000 writes=3000 ticks=1000\n";

// thread_churn's arguments, its ground truth going to a file of this test's.
std::vector<std::string> Churn(const std::string& truth) {
  return {TargetPath("thread_churn"), std::to_string(kThreads), std::to_string(kWrites), "8",
          truth};
}

std::string TruthFile(const std::string& name) {
  return ::testing::TempDir() + "thread_churn_" + name + "_" + std::to_string(::getpid());
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class ChurnLifecycle : public ::testing::TestWithParam<std::string> {};

TEST_P(ChurnLifecycle, ThreadChurnUnderAWatchCountsEveryWriteOfEveryThread) {
  const std::string backend = GetParam();
  const std::string truth = TruthFile("watch_" + backend);
  std::vector<std::string> argv = {KwatchPath(), "--json",         "--backend", backend,
                                   "--write",    "g_churn.writes", "--"};
  for (std::string& a : Churn(truth)) {
    argv.push_back(std::move(a));
  }
  auto r = kwatch::testing::Run(argv);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->exit_code, 0) << r->err;
  EXPECT_EQ(Slurp(truth), kTruth);
  const Output o = Split(r->out);
  ASSERT_FALSE(o.summary.is_null()) << r->err;
  if (backend != "page") {
    KW_REQUIRE_DEBUG_TRAPS();
  }
  EXPECT_EQ(o.summary["events"], kThreads * kWrites);
  EXPECT_EQ(o.summary["lost"], 0);
  std::set<int> tids;
  int writes = 0;
  for (const json& ev : o.lines) {
    if (ev.value("type", "") == "event") {
      tids.insert(ev["tid"].get<int>());
      writes += ev["access"] == "w" ? 1 : 0;
    }
  }
  EXPECT_EQ(writes, kThreads * kWrites);
  EXPECT_EQ(tids.size(), static_cast<size_t>(kThreads));  // each worker seen, none lost
}

INSTANTIATE_TEST_SUITE_P(Backends, ChurnLifecycle, ::testing::Values("perf", "stop", "page"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

TEST(Lifecycle, ThreadChurnUnderAProbeHitsOncePerThread) {
  const std::string truth = TruthFile("probe");
  std::vector<std::string> argv = {KwatchPath(), "probe", "--json", "tick id", "--"};
  for (std::string& a : Churn(truth)) {
    argv.push_back(std::move(a));
  }
  auto r = kwatch::testing::Run(argv);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->exit_code, 0) << r->err;
  EXPECT_EQ(Slurp(truth), kTruth);
  const Output o = Split(r->out);
  ASSERT_FALSE(o.summary.is_null()) << r->err;
  EXPECT_EQ(o.summary["hits"], kThreads);
  std::set<long> ids;
  std::set<int> tids;
  for (const json& hit : o.lines) {
    ids.insert(hit["args"]["id"].get<long>());
    tids.insert(hit["tid"].get<int>());
  }
  EXPECT_EQ(ids.size(), static_cast<size_t>(kThreads));
  EXPECT_EQ(*ids.begin(), 0);
  EXPECT_EQ(*ids.rbegin(), kThreads - 1);
  EXPECT_EQ(tids.size(), static_cast<size_t>(kThreads));
}

// field_writer's ground truth lines (one per thread) in `path`, waiting up to ~10 s.
size_t TruthLines(const std::string& path, size_t want) {
  size_t n = 0;
  for (int i = 0; i < 400; ++i) {
    std::ifstream in(path);
    std::string line;
    n = 0;
    while (std::getline(in, line)) {
      n += line.find("flags_r") != std::string::npos ? 1 : 0;
    }
    if (n >= want) {
      break;
    }
    usleep(25 * 1000);
  }
  return n;
}

// ---- signals, per backend (tests/targets/field_writer.c) ----

class SignalLifecycle : public ::testing::TestWithParam<std::string> {};

// SIGSTOP/SIGCONT of the target: it stays stopped as job control asked, and every write is
// counted once it goes on.
TEST_P(SignalLifecycle, JobControlStopAndContinueKeepCountsExact) {
  const std::string backend = GetParam();
  const std::string truth = TruthFile("jobctl_" + backend);
  auto k = kwatch::testing::Spawned::Start({KwatchPath(), "--json", "--backend", backend, "--write",
                                            "g_stats.hits", "--", TargetPath("field_writer"), "2",
                                            "3000", "--truth", truth});
  ASSERT_TRUE(k.ok()) << k.status();
  ASSERT_TRUE((*k)->WaitForStderr("armed").ok()) << (*k)->err();
  const pid_t target = ::kwatch::clitest::LaunchedTarget((*k)->pid());
  ASSERT_GT(target, 0);
  ASSERT_EQ(kill(target, SIGSTOP), 0);
  ASSERT_TRUE((*k)->WaitForStderr("stopped by STOP").ok()) << (*k)->err();
  usleep(200 * 1000);
  ASSERT_EQ(kill(target, SIGCONT), 0);
  auto r = (*k)->Finish();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->exit_code, 0) << r->err;
  EXPECT_EQ(TruthLines(truth, 2), 2u);
  const Output o = Split(r->out);
  ASSERT_FALSE(o.summary.is_null()) << r->err;
  EXPECT_EQ(o.summary["stop_reason"], "target exited");
  if (backend != "page") {
    KW_REQUIRE_DEBUG_TRAPS();
  }
  EXPECT_EQ(o.summary["events"], 6000);
  EXPECT_EQ(o.summary["lost"], 0);
}

// The target killed by a signal mid-session: a summary, the target's status as kwatch's.
TEST_P(SignalLifecycle, TargetKilledBySignalEndsTheSession) {
  const std::string backend = GetParam();
  auto k = kwatch::testing::Spawned::Start(
      {KwatchPath(), "--json", "-q", "--backend", backend, "--write", "g_stats.hits", "--",
       TargetPath("field_writer"), "1", "1000000000", "--truth", TruthFile("killed_" + backend)});
  ASSERT_TRUE(k.ok()) << k.status();
  ASSERT_TRUE((*k)->WaitForStderr("armed").ok()) << (*k)->err();
  const pid_t target = ::kwatch::clitest::LaunchedTarget((*k)->pid());
  ASSERT_GT(target, 0);
  usleep(100 * 1000);
  ASSERT_EQ(kill(target, SIGTERM), 0);
  auto r = (*k)->Finish();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->exit_code, 128 + SIGTERM) << r->err;
  const Output o = Split(r->out);
  ASSERT_FALSE(o.summary.is_null()) << r->err;
  EXPECT_EQ(o.summary["stop_reason"], "target killed by TERM");
  EXPECT_EQ(o.summary["signal"], SIGTERM);
  EXPECT_EQ(o.summary["lost"], 0);
}

// kwatch stopped by SIGTERM: every register and page restored, the target detached; it then
// finishes its work and writes its ground truth. The target waits (--wait) until kwatch is
// gone, so it is still running when kwatch stops on every host, whether debug traps slow its
// writes down or the hypervisor drops them.
TEST_P(SignalLifecycle, StoppedKwatchLeavesTheTargetWorking) {
  const std::string backend = GetParam();
  const std::string truth = TruthFile("sigterm_" + backend);
  std::remove(truth.c_str());
  auto k = kwatch::testing::Spawned::Start(
      {KwatchPath(), "--json", "-q", "--backend", backend, "--rw", "g_stats.hits", "--",
       TargetPath("field_writer"), "2", "300000", "--wait", "--truth", truth});
  ASSERT_TRUE(k.ok()) << k.status();
  ASSERT_TRUE((*k)->WaitForStderr("armed").ok()) << (*k)->err();
  ASSERT_TRUE((*k)->WaitForStdout("ready").ok()) << (*k)->out();
  const pid_t target = ::kwatch::clitest::LaunchedTarget((*k)->pid());
  ASSERT_GT(target, 0);
  ASSERT_EQ(kill((*k)->pid(), SIGTERM), 0);
  // kwatch lets the target go; the target, still waiting, then does its work unwatched (it
  // shares kwatch's stdout, so kwatch's output ends with the target).
  EXPECT_TRUE((*k)->WaitForStderr("keeps running").ok()) << (*k)->err();
  ASSERT_EQ(kill(target, SIGUSR1), 0);
  auto r = (*k)->Finish();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->exit_code, 0) << r->err;
  const Output o = Split(r->out);
  EXPECT_EQ(o.summary["stop_reason"], "interrupted by TERM");
  EXPECT_EQ(TruthLines(truth, 2), 2u);  // no register or page left to kill it
}

INSTANTIATE_TEST_SUITE_P(Backends, SignalLifecycle, ::testing::Values("perf", "stop", "page"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

// ---- kwatch killed with SIGKILL (tests/targets/field_writer.c --wait) ----

// A SIGKILLed kwatch leaves an attached target running unharmed: perf and stop mode's
// breakpoints are perf events of kwatch's, closed by the kernel with kwatch's files; in page
// mode kwatch's guardian gives the page its protections back once the kernel has detached the
// target (its message ends kwatch's stderr, which it shares). The target then writes 6000
// times and exits normally.
class KilledKwatchAttached : public ::testing::TestWithParam<std::string> {};

TEST_P(KilledKwatchAttached, LeavesTheTargetRunning) {
  const std::string backend = GetParam();
  const std::string truth = TruthFile("sigkill_attach_" + backend);
  std::remove(truth.c_str());
  auto target = kwatch::testing::Spawned::Start(
      {TargetPath("field_writer"), "2", "3000", "--wait", "--truth", truth, "--exit", "6"});
  ASSERT_TRUE(target.ok()) << target.status();
  ASSERT_TRUE((*target)->WaitForStdout("ready").ok());
  auto k =
      kwatch::testing::Spawned::Start({KwatchPath(), "--backend", backend, "--write",
                                       "g_stats.hits", "-p", std::to_string((*target)->pid())});
  ASSERT_TRUE(k.ok()) << k.status();
  ASSERT_TRUE((*k)->WaitForStderr("armed").ok()) << (*k)->err();
  ASSERT_EQ(kill((*k)->pid(), SIGKILL), 0);
  auto kr = (*k)->Finish();
  ASSERT_TRUE(kr.ok()) << kr.status();
  EXPECT_EQ(kr->exit_code, 128 + SIGKILL);
  if (backend == "page") {
    EXPECT_THAT(kr->err, ::testing::HasSubstr(absl::StrCat(
                             "kwatch-guard: kwatch ended without cleaning up; restored the "
                             "protections of 1 page range in pid ",
                             (*target)->pid(), "\n")));
  }
  ASSERT_EQ(kill((*target)->pid(), SIGUSR1), 0);  // untraced now: it does its work
  auto tr = (*target)->Finish();
  ASSERT_TRUE(tr.ok()) << tr.status();
  EXPECT_EQ(tr->exit_code, 6) << tr->err;
  EXPECT_EQ(TruthLines(truth, 2), 2u);
}

INSTANTIATE_TEST_SUITE_P(Backends, KilledKwatchAttached, ::testing::Values("perf", "stop", "page"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

// Whether `pid` (a child of this process, not reaped) became a zombie within ~10 s.
bool WaitUntilZombie(pid_t pid) {
  for (int i = 0; i < 400; ++i) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/status");
    std::string line;
    while (std::getline(in, line)) {
      if (absl::StartsWith(line, "State:") && absl::StrContains(line, "Z")) {
        return true;
      }
    }
    usleep(25 * 1000);
  }
  return false;
}

// A launched target outlives a SIGKILLed kwatch unless --kill-on-exit asked otherwise.
class KilledKwatch : public ::testing::TestWithParam<bool> {};

TEST_P(KilledKwatch, LaunchedTargetIsKilledOnlyWithKillOnExit) {
  const bool kill_on_exit = GetParam();
  const std::string truth = TruthFile(kill_on_exit ? "sigkill_koe" : "sigkill_launch");
  std::remove(truth.c_str());
  kwatch::testing::SubreaperScope reaper;  // the orphaned target comes to this process
  std::vector<std::string> argv = {KwatchPath(), "--backend", "perf", "--write", "g_stats.hits"};
  if (kill_on_exit) {
    argv.push_back("--kill-on-exit");
  }
  for (const std::string& a : {std::string("--"), TargetPath("field_writer"), std::string("2"),
                               std::string("3000"), std::string("--wait"), std::string("--exit"),
                               std::string("6"), std::string("--truth"), truth}) {
    argv.push_back(a);
  }
  auto k = kwatch::testing::Spawned::Start(argv);
  ASSERT_TRUE(k.ok()) << k.status();
  ASSERT_TRUE((*k)->WaitForStdout("ready").ok()) << (*k)->err();
  ASSERT_TRUE((*k)->WaitForStderr("armed").ok()) << (*k)->err();
  const pid_t target = ::kwatch::clitest::LaunchedTarget((*k)->pid());
  ASSERT_GT(target, 0);
  ASSERT_EQ(kill((*k)->pid(), SIGKILL), 0);
  // kwatch is a zombie once the kernel has torn it down (its tracees detached, its perf
  // events closed); the target shares its stdout, so it goes on before kwatch is reaped.
  ASSERT_TRUE(WaitUntilZombie((*k)->pid()));
  if (!kill_on_exit) {
    ASSERT_EQ(kill(target, SIGUSR1), 0);
  }
  auto kr = (*k)->Finish();
  ASSERT_TRUE(kr.ok()) << kr.status();
  EXPECT_EQ(kr->exit_code, 128 + SIGKILL);
  int status = 0;
  ASSERT_EQ(waitpid(target, &status, 0), target);
  if (kill_on_exit) {
    ASSERT_TRUE(WIFSIGNALED(status)) << status;
    EXPECT_EQ(WTERMSIG(status), SIGKILL);
  } else {
    ASSERT_TRUE(WIFEXITED(status)) << status;
    EXPECT_EQ(WEXITSTATUS(status), 6);
    EXPECT_EQ(TruthLines(truth, 2), 2u);
  }
}

INSTANTIATE_TEST_SUITE_P(KillOnExit, KilledKwatch, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "KillOnExit" : "Default");
                         });

// ---- fork and exec (tests/targets/fork_watch.c) ----

// One process of fork_watch as it reported itself.
struct ForkTruth {
  int parent = 0;
  long writes = 0;  // over every image of the pid
  int free_slots = 0;
  int free_after = 0;
  int images = 0;
};

std::map<int, ForkTruth> ReadForkTruth(const std::string& path) {
  std::map<int, ForkTruth> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    const json j = json::parse(line);
    ForkTruth& t = out[j["pid"].get<int>()];
    t.parent = j["parent"].get<int>();
    t.writes += j["writes"].get<long>();
    t.free_slots = j["free_slots"].get<int>();
    t.free_after = j["free_after"].get<int>();
    ++t.images;
  }
  return out;
}

std::string ForkTruthFile(const std::string& name) {
  const std::string p =
      ::testing::TempDir() + "fork_watch_" + name + "_" + std::to_string(::getpid());
  std::remove(p.c_str());
  return p;
}

// Events per pid in kwatch's JSON lines.
std::map<int, long> EventsByPid(const Output& o) {
  std::map<int, long> out;
  for (const json& ev : o.lines) {
    if (ev.value("type", "") == "event") {
      ++out[ev["pid"].get<int>()];
    }
  }
  return out;
}

class ForkLifecycle : public ::testing::TestWithParam<std::string> {};

// Without -f, a forked child carries no breakpoint and no watch of kwatch's: it finds all four
// debug registers free (perf breakpoints are not inherited across fork, stop mode's registers
// are cleared, protected pages restored), runs to its normal end, and its writes are not
// counted.
TEST_P(ForkLifecycle, ANotFollowedChildCarriesNoWatch) {
  const std::string backend = GetParam();
  const std::string truth = ForkTruthFile("nofollow_" + backend);
  auto r = kwatch::testing::Run({KwatchPath(), "--json", "-q", "--backend", backend, "--write",
                                 "g_counter", "--", TargetPath("fork_watch"), "3", truth});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->exit_code, 3) << r->err;
  const auto t = ReadForkTruth(truth);
  ASSERT_EQ(t.size(), 5u) << r->err;  // main, 3 children, the grandchild: all ended normally
  const Output o = Split(r->out);
  ASSERT_FALSE(o.summary.is_null()) << r->err;
  const int main_pid = o.summary["pid"].get<int>();
  ASSERT_EQ(t.count(main_pid), 1u);
  EXPECT_EQ(t.at(main_pid).writes, 5);
  // Relative to the target, which holds the watch's register (perf, stop): a kernel watch of
  // another test on this machine takes a register of every task on its CPUs meanwhile.
  const int child_free = t.at(main_pid).free_slots + (backend == "page" ? 0 : 1);
  for (const auto& [pid, p] : t) {
    if (pid != main_pid) {
      EXPECT_EQ(p.free_slots, child_free) << "child " << pid << " inherited a debug register";
    }
  }
  ASSERT_TRUE(o.summary.contains("notes")) << o.summary.dump();
  EXPECT_EQ(o.summary["notes"][0],
            "the target forked 3 children: not followed (-f follows them), each let go with none "
            "of kwatch's watches");
  KW_REQUIRE_DEBUG_TRAPS();
  EXPECT_EQ(o.summary["events"], 5) << r->err;  // the target's own 3 + 2 writes
}

// With -f, each process is watched from its first instruction: its events carry its pid and
// match what it wrote, per process, in the events and in the summary.
TEST_P(ForkLifecycle, FollowedChildrenAreCountedExactlyPerProcess) {
  const std::string backend = GetParam();
  const std::string truth = ForkTruthFile("follow_" + backend);
  auto r = kwatch::testing::Run({KwatchPath(), "--json", "-f", "--backend", backend, "--write",
                                 "g_counter", "--", TargetPath("fork_watch"), "3", truth});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->exit_code, 3) << r->err;
  const auto t = ReadForkTruth(truth);
  ASSERT_EQ(t.size(), 5u) << r->err;
  const Output o = Split(r->out);
  ASSERT_FALSE(o.summary.is_null()) << r->err;
  const int main_pid = o.summary["pid"].get<int>();
  ASSERT_EQ(o.summary["processes"].size(), 5u) << o.summary.dump();
  EXPECT_EQ(o.summary["processes"][0]["pid"], main_pid);
  ASSERT_EQ(t.count(main_pid), 1u);
  for (const auto& [pid, p] : t) {
    // Every followed process holds its own watch, as the target does (perf, stop: one debug
    // register each; page: none, its own protected page).
    EXPECT_EQ(p.free_slots, t.at(main_pid).free_slots) << "pid " << pid;
  }
  KW_REQUIRE_DEBUG_TRAPS();
  const auto by_pid = EventsByPid(o);
  long total = 0;
  for (const auto& [pid, p] : t) {
    EXPECT_EQ(by_pid.count(pid) ? by_pid.at(pid) : 0, p.writes) << "pid " << pid;
    total += p.writes;
  }
  EXPECT_EQ(total, 5 + 10 + 7 + 30 + 30);
  EXPECT_EQ(o.summary["events"], total);
  EXPECT_EQ(o.summary["lost"], 0);
  std::multiset<int> exits;
  for (const json& p : o.summary["processes"]) {
    const int pid = p["pid"].get<int>();
    ASSERT_EQ(t.count(pid), 1u) << pid;
    EXPECT_EQ(p["events"], t.at(pid).writes) << pid;
    EXPECT_EQ(p["watches"][0], t.at(pid).writes) << pid;
    EXPECT_EQ(p["parent"], pid == main_pid ? 0 : t.at(pid).parent) << pid;
    exits.insert(p["exit_code"].get<int>());
  }
  // Exit statuses: main 3, child k exits k, the grandchild 7.
  EXPECT_EQ(exits, (std::multiset<int>{1, 2, 3, 3, 7}));
}

// With -f, a process that execs has its watches armed again by expression in the new image
// (symbols resolved again there): the exec'd image's 5 writes count under the same pid.
TEST_P(ForkLifecycle, FollowedExecIsReArmedByExpression) {
  const std::string backend = GetParam();
  const std::string truth = ForkTruthFile("exec_" + backend);
  auto r =
      kwatch::testing::Run({KwatchPath(), "--json", "-q", "-f", "--backend", backend, "--write",
                            "g_counter", "--", TargetPath("fork_watch"), "3", truth, "--exec"});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->exit_code, 3) << r->err;
  const auto t = ReadForkTruth(truth);
  ASSERT_EQ(t.size(), 5u) << r->err;
  const Output o = Split(r->out);
  ASSERT_FALSE(o.summary.is_null()) << r->err;
  int execd = 0;
  for (const auto& [pid, p] : t) {
    if (p.images == 2) {
      execd = pid;
      EXPECT_EQ(p.writes, 30 + 5);
    }
  }
  ASSERT_NE(execd, 0);
  EXPECT_NE(r->err.find("re-armed in the new image by expression"), std::string::npos) << r->err;
  bool noted = false;
  for (const json& n : o.summary["notes"]) {
    noted = noted || absl::StrContains(n.get<std::string>(),
                                       absl::StrCat("followed child ", execd, " called exec"));
  }
  EXPECT_TRUE(noted) << o.summary["notes"].dump();
  KW_REQUIRE_DEBUG_TRAPS();
  long total = 0;
  for (const json& p : o.summary["processes"]) {
    const int pid = p["pid"].get<int>();
    ASSERT_EQ(t.count(pid), 1u) << pid;
    EXPECT_EQ(p["events"], t.at(pid).writes) << pid;
    total += t.at(pid).writes;
  }
  EXPECT_EQ(o.summary["events"], total);
}

// -f on an attached process (-p): the children it forks after kwatch attached are followed
// (field_writer --fork: the child writes g_stats.hits 100 times, then 2 threads 50 each).
TEST_P(ForkLifecycle, AnAttachedTargetsChildrenAreFollowed) {
  const std::string backend = GetParam();
  const std::string truth = TruthFile("attach_fork_" + backend);
  auto target = kwatch::testing::Spawned::Start(
      {TargetPath("field_writer"), "2", "50", "--wait", "--fork", "--truth", truth});
  ASSERT_TRUE(target.ok()) << target.status();
  ASSERT_TRUE((*target)->WaitForStdout("ready").ok());
  auto k = kwatch::testing::Spawned::Start({KwatchPath(), "--json", "-f", "--backend", backend,
                                            "--write", "g_stats.hits", "-p",
                                            std::to_string((*target)->pid())});
  ASSERT_TRUE(k.ok()) << k.status();
  ASSERT_TRUE((*k)->WaitForStderr("armed").ok()) << (*k)->err();
  ASSERT_EQ(kill((*target)->pid(), SIGUSR1), 0);
  auto r = (*k)->Finish();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->exit_code, 0) << r->err;
  auto tr = (*target)->Finish();
  ASSERT_TRUE(tr.ok()) << tr.status();
  EXPECT_EQ(tr->exit_code, 0) << tr->err;  // 42 if the child had not exited 0
  const Output o = Split(r->out);
  ASSERT_FALSE(o.summary.is_null()) << r->err;
  EXPECT_EQ(o.summary["stop_reason"], "target exited; its followed children ended");
  ASSERT_EQ(o.summary["processes"].size(), 2u) << o.summary.dump();
  EXPECT_EQ(o.summary["processes"][0]["pid"], (*target)->pid());
  EXPECT_EQ(o.summary["processes"][1]["parent"], (*target)->pid());
  EXPECT_EQ(o.summary["processes"][1]["exit_code"], 0);
  if (backend != "page") {
    KW_REQUIRE_DEBUG_TRAPS();
  }
  EXPECT_EQ(o.summary["processes"][0]["events"], 100);  // 2 threads x 50
  EXPECT_EQ(o.summary["processes"][1]["events"], 100);  // the child
  const auto by_pid = EventsByPid(o);
  EXPECT_EQ(by_pid.at((*target)->pid()), 100);
  EXPECT_EQ(by_pid.at(o.summary["processes"][1]["pid"].get<int>()), 100);
  EXPECT_EQ(o.summary["events"], 200);
}

// What -f cannot make exact is refused before anything runs, with the reason.
TEST(Lifecycle, FollowForksRefusesWhatItCannotMakeExact) {
  auto mux =
      kwatch::testing::Run({KwatchPath(), "-f", "--overcommit=multiplex", "--write", "g_counter",
                            "--", TargetPath("fork_watch"), "1", ForkTruthFile("refused")});
  ASSERT_TRUE(mux.ok()) << mux.status();
  EXPECT_EQ(mux->exit_code, 2);
  EXPECT_TRUE(absl::StrContains(mux->err,
                                "kwatch: error: -f/--follow-forks: with --overcommit=multiplex "
                                "each process would rotate its own registers"))
      << mux->err;
  auto kernel = kwatch::testing::Run({KwatchPath(), "-f", "--write", "&jiffies"});
  ASSERT_TRUE(kernel.ok()) << kernel.status();
  EXPECT_EQ(kernel->exit_code, 2);
  EXPECT_TRUE(absl::StrContains(
      kernel->err, "kwatch: error: -f/--follow-forks: kernel watches have no process to follow"))
      << kernel->err;
}

// Ctrl-C while followed children wait: every child gets its memory and registers back and is
// detached; once let go they finish their work normally (a protected page left behind would
// kill them with SIGSEGV).
TEST_P(ForkLifecycle, InterruptRestoresEveryFollowedChild) {
  const std::string backend = GetParam();
  const std::string truth = ForkTruthFile("int_" + backend);
  const std::string go = truth + ".go";
  std::remove(go.c_str());
  kwatch::testing::SubreaperScope reaper;  // the target's children outlive kwatch's target
  auto k = kwatch::testing::Spawned::Start({KwatchPath(), "--json", "-f", "--backend", backend,
                                            "--write", "g_counter", "--", TargetPath("fork_watch"),
                                            "2", truth, "--go", go});
  ASSERT_TRUE(k.ok()) << k.status();
  ASSERT_TRUE((*k)->WaitForStdout("ready 1").ok()) << (*k)->err();
  ASSERT_TRUE((*k)->WaitForStdout("ready 2").ok()) << (*k)->err();
  ASSERT_EQ(kill((*k)->pid(), SIGINT), 0);
  ASSERT_TRUE((*k)->WaitForStderr("watches removed from 2 followed children, detached").ok())
      << (*k)->err();
  ASSERT_TRUE((*k)->WaitForStderr("keeps running").ok()) << (*k)->err();
  // The tree shares kwatch's stdout: it is let go before kwatch's output can end.
  { std::ofstream(go.c_str()) << "go\n"; }
  auto r = (*k)->Finish();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->exit_code, 0) << r->err;
  const Output o = Split(r->out);
  EXPECT_EQ(o.summary["stop_reason"], "interrupted by INT");
  // Untraced now, the tree finishes: main (3 + 2), child 1 (20), grandchild (7), child 2 (50).
  std::map<int, ForkTruth> t;
  for (int i = 0; i < 400 && t.size() < 4; ++i) {
    usleep(25 * 1000);
    t = ReadForkTruth(truth);
  }
  ASSERT_EQ(t.size(), 4u);
  std::map<long, int> writes;  // writes -> processes
  std::set<int> free_after;    // debug registers free at each process's end
  for (const auto& [pid, p] : t) {
    ++writes[p.writes];
    if (p.writes != 7) {  // the grandchild ended before the interrupt, watched to its end
      free_after.insert(p.free_after);
    }
  }
  // Every process the interrupt let go, the target included, has its registers back alike
  // (compared with each other: another test's kernel watch may hold registers of every task).
  EXPECT_EQ(free_after.size(), 1u);
  EXPECT_EQ(writes, (std::map<long, int>{{5, 1}, {7, 1}, {20, 1}, {50, 1}}));
  std::remove(go.c_str());
}

// Text output: a followed child's accesses show PID/TID, and the summary lists each process.
TEST(Lifecycle, FollowedChildrenShowPidSlashTidInText) {
  const std::string truth = ForkTruthFile("text");
  auto r = kwatch::testing::Run({KwatchPath(), "-f", "--backend", "page", "--write", "g_counter",
                                 "--", TargetPath("fork_watch"), "1", truth});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->exit_code, 3) << r->err;
  const auto t = ReadForkTruth(truth);
  ASSERT_EQ(t.size(), 3u);
  for (const auto& [pid, p] : t) {
    const std::string label = absl::StrCat(pid, "/", pid, " ");
    long lines = 0;
    bool summary_line = false;
    for (absl::string_view line : absl::StrSplit(r->out, '\n')) {
      lines += absl::StrContains(line, label) ? 1 : 0;
      summary_line = summary_line || (absl::StartsWith(line, absl::StrCat("  pid ", pid, " ")) &&
                                      absl::StrContains(line, absl::StrCat(p.writes, " events")));
    }
    const bool is_target = t.count(p.parent) == 0;  // the others' parents are in the tree
    EXPECT_EQ(lines, is_target ? 0 : p.writes) << label << r->out;
    EXPECT_TRUE(summary_line) << pid << "\n" << r->out;
  }
  EXPECT_TRUE(absl::StrContains(r->out,
                                "processes (-f: followed forks; events counted per "
                                "process):"))
      << r->out;
}

INSTANTIATE_TEST_SUITE_P(Backends, ForkLifecycle, ::testing::Values("perf", "stop", "page"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

}  // namespace
}  // namespace kwatch
