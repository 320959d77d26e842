// Issue 9: kwatch never leaves a target broken, even when kwatch itself is killed. Stop mode
// (`kwatch --stop`) and `kwatch probe --hw` arm hardware breakpoints in an attached target
// that keeps hitting them (tests/targets/kill_target.c: a tight loop in two threads, or one
// call every 50 ms); kwatch is SIGKILLed mid-session, and the target must run to its normal
// end with its normal output and exit status. (Debug registers written with PTRACE_POKEUSER
// stayed armed after the tracer died: the next hit killed the target with SIGTRAP.)
//
// One trap per thread may still reach the target: a hit whose ptrace stop kwatch had not yet
// collected (waitpid) when it died. The kernel detaches such a thread with the stop's signal
// still to deliver (ptrace_stop keeps exit_code until the tracer's wait clears it, Linux
// 6.18); no breakpoint is involved any more. The tight loop, where some thread is almost
// always stopped or about to be, catches SIGTRAP and counts what arrives: at most one per
// thread (with the old registers: every call after kwatch's death). The slow loop sleeps
// between calls and has no handler: it must simply run to its end.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "tests/test_util.h"
#include "tests/watch/debug_traps.h"

namespace kwatch {
namespace {

using ::kwatch::testing::KwatchPath;
using ::kwatch::testing::Spawned;
using ::kwatch::testing::SubreaperScope;
using ::kwatch::testing::TargetPath;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

struct Loop {
  int threads = 1;
  long calls = 0;            // per thread
  long usec = 0;             // between calls
  bool catch_traps = false;  // kill_target's `traps`: a SIGTRAP handler counts them
  int max_traps = -1;        // with catch_traps: the most it may count (-1: one per thread)
};

// kill_target's own output for `loop` (sum over i < n of 2i + 1 = n^2 per thread), without
// the "traps=K" line.
std::string NormalOutput(const Loop& loop) {
  return absl::StrCat("ready\ndone calls=", loop.threads * loop.calls,
                      " sum=", loop.threads * loop.calls * loop.calls, "\n");
}

// A private directory for kill_target's GOFILE.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = absl::StrCat(::testing::TempDir(), "/kwatch-killed-XXXXXX");
    EXPECT_NE(::mkdtemp(tmpl.data()), nullptr);
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string go() const { return path_ + "/go"; }

 private:
  std::string path_;
};

// Starts kill_target with `loop`, attaches `kwatch ARGS -p PID`, lets the target hit until
// kwatch has printed `seen` (a hit or event of the loop), SIGKILLs kwatch, and checks that the
// target ends as if nobody had watched it.
void KillMidSession(const std::vector<std::string>& args, const Loop& loop, const std::string& seen,
                    std::string* kwatch_err = nullptr, pid_t* target_pid = nullptr) {
  const TempDir dir;
  std::vector<std::string> target = {TargetPath("kill_target"), absl::StrCat(loop.threads),
                                     absl::StrCat(loop.calls), absl::StrCat(loop.usec), dir.go()};
  if (loop.catch_traps) {
    target.emplace_back("traps");
  }
  auto t = Spawned::Start(target);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_TRUE((*t)->WaitForStdout("ready").ok());
  std::vector<std::string> argv = {KwatchPath()};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.insert(argv.end(), {"-p", absl::StrCat((*t)->pid())});
  auto k = Spawned::Start(argv);
  ASSERT_TRUE(k.ok()) << k.status();
  ASSERT_TRUE((*k)->WaitForStderr("armed").ok()) << (*k)->err();
  std::ofstream(dir.go()).put('1');
  // Where traps are delivered, kwatch reports the loop's accesses: kill it in the middle.
  const bool hitting = (*k)->WaitForStdout(seen, 20).ok();
  if (!hitting) {
    // Without debug traps the loop runs unwatched to its end (and kwatch with it) before
    // anything could be killed in the middle: this test needs a host that delivers them.
    ::kill((*k)->pid(), SIGKILL);
    ::kill((*t)->pid(), SIGKILL);
    KW_REQUIRE_DEBUG_TRAPS();  // skips where the machine never delivers debug traps
    ADD_FAILURE() << "kwatch printed no `" << seen << "` before it was killed:\n"
                  << (*k)->out() << (*k)->err();
    return;
  }
  ASSERT_EQ(::kill((*k)->pid(), SIGKILL), 0);
  auto kr = (*k)->Finish();
  ASSERT_TRUE(kr.ok()) << kr.status();
  if (kwatch_err != nullptr) {
    *kwatch_err = kr->err;
  }
  if (target_pid != nullptr) {
    *target_pid = (*t)->pid();
  }
  EXPECT_EQ(kr->exit_code, 128 + SIGKILL) << kr->err << "\nstdout:\n" << kr->out;

  auto tr = (*t)->Finish(60);
  ASSERT_TRUE(tr.ok()) << tr.status();
  EXPECT_EQ(tr->exit_code, 0) << "the target died after kwatch was killed (133: SIGTRAP)";
  const std::string normal = NormalOutput(loop);
  if (loop.catch_traps) {
    ASSERT_TRUE(absl::StartsWith(tr->out, normal)) << tr->out;
    int traps = -1;
    absl::string_view rest = absl::string_view(tr->out).substr(normal.size());
    ASSERT_TRUE(absl::ConsumePrefix(&rest, "traps=") && absl::ConsumeSuffix(&rest, "\n") &&
                absl::SimpleAtoi(rest, &traps))
        << tr->out;
    EXPECT_LE(traps, loop.max_traps >= 0 ? loop.max_traps : loop.threads)
        << "breakpoints kept trapping after kwatch died";
  } else {
    EXPECT_EQ(tr->out, normal);
  }
}

// `kwatch probe --hw`: two threads calling kill_tick in a tight loop, kwatch killed after
// the 2000th call of one of them was reported.
TEST(ProbeHwKilled, TargetInATightLoopRunsToItsEndWhenKwatchIsKilled) {
  KillMidSession({"probe", "--hw", "--json", "kill_tick i"}, {2, 2'000'000, 0, true},
                 "\"args\":{\"i\":2000}");
}

// One call every 300 ms: the target is asleep when kwatch dies, and hits afterwards. (A hit
// that lands while kwatch is dying, between its SIGKILL and the kernel closing its files,
// about a millisecond here and tens of milliseconds for a sanitizer build, still stops the
// thread and reaches it as a SIGTRAP once detached: seen with tracefs with a 50 ms period.)
TEST(ProbeHwKilled, TargetInASlowLoopRunsToItsEndWhenKwatchIsKilled) {
  KillMidSession({"probe", "--hw", "--json", "kill_tick i"}, {1, 10, 300'000, false},
                 "\"args\":{\"i\":3}");
}

TEST(StopBackendKilled, TargetInATightLoopRunsToItsEndWhenKwatchIsKilled) {
  KillMidSession({"--stop", "--json", "--write", "g_val"}, {2, 2'000'000, 0, true},
                 "\"value\":2000,");
}

TEST(StopBackendKilled, TargetInASlowLoopRunsToItsEndWhenKwatchIsKilled) {
  KillMidSession({"--stop", "--json", "--write", "g_val"}, {1, 10, 300'000, false}, "\"value\":3,");
}

// Page mode: the protected page would crash the target at its next write. kwatch's guardian
// (core/guardian.h) waits for the kernel to detach the target and runs mprotect in it with
// the page's original protections, and says so; the target, asleep at that moment, runs on.
// (A thread faulting on the page in the moment kwatch takes to die still receives its
// SIGSEGV: a tight loop over the page dies, see README.)
TEST(PageBackendKilled, TargetInASlowLoopRunsToItsEndWhenKwatchIsKilled) {
  std::string err;
  pid_t pid = 0;
  KillMidSession({"--backend=page", "--json", "--write", "g_val"}, {1, 10, 300'000, false},
                 "\"value\":3,", &err, &pid);
  EXPECT_THAT(err, HasSubstr(absl::StrCat("\nkwatch-guard: kwatch ended without cleaning up; "
                                          "restored the protections of 1 page range in pid ",
                                          pid, "\n")))
      << err;
}

// The in-process agent (docs/agent.md "Dying"): no ptrace stop per hit, so no trap is left
// pending when kwatch dies; the agent's watchdog sees the lifeline close and puts the code
// back. Two threads in a tight loop through a jump probe, then through the agent's INT3
// handler; kill_target's own SIGTRAP handler must receive nothing. 20 runs of each.
TEST(AgentKilled, TargetInATightLoopRunsToItsEndWhenKwatchIsKilled) {
  for (int run = 0; run < 20; ++run) {
    SCOPED_TRACE(absl::StrCat("run ", run));
    KillMidSession({"probe", "--backend", "agent", "--json", "kill_tick i"},
                   {2, 2'000'000, 0, true, 0}, "\"args\":{\"i\":2000}");
    KillMidSession({"probe", "--backend", "agent", "--no-jump", "--json", "kill_tick i"},
                   {2, 50'000, 0, true, 0}, "\"args\":{\"i\":2000}");
    if (::testing::Test::HasFailure()) {
      break;
    }
  }
}

// -f with the agent (docs/agent.md "fork"): kill_target forks once it may go, and parent and
// child each run two threads calling kill_tick in a tight loop; kwatch follows the child (its
// hits come labelled with its pid) and is SIGKILLed while both hit the probe. Each process's
// own watchdog puts its copy of the code back: both run to their normal end, and neither
// receives a SIGTRAP. Jump and INT3 paths, 5 runs each.
void KillFollowedMidSession(bool jump) {
  const SubreaperScope reaper;
  const TempDir dir;
  const Loop loop{2, jump ? 20'000'000 : 200'000, 0, true, 0};
  auto t = Spawned::Start({TargetPath("kill_target"), absl::StrCat(loop.threads),
                           absl::StrCat(loop.calls), "0", dir.go(), "traps", "fork"});
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_TRUE((*t)->WaitForStdout("ready").ok());
  std::vector<std::string> argv = {KwatchPath(), "probe", "--backend", "agent", "-f", "--json"};
  if (!jump) {
    argv.emplace_back("--no-jump");
  }
  argv.insert(argv.end(), {"kill_tick i", "-p", absl::StrCat((*t)->pid())});
  auto k = Spawned::Start(argv);
  ASSERT_TRUE(k.ok()) << k.status();
  ASSERT_TRUE((*k)->WaitForStderr("armed").ok()) << (*k)->err();
  std::ofstream(dir.go()).put('1');
  // The child is followed ("kwatch: following child C of P ...") and hits too: a hit of its
  // is out.
  ASSERT_TRUE((*k)->WaitForStderr("following child ").ok()) << (*k)->err();
  pid_t child = 0;
  {
    absl::string_view err = (*k)->err();
    err.remove_prefix(err.find("following child ") + 16);
    ASSERT_TRUE(absl::SimpleAtoi(err.substr(0, err.find(' ')), &child)) << (*k)->err();
  }
  ASSERT_TRUE((*k)->WaitForStdout(absl::StrCat("\"pid\":", child, ","), 60).ok())
      << "no hit of the followed child " << child;
  ASSERT_EQ(::kill((*k)->pid(), SIGKILL), 0);
  auto kr = (*k)->Finish();
  ASSERT_TRUE(kr.ok()) << kr.status();
  EXPECT_EQ(kr->exit_code, 128 + SIGKILL) << kr->err;
  auto tr = (*t)->Finish(120);
  ASSERT_TRUE(tr.ok()) << tr.status();
  EXPECT_EQ(tr->exit_code, 0) << "the target died after kwatch was killed (133: SIGTRAP)";
  const long calls = loop.threads * loop.calls;
  const long sum = calls * loop.calls;
  EXPECT_THAT(tr->out,
              HasSubstr(absl::StrCat("\ndone calls=", calls, " sum=", sum, "\ntraps=0\n")));
  EXPECT_THAT(tr->out,
              HasSubstr(absl::StrCat("child done calls=", calls, " sum=", sum, " traps=0\n")));
  EXPECT_THAT(tr->out, HasSubstr("child exited 0 signal 0\n"));
}

TEST(AgentKilled, FollowedChildAndParentRunToTheirEndWhenKwatchIsKilled) {
  for (int run = 0; run < 5; ++run) {
    SCOPED_TRACE(absl::StrCat("run ", run));
    KillFollowedMidSession(/*jump=*/true);
    KillFollowedMidSession(/*jump=*/false);
    if (::testing::Test::HasFailure()) {
      break;
    }
  }
}

// As KillMidSession, with kwatch launching the target (`kwatch ARGS -- kill_target ...`): the
// target shares kwatch's output and becomes an orphan when kwatch dies; this test reaps it
// (SubreaperScope) and checks its exit status and its own lines among kwatch's.
void KillLaunchedMidSession(const std::vector<std::string>& args, const Loop& loop,
                            const std::string& seen) {
  const SubreaperScope reaper;
  const TempDir dir;
  std::vector<std::string> argv = {KwatchPath()};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.insert(argv.end(), {"--", TargetPath("kill_target"), absl::StrCat(loop.threads),
                           absl::StrCat(loop.calls), absl::StrCat(loop.usec), dir.go()});
  if (loop.catch_traps) {
    argv.emplace_back("traps");
  }
  auto k = Spawned::Start(argv);
  ASSERT_TRUE(k.ok()) << k.status();
  ASSERT_TRUE((*k)->WaitForStderr("armed").ok()) << (*k)->err();
  // "kwatch: armed 1 probe on pid N (PATH), ..."
  pid_t target = 0;
  {
    absl::string_view err = (*k)->err();
    const size_t at = err.find(" on pid ");
    ASSERT_NE(at, absl::string_view::npos) << err;
    err.remove_prefix(at + 8);
    ASSERT_TRUE(absl::SimpleAtoi(err.substr(0, err.find(' ')), &target)) << (*k)->err();
  }
  std::ofstream(dir.go()).put('1');
  const bool hitting = (*k)->WaitForStdout(seen, 20).ok();
  ASSERT_EQ(::kill((*k)->pid(), SIGKILL), 0);
  // The target holds kwatch's pipes: Finish reads until it ends too.
  auto kr = (*k)->Finish(60);
  ASSERT_TRUE(kr.ok()) << kr.status();
  EXPECT_EQ(kr->exit_code, 128 + SIGKILL) << kr->err;
  int status = 0;
  ASSERT_EQ(::waitpid(target, &status, 0), target) << "the target was not reaped here";
  ASSERT_TRUE(hitting) << "kwatch printed no `" << seen << "` before it was killed:\n" << kr->err;
  ASSERT_TRUE(WIFEXITED(status)) << "the target died after kwatch was killed, signal "
                                 << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  EXPECT_EQ(WEXITSTATUS(status), 0);
  const std::string done = absl::StrCat("\ndone calls=", loop.threads * loop.calls,
                                        " sum=", loop.threads * loop.calls * loop.calls, "\n");
  EXPECT_THAT(kr->out, HasSubstr(done));
  if (loop.catch_traps) {
    EXPECT_THAT(kr->out, HasSubstr(absl::StrCat(done, "traps=0\n")))
        << "the target's own SIGTRAP handler received traps";
  }
}

// Launched targets: kwatch dies after the target's 2000th reported call; the target runs on
// (kwatch does not kill a launched target unless --kill-on-exit) and ends normally.
TEST(AgentKilled, LaunchedTargetRunsToItsEndWhenKwatchIsKilled) {
  for (int run = 0; run < 20; ++run) {
    SCOPED_TRACE(absl::StrCat("run ", run));
    KillLaunchedMidSession({"probe", "--backend", "agent", "--json", "kill_tick i"},
                           {2, 2'000'000, 0, true, 0}, "\"args\":{\"i\":2000}");
    KillLaunchedMidSession({"probe", "--backend", "agent", "--no-jump", "--json", "kill_tick i"},
                           {2, 50'000, 0, true, 0}, "\"args\":{\"i\":2000}");
    if (::testing::Test::HasFailure()) {
      break;
    }
  }
}

// The breakpoints are gone with kwatch: once it is killed, every register of the target's
// thread is free again (the kernel's count, as `kwatch slots` takes it).
TEST(StopBackendKilled, TheTargetsRegistersAreFreeOnceKwatchIsKilled) {
  const TempDir dir;
  auto t = Spawned::Start({TargetPath("kill_target"), "1", "10", "0", dir.go()});
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_TRUE((*t)->WaitForStdout("ready").ok());
  const pid_t pid = (*t)->pid();
  auto k = Spawned::Start({KwatchPath(), "--stop", "--write", "g_val", "-p", absl::StrCat(pid)});
  ASSERT_TRUE(k.ok()) << k.status();
  ASSERT_TRUE((*k)->WaitForStderr("armed").ok()) << (*k)->err();
  // Armed: the kernel counts kwatch's register in the target's thread.
  auto slots = kwatch::testing::Run({KwatchPath(), "slots", "-p", absl::StrCat(pid)});
  ASSERT_TRUE(slots.ok());
  EXPECT_THAT(slots->out, HasSubstr("1 kwatch, 0 held outside kwatch, 3 free")) << slots->out;
  ASSERT_EQ(::kill((*k)->pid(), SIGKILL), 0);
  ASSERT_TRUE((*k)->Finish().ok());
  slots = kwatch::testing::Run({KwatchPath(), "slots", "-p", absl::StrCat(pid)});
  ASSERT_TRUE(slots.ok());
  EXPECT_THAT(slots->out, HasSubstr("0 kwatch, 0 held outside kwatch, 4 free")) << slots->out;
  std::ofstream(dir.go()).put('1');
  auto tr = (*t)->Finish(60);
  ASSERT_TRUE(tr.ok());
  EXPECT_EQ(tr->exit_code, 0);
  EXPECT_EQ(tr->out, NormalOutput({1, 10, 0, false}));
}

}  // namespace
}  // namespace kwatch
