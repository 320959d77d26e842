// End-to-end tests of `kwatch --arm-at SPEC`: watches through a pointer that start-up code
// sets late (tests/targets/late_pointer.c), armed the first time a thread runs a probe point.
// The target prints the addresses of its objects; counts are compared exactly.
#include <signal.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
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

// The 1-based line of late_pointer.c that contains `needle`.
int LateLine(const std::string& needle) {
  return clitest::TargetSourceLine("late_pointer.c", needle);
}

// "a=0x... b=0x..." from the target's stderr (mixed into kwatch's): object A's v field.
std::string AddressOfA(const std::string& err) {
  const size_t at = err.find("a=0x");
  if (at == std::string::npos) {
    return "";
  }
  const size_t end = err.find(' ', at);
  return err.substr(at + 2, end - at - 2);
}

// Every event is a write of g_p->v at `addr` (as the target printed it).
void ExpectAllAt(const JsonRun& run, const std::string& addr) {
  for (const auto& e : run.events) {
    EXPECT_EQ(e["field"], "g_p->v");
    EXPECT_EQ(e["access"], "w");
    EXPECT_EQ(absl::StrFormat("0x%x", std::stoull(e["addr"].get<std::string>(), nullptr, 16)),
              addr);
  }
}

// N writes through g_p to A after write_through is first entered, then M to B: armed at the
// function, the watch sees exactly the N (B is another object: without --follow the watch
// stays on A). The breakpoint is gone after its hit: the second call of write_through runs
// and the target exits 0.
TEST(KwatchArmAt, ArmsAtAFunctionAndCountsEveryWriteThroughTheLatePointer) {
  const RunResult r = RunKwatch({"--json", "--write", "g_p->v", "--arm-at", "write_through", "--",
                                 TargetPath("late_pointer"), "25", "7"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const JsonRun run = ParseJsonLines(r.out);
  EXPECT_EQ(run.events.size(), 25u) << r.out;
  EXPECT_EQ(run.summary["events"], 25);
  ExpectAllAt(run, AddressOfA(r.err));
  EXPECT_EQ(run.summary["armed"], true);
  EXPECT_EQ(run.summary["arm_at"]["spec"], "write_through");
  EXPECT_THAT(run.summary["arm_at"]["point"].get<std::string>(), HasSubstr("write_through"));
  EXPECT_EQ(run.summary["arm_at"]["tid"], run.summary["pid"]);  // its only thread
  EXPECT_THAT(r.err, HasSubstr("--arm-at write_through: tid "));
}

// At the line after the assignment, in setup itself.
TEST(KwatchArmAt, ArmsAtTheLineAfterTheAssignment) {
  const int line = LateLine("the line after the assignment");
  ASSERT_GT(line, 0);
  const std::string spec = absl::StrCat("late_pointer.c:", line);
  const RunResult r = RunKwatch({"--json", "-q", "--write", "g_p->v", "--arm-at", spec, "--",
                                 TargetPath("late_pointer"), "40", "0"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const JsonRun run = ParseJsonLines(r.out);
  EXPECT_EQ(run.summary["events"], 40);
  EXPECT_THAT(run.summary["arm_at"]["point"].get<std::string>(),
              HasSubstr(absl::StrCat("late_pointer.c:", line, ")")));
}

// Without --arm-at the pointer is NULL at the entry point, as before.
TEST(KwatchArmAt, WithoutItThePointerIsNullAtTheStart) {
  const RunResult r = RunKwatch({"--write", "g_p->v", "--", TargetPath("late_pointer"), "5", "0"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("'g_p' is NULL"));
}

// A point that runs before the assignment: the error names the point and the thread.
TEST(KwatchArmAt, TooEarlyAPointSaysWhereThePointerWasNull) {
  const RunResult r = RunKwatch(
      {"--write", "g_p->v", "--arm-at", "setup", "--", TargetPath("late_pointer"), "5", "0"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("at --arm-at setup"));
  EXPECT_THAT(r.err, HasSubstr("'g_p' is NULL"));
}

TEST(KwatchArmAt, APointThatNeverRunsSaysTheWatchesWereNeverArmed) {
  const RunResult r = RunKwatch({"--json", "--write", "g_p->v", "--arm-at", "never_called", "--",
                                 TargetPath("late_pointer"), "5", "0", "--never"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const JsonRun run = ParseJsonLines(r.out);
  EXPECT_EQ(run.summary["events"], 0);
  EXPECT_EQ(run.summary["armed"], false);
  EXPECT_EQ(run.summary["arm_at"]["never"], "the target exited with status 0");
  EXPECT_THAT(r.err, HasSubstr("the watches were never armed"));
}

TEST(KwatchArmAt, AnUnknownFunctionIsRefusedWithANearMatch) {
  const RunResult r = RunKwatch(
      {"--write", "g_p->v", "--arm-at", "setpu", "--", TargetPath("late_pointer"), "5", "0"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("--arm-at 'setpu': unknown function 'setpu'"));
  EXPECT_THAT(r.err, HasSubstr("did you mean 'setup'?"));
}

// A mistake in the expression shows before the target runs, not at the point.
TEST(KwatchArmAt, AnUnknownMemberIsRefusedBeforeTheTargetRuns) {
  const RunResult r = RunKwatch({"--write", "g_p->nosuch", "--arm-at", "write_through", "--",
                                 TargetPath("late_pointer"), "5", "0"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("no member 'nosuch'"));
  EXPECT_THAT(r.err, ::testing::Not(HasSubstr("waiting for a thread")));
}

TEST(KwatchArmAt, KernelWatchesAndReturnProbesAreRefused) {
  const RunResult kernel = RunKwatch({"--write", "jiffies", "--arm-at", "setup"});
  EXPECT_EQ(kernel.exit_code, 2);
  EXPECT_THAT(kernel.err, HasSubstr("--arm-at: kernel watches are armed at once"));
  const RunResult ret = RunKwatch({"--write", "g_p->v", "--arm-at", "setup%return", "--",
                                   TargetPath("late_pointer"), "5", "0"});
  EXPECT_EQ(ret.exit_code, 1);
  EXPECT_THAT(ret.err, HasSubstr("a return probe is not a point"));
}

// Four threads run Work at once: the first to reach it arms the watch while the others are
// stopped (some trapped on the same INT3, sent back to it): every write of every thread counts,
// and no thread dies of a stray SIGTRAP.
TEST(KwatchArmAt, ThreadsRacingToThePointAreAllCountedExactly) {
  const std::string truth_path = ::kwatch::clitest::TruthFile("arm-at-threads");
  const RunResult r =
      RunKwatch({"--json", "-q", "--write", "g_stats.hits", "--arm-at", "Work", "--",
                 TargetPath("field_writer"), "4", "3000", "--truth", truth_path});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const JsonRun run = ParseJsonLines(r.out);
  const std::map<int, ::kwatch::clitest::Truth> truth = ::kwatch::clitest::ReadTruth(truth_path);
  ASSERT_EQ(truth.size(), 4u);
  long total = 0;
  for (const auto& [tid, t] : truth) {
    total += t.hits_w;
  }
  EXPECT_EQ(total, 4 * 3000);
  EXPECT_EQ(run.summary["events"], total);
  EXPECT_EQ(run.summary["armed"], true);
}

// Attached: the target waits, kwatch plants the point, the target goes on.
TEST(KwatchArmAt, AnAttachedTargetIsArmedAtThePoint) {
  auto target = kwatch::testing::Spawned::Start({TargetPath("late_pointer"), "9", "4", "--wait"});
  ASSERT_TRUE(target.ok()) << target.status();
  ASSERT_TRUE((*target)->WaitForStdout("ready").ok()) << (*target)->out();
  auto k = kwatch::testing::Spawned::Start({KwatchPath(), "--json", "--write", "g_p->v", "--arm-at",
                                            "write_through", "-p", absl::StrCat((*target)->pid())});
  ASSERT_TRUE(k.ok()) << k.status();
  ASSERT_TRUE((*k)->WaitForStderr("waiting for a thread").ok()) << (*k)->err();
  ASSERT_EQ(kill((*target)->pid(), SIGUSR1), 0);
  auto r = (*k)->Finish();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->exit_code, 0) << r->err;
  auto tr = (*target)->Finish();
  ASSERT_TRUE(tr.ok()) << tr.status();
  EXPECT_EQ(tr->exit_code, 0);
  const JsonRun run = ParseJsonLines(r->out);
  EXPECT_EQ(run.summary["events"], 9) << r->err;
  ExpectAllAt(run, AddressOfA(tr->err));
  EXPECT_EQ(run.summary["arm_at"]["tid"], (*target)->pid());
}

// kwatch killed (SIGKILL) while it waits for the point: its guardian puts the original byte
// back, so the target runs through the point unharmed (without the guardian it died of SIGTRAP
// there).
TEST(KwatchArmAt, KwatchKilledWhileWaitingLeavesNoInt3Behind) {
  auto target = kwatch::testing::Spawned::Start({TargetPath("late_pointer"), "9", "4", "--wait"});
  ASSERT_TRUE(target.ok()) << target.status();
  ASSERT_TRUE((*target)->WaitForStdout("ready").ok()) << (*target)->out();
  auto k = kwatch::testing::Spawned::Start({KwatchPath(), "--write", "g_p->v", "--arm-at",
                                            "write_through", "-p", absl::StrCat((*target)->pid())});
  ASSERT_TRUE(k.ok()) << k.status();
  ASSERT_TRUE((*k)->WaitForStderr("waiting for a thread").ok()) << (*k)->err();
  ASSERT_EQ(kill((*k)->pid(), SIGKILL), 0);
  auto r = (*k)->Finish();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->exit_code, 128 + SIGKILL);
  // The guardian restores within about a millisecond of kwatch's death; give it ample time.
  usleep(500 * 1000);
  ASSERT_EQ(kill((*target)->pid(), SIGUSR1), 0);
  auto tr = (*target)->Finish();
  ASSERT_TRUE(tr.ok()) << tr.status();
  EXPECT_EQ(tr->exit_code, 0) << tr->err;
  EXPECT_THAT(tr->err, HasSubstr("a=0x"));
}

}  // namespace
}  // namespace kwatch
