// Page mode and a program's own SIGSEGV handler (issue 17): a program whose handler touches a
// watched page while SIGSEGV is blocked has the kernel reset that handler to SIG_DFL
// (force_sig_info_to_task) before kwatch sees the fault; kwatch puts the handler and the
// thread's signal mask back, and says how many times. tests/targets/segv_handler.c counts the
// faults its handler saw and whether SIGSEGV stayed blocked in it.
#include <signal.h>

#include <string>
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

constexpr int kFaults = 5;   // the target's own faults on its guard page
constexpr int kWrites = 20;  // its writes of g_shared.watched outside the handler
// Each handler run writes the watched page three times with SIGSEGV blocked (faults_seen,
// watched, blocked): three resets of the handler by the kernel, each restored.
constexpr int kRestores = 3 * kFaults;

// What both tests check: the target ran to its end with its handler seeing every fault (and
// SIGSEGV blocked in it as the program expects), kwatch counted exactly the writes of the
// watched variable (main's and the handler's; the guard page's faults are the program's own,
// never events), and the summary says how many times the handler was restored.
void ExpectHandlerKept(const RunResult& target, const std::string& kwatch_out) {
  EXPECT_EQ(target.exit_code, 0) << target.err;
  EXPECT_THAT(target.err, HasSubstr(absl::StrCat("faults ", kFaults, " seen ", kFaults, " blocked ",
                                                 kFaults, " watched ", kWrites + kFaults)));
  const JsonRun run = ParseJsonLines(kwatch_out);
  ASSERT_EQ(run.events.size(), static_cast<size_t>(kWrites + kFaults));
  for (const auto& e : run.events) {
    EXPECT_EQ(e["access"], "w") << e.dump();
    EXPECT_EQ(e["field"], "g_shared.watched") << e.dump();
  }
  EXPECT_EQ(run.summary["events"], kWrites + kFaults);
  // The handler's other two writes per fault are on the watched page, not the variable.
  EXPECT_EQ(run.summary["unrelated"], 2 * kFaults);
  ASSERT_TRUE(run.summary.contains("notes")) << run.summary.dump();
  EXPECT_THAT(run.summary["notes"].dump(),
              HasSubstr(absl::StrCat("restored the program's SIGSEGV handler ", kRestores,
                                     " times (the kernel reset it when a watched page was "
                                     "touched with SIGSEGV blocked)")));
}

// The handler is installed after kwatch armed (main runs under the watch): kwatch learns it
// from the program's rt_sigaction.
TEST(PageSegvHandler, LaunchedProgramKeepsItsHandler) {
  const RunResult r =
      RunKwatch({"--json", "--backend", "page", "--write", "g_shared.watched", "--",
                 TargetPath("segv_handler"), absl::StrCat(kFaults), absl::StrCat(kWrites)});
  ExpectHandlerKept(r, r.out);
}

// The handler is installed before kwatch attaches: kwatch reads it at arm (a remote
// rt_sigaction in the stopped target).
TEST(PageSegvHandler, AttachedProgramKeepsItsHandler) {
  auto target = kwatch::testing::Spawned::Start(
      {TargetPath("segv_handler"), absl::StrCat(kFaults), absl::StrCat(kWrites), "--wait"});
  ASSERT_TRUE(target.ok());
  ASSERT_TRUE((*target)->WaitForStdout("ready").ok());
  auto k =
      kwatch::testing::Spawned::Start({KwatchPath(), "--json", "--backend", "page", "--write",
                                       "g_shared.watched", "-p", absl::StrCat((*target)->pid())});
  ASSERT_TRUE(k.ok());
  ASSERT_TRUE((*k)->WaitForStderr("armed").ok()) << (*k)->err();
  ASSERT_EQ(kill((*target)->pid(), SIGUSR1), 0);
  auto kr = (*k)->Finish();
  ASSERT_TRUE(kr.ok()) << kr.status();
  EXPECT_EQ(kr->exit_code, 0) << kr->err;
  auto tr = (*target)->Finish();
  ASSERT_TRUE(tr.ok()) << tr.status();
  ExpectHandlerKept(*tr, kr->out);
}

// A handler for one fault (SA_RESETHAND) that installs itself again: the kernel's reset at its
// delivery and the one at a fault of kwatch's look the same, so kwatch leaves it as the flag
// asks (the handler puts itself back) and says how many times it found it reset.
TEST(PageSegvHandler, ResetHandHandlerIsLeftAsTheFlagAsks) {
  const RunResult r = RunKwatch({"--json", "--backend", "page", "--write", "g_shared.watched", "--",
                                 TargetPath("segv_handler"), absl::StrCat(kFaults),
                                 absl::StrCat(kWrites), "--resethand"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr(absl::StrCat("faults ", kFaults, " seen ", kFaults)));
  const JsonRun run = ParseJsonLines(r.out);
  EXPECT_EQ(run.summary["events"], kWrites + kFaults);
  ASSERT_TRUE(run.summary.contains("notes")) << run.summary.dump();
  const std::string notes = run.summary["notes"].dump();
  EXPECT_THAT(notes, HasSubstr(absl::StrCat("found the program's SIGSEGV handler reset ", kFaults,
                                            " times at a fault on a watched page: not put back, "
                                            "as it was installed with SA_RESETHAND")));
  EXPECT_THAT(notes, ::testing::Not(HasSubstr("restored the program's SIGSEGV handler")));
}

}  // namespace
}  // namespace kwatch
