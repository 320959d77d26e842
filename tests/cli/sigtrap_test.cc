// kwatch never kills its target with a debug trap, and never swallows the target's own:
// tests/targets/sigtraps.c raises SIGTRAP every legitimate way (raise, kill, int3, icebp)
// and then forges the signal the kernel sends for a debug exception with no cause.
// Hosts differ on the icebp (after it, on it, or not at all: core::HostIcebpKind); the
// expectations follow what this host does, found at run time, and say it in the output.
#include <signal.h>

#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "core/ptrace/trap_origin.h"
#include "tests/test_util.h"

namespace kwatch {
namespace {

using ::kwatch::testing::KwatchPath;
using ::kwatch::testing::RunResult;
using ::kwatch::testing::TargetPath;
using ::testing::HasSubstr;
using json = nlohmann::json;

// kwatch's JSON summary, and the target's own lines.
struct Output {
  json summary;
  std::vector<std::string> target_lines;
};

Output Split(const std::string& out) {
  Output o;
  for (absl::string_view line : absl::StrSplit(out, '\n', absl::SkipEmpty())) {
    if (line.front() == '{') {
      json j = json::parse(std::string(line));
      if (j.value("type", "") == "summary") {
        o.summary = std::move(j);
      }
    } else {
      o.target_lines.emplace_back(line);
    }
  }
  return o;
}

// Every run here ends in a few seconds; 60 s is a hang, well under ctest's limit.
RunResult RunOrFail(const std::vector<std::string>& argv, int timeout_s = 60) {
  auto r = kwatch::testing::Run(argv, timeout_s);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : RunResult{};
}

// How this host reports an icebp (a check kwatch itself makes, in core/trap_origin.h).
core::ptrace::IcebpKind HostIcebp() {
  const absl::StatusOr<core::ptrace::IcebpKind> kind = core::ptrace::HostIcebpKind();
  EXPECT_TRUE(kind.ok()) << kind.status();
  return kind.ok() ? *kind : core::ptrace::IcebpKind::kTrap;
}

// What tests/targets/sigtraps prints after five rounds on this host.
std::string FiveRounds() {
  const int icebp = HostIcebp() == core::ptrace::IcebpKind::kDropped ? 0 : 5;
  return absl::StrCat("tkill=5 user=5 int3=5 icebp=", icebp, " other=0 counter=15");
}

TEST(Sigtrap, TheHostsIcebpKindIsWhatTheTargetSees) {
  const core::ptrace::IcebpKind kind = HostIcebp();
  std::cout << "note: this host reports icebp as " << core::ptrace::IcebpKindName(kind) << "\n";
  ::testing::Test::RecordProperty("icebp", std::string(core::ptrace::IcebpKindName(kind)));
  const RunResult r = RunOrFail({TargetPath("sigtraps"), "--icebp-kind"}, 10);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const char* name = kind == core::ptrace::IcebpKind::kTrap    ? "trap"
                     : kind == core::ptrace::IcebpKind::kFault ? "fault"
                                                               : "dropped";
  EXPECT_EQ(r.out, absl::StrCat("icebp: ", name, "\n"));
}

TEST(Sigtrap, AloneTheTargetCatchesItsOwnTrapsAndDiesOfAForgedOne) {
  // The fixture itself: what it prints alone, and that the forged trap is fatal without kwatch.
  const RunResult alone = RunOrFail({TargetPath("sigtraps"), "5"});
  EXPECT_EQ(alone.exit_code, 0);
  EXPECT_EQ(alone.out, absl::StrCat(FiveRounds(), "\n"));
  const RunResult forged = RunOrFail({TargetPath("sigtraps"), "1", "--forge", "1"});
  EXPECT_EQ(forged.exit_code, 128 + SIGTRAP);
}

// Without a handler an icebp is fatal on hosts that report it, under kwatch as without it.
TEST(Sigtrap, AnUnhandledIcebpEndsTheTargetAsWithoutKwatch) {
  const bool dropped = HostIcebp() == core::ptrace::IcebpKind::kDropped;
  const RunResult alone = RunOrFail({TargetPath("sigtraps"), "--bare-icebp"}, 10);
  EXPECT_EQ(alone.exit_code, dropped ? 0 : 128 + SIGTRAP);
  const RunResult watched = RunOrFail(
      {KwatchPath(), "-q", "--write", "g_counter", "--", TargetPath("sigtraps"), "--bare-icebp"});
  EXPECT_EQ(watched.exit_code, dropped ? 0 : 128 + SIGTRAP) << watched.err;
  EXPECT_THAT(watched.out, HasSubstr("kwatch summary: 1 events"));
  const RunResult probed = RunOrFail(
      {KwatchPath(), "probe", "-q", "tick i", "--", TargetPath("sigtraps"), "--bare-icebp"});
  EXPECT_EQ(probed.exit_code, dropped ? 0 : 128 + SIGTRAP) << probed.err;
}

TEST(Sigtrap, WatchedTargetGetsEveryLegitimateTrap) {
  const RunResult r = RunOrFail(
      {KwatchPath(), "--json", "-q", "--write", "g_counter", "--", TargetPath("sigtraps"), "5"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const Output o = Split(r.out);
  EXPECT_EQ(o.target_lines, std::vector<std::string>{FiveRounds()});
  ASSERT_FALSE(o.summary.is_null()) << r.err;
  EXPECT_EQ(o.summary["events"], 5);
  EXPECT_EQ(o.summary["spurious_traps"], 0);
}

TEST(Sigtrap, WatchedTargetSurvivesTrapsNothingExplains) {
  const RunResult r = RunOrFail({KwatchPath(), "--json", "-q", "--write", "g_counter", "--",
                                 TargetPath("sigtraps"), "5", "--forge", "7"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const Output o = Split(r.out);
  EXPECT_EQ(o.target_lines,
            (std::vector<std::string>{FiveRounds(), "survived 7 forged debug traps"}));
  ASSERT_FALSE(o.summary.is_null()) << r.err;
  EXPECT_EQ(o.summary["spurious_traps"], 7);
  EXPECT_EQ(o.summary["events"], 5 + 7);  // five ticks, then one after each forged trap

  const RunResult text = RunOrFail({KwatchPath(), "-q", "--write", "g_counter", "--",
                                    TargetPath("sigtraps"), "1", "--forge", "3"});
  EXPECT_EQ(text.exit_code, 0) << text.err;
  EXPECT_THAT(text.out, HasSubstr("3 spurious debug traps absorbed"));
}

TEST(Sigtrap, ProbedTargetGetsEveryLegitimateTrapAndSurvivesForgedOnes) {
  // The ptrace backend absorbs forged debug traps as it absorbs the spurious ones it may cause
  // itself; the agent uses no debug register and passes every SIGTRAP that is not its own
  // INT3 on to the program, as without kwatch.
  const RunResult r = RunOrFail({KwatchPath(), "probe", "--backend", "ptrace", "--json", "-q",
                                 "tick i", "--", TargetPath("sigtraps"), "5", "--forge", "2"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const Output o = Split(r.out);
  EXPECT_EQ(o.target_lines,
            (std::vector<std::string>{FiveRounds(), "survived 2 forged debug traps"}));
  ASSERT_FALSE(o.summary.is_null()) << r.err;
  EXPECT_EQ(o.summary["hits"], 5 + 2);
  EXPECT_THAT(o.summary.dump(), HasSubstr("absorbed 2 spurious debug traps"));
}

}  // namespace
}  // namespace kwatch
