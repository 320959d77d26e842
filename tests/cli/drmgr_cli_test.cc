// drmgr as the user meets it through `kwatch`: structures split over debug registers, watches
// beyond four sent to page protection (with exact counts), multiplexed, refused, and debug
// registers held outside kwatch learned from the kernel. Hardware traps are not delivered
// on every machine: the decisions are checked everywhere, hardware hit counts only where
// traps arrive (KW_REQUIRE_DEBUG_TRAPS, last in each test).
#include <signal.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "tests/cli/cli_test_util.h"
#include "tests/test_util.h"
#include "tests/watch/debug_traps.h"

namespace {

using ::kwatch::clitest::JsonRun;
using ::kwatch::clitest::ParseJsonLines;
using ::kwatch::clitest::ReadTruth;
using ::kwatch::clitest::RunKwatch;
using ::kwatch::clitest::TruthFile;
using ::kwatch::testing::KwatchPath;
using ::kwatch::testing::RunResult;
using ::kwatch::testing::TargetPath;
using ::testing::HasSubstr;
using json = nlohmann::json;

uint64_t Hex(const json& j) {
  return std::stoull(j.get<std::string>(), nullptr, 16);
}

const json& WatchNamed(const JsonRun& run, const std::string& display) {
  for (const json& w : run.summary["watches"]) {
    if (w["display"] == display) {
      return w;
    }
  }
  static const json kNone;
  ADD_FAILURE() << "no watch " << display << " in " << run.summary.dump();
  return kNone;
}

long Sum(const std::map<int, kwatch::clitest::Truth>& truth, long kwatch::clitest::Truth::*f) {
  long n = 0;
  for (const auto& [tid, t] : truth) {
    n += t.*f;
  }
  return n;
}

TEST(DrmgrCli, AStructLargerThanOneRegisterIsSplitIntoExactChunks) {
  // g_stats is 32 bytes: four exact 8-byte chunks, DR0-DR3.
  const std::string truth_path = TruthFile("drmgr-split");
  const RunResult r = RunKwatch({"--backend", "perf", "--json", "-q", "--write", "g_stats", "--",
                                 TargetPath("field_writer"), "2", "1000", "--truth", truth_path});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("watch #1 g_stats: debug registers DR0+DR1+DR2+DR3"));
  const JsonRun run = ParseJsonLines(r.out);
  const json& w = WatchNamed(run, "g_stats");
  ASSERT_EQ(w["len"], 32);
  EXPECT_EQ(w["backend"], "perf");
  EXPECT_EQ(w["multiplexed"], false);
  EXPECT_EQ(w["exact_cover"], true);
  const uint64_t base = Hex(w["addr"]);
  ASSERT_EQ(w["slots"].size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(w["slots"][i]["dr"], i);
    EXPECT_EQ(Hex(w["slots"][i]["addr"]), base + 8 * static_cast<uint64_t>(i));
    EXPECT_EQ(w["slots"][i]["len"], 8);
  }
  EXPECT_EQ(run.summary["external_slots"], 0);
  KW_REQUIRE_DEBUG_TRAPS();
  const auto truth = ReadTruth(truth_path);
  EXPECT_EQ(w["events"], Sum(truth, &kwatch::clitest::Truth::hits_w) +
                             Sum(truth, &kwatch::clitest::Truth::misses_w));
}

TEST(DrmgrCli, WatchesBeyondFourRegistersGoToPagesWithExactCounts) {
  // hits, misses, flags and inner take one register each; tag (8 bytes at an odd offset)
  // needs three and g_sink one more: both are watched with page protection.
  const std::string truth_path = TruthFile("drmgr-pages");
  const RunResult r =
      RunKwatch({"--backend", "perf", "--overcommit", "pages", "--json", "-q", "--write",
                 "g_stats.hits", "g_stats.misses", "g_stats.flags", "g_stats.tag", "g_stats.inner",
                 "g_sink", "--", TargetPath("field_writer"), "2", "1000", "--truth", truth_path});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("perf breakpoint stream mode (2 with page protection)"));
  const JsonRun run = ParseJsonLines(r.out);
  const auto truth = ReadTruth(truth_path);
  ASSERT_EQ(truth.size(), 2u);
  int dr = 0;
  for (const char* name : {"g_stats.hits", "g_stats.misses", "g_stats.flags", "g_stats.inner"}) {
    const json& w = WatchNamed(run, name);
    EXPECT_EQ(w["backend"], "perf") << name;
    ASSERT_EQ(w["slots"].size(), 1u) << name;
    EXPECT_EQ(w["slots"][0]["dr"], dr++) << name;
  }
  const json& tag = WatchNamed(run, "g_stats.tag");
  EXPECT_EQ(tag["backend"], "page");
  EXPECT_THAT(tag["placement"].get<std::string>(), HasSubstr("need 3 slots, 1 free"));
  EXPECT_EQ(tag["events"], 0);  // nobody writes the tag
  const json& sink = WatchNamed(run, "g_sink");
  EXPECT_EQ(sink["backend"], "page");
  EXPECT_THAT(sink["placement"].get<std::string>(),
              HasSubstr("held by watch #1 g_stats.hits, watch #2 g_stats.misses"));
  // Each worker adds g_stats.flags to g_sink once per flags read.
  EXPECT_EQ(sink["writes"], Sum(truth, &kwatch::clitest::Truth::flags_r));
  EXPECT_EQ(sink["reads"], 0);
}

TEST(DrmgrCli, OvercommitFailRefusesWhatDoesNotFitAndSaysWhy) {
  const RunResult r = RunKwatch({"--backend", "perf", "--overcommit", "fail", "--write",
                                 "g_stats.hits", "g_stats.misses", "g_stats.flags", "g_stats.inner",
                                 "g_sink", "--", TargetPath("field_writer"), "1", "10"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("'g_sink' (8 bytes at 0x"));
  EXPECT_THAT(r.err, HasSubstr("--overcommit=pages watches what does not fit"));
  EXPECT_EQ(r.out, "");  // the target never ran
}

// --backend perf asks for debug registers: a structure they cannot hold is refused, with the
// flags that allow pages or multiplexing, instead of silently going to page protection.
TEST(DrmgrCli, AnExplicitHardwareBackendRefusesWhatDoesNotFitWithoutOvercommit) {
  for (const char* backend : {"perf", "stop"}) {
    const RunResult r =
        RunKwatch({"--backend", backend, "-q", "--rw", "g_matrix", "--", TargetPath("layouts")});
    EXPECT_EQ(r.exit_code, 1) << backend;
    EXPECT_THAT(r.err, HasSubstr("'g_matrix' (48 bytes at 0x")) << backend;
    EXPECT_THAT(r.err, HasSubstr(absl::StrCat("--backend ", backend,
                                              " asks for debug registers only: add "
                                              "--overcommit=pages to watch what does not fit "
                                              "with page protection (exact, slower), or "
                                              "--overcommit=multiplex to rotate the watches "
                                              "through the registers")))
        << r.err;
    EXPECT_EQ(r.out, "") << backend;  // the target never ran
  }
}

TEST(DrmgrCli, A48ByteStructureGoesToPagesWholeAndIsCountedPerField) {
  // g_matrix (int[3][4]) is 48 bytes: more than four registers hold, so with
  // --overcommit=pages the whole of it is watched with page protection.
  const RunResult r = RunKwatch({"--backend", "perf", "--overcommit", "pages", "--json", "-q",
                                 "--rw", "g_matrix", "--", TargetPath("layouts")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const JsonRun run = ParseJsonLines(r.out);
  const json& w = WatchNamed(run, "g_matrix");
  EXPECT_EQ(w["len"], 48);
  EXPECT_EQ(w["backend"], "page");
  EXPECT_THAT(w["placement"].get<std::string>(), HasSubstr("48 bytes"));
  EXPECT_THAT(w["placement"].get<std::string>(), HasSubstr("need 6 slots"));
  // layouts.c stores g_matrix[2][3] once and never reads it.
  EXPECT_EQ(w["writes"], 1);
  EXPECT_EQ(w["reads"], 0);
  ASSERT_EQ(w["fields"].size(), 1u) << w.dump();
  EXPECT_EQ(w["fields"][0]["field"], "g_matrix[2][3]");
}

TEST(DrmgrCli, MultiplexedWatchesTakeTurnsAndTheirCoverageAddsUp) {
  const RunResult r = RunKwatch({"--backend",
                                 "perf",
                                 "--overcommit",
                                 "multiplex",
                                 "--mux-interval",
                                 "5",
                                 "--json",
                                 "-q",
                                 "-d",
                                 "1",
                                 "--kill-on-exit",
                                 "--write",
                                 "g_stats.hits",
                                 "g_stats.misses",
                                 "g_stats.flags",
                                 "g_stats.inner",
                                 "g_sink",
                                 "g_stats.tag",
                                 "--",
                                 TargetPath("field_writer"),
                                 "2",
                                 "4000000000"});
  const JsonRun run = ParseJsonLines(r.out);
  ASSERT_EQ(run.summary["watches"].size(), 6u) << r.err;
  double total = 0;
  for (const json& w : run.summary["watches"]) {
    EXPECT_EQ(w["multiplexed"], true) << w.dump();
    EXPECT_EQ(w["backend"], "perf") << w.dump();
    const double c = w["coverage"].get<double>();
    EXPECT_GT(c, 0.05) << w["display"] << " never had its turn";
    EXPECT_LT(c, 0.95) << w["display"] << " never gave its turn away";
    total += c;
  }
  // Six watches share four registers (g_stats.tag needs two or three): the registers are
  // kept busy, and never hold more than four watches at once.
  EXPECT_LE(total, 4.0 + 1e-6);
  EXPECT_GE(total, 2.0);
  EXPECT_THAT(r.err, HasSubstr("taking turns with watches"));
}

TEST(DrmgrCli, RegistersHeldOutsideKwatchAreLearnedFromTheKernel) {
  const std::string truth_path = TruthFile("drmgr-external");
  auto target = kwatch::testing::Spawned::Start(
      {TargetPath("field_writer"), "2", "1000", "--wait", "--truth", truth_path});
  ASSERT_TRUE(target.ok());
  ASSERT_TRUE((*target)->WaitForStdout("ready").ok());
  const pid_t pid = (*target)->pid();
  // Another tool holds two of the main thread's four registers.
  kwatch::core::UniqueFd a = kwatch::testing::HoldBreakpointSlot(pid, 0x10000);
  kwatch::core::UniqueFd b = kwatch::testing::HoldBreakpointSlot(pid, 0x10008);
  ASSERT_TRUE(a && b);
  auto k = kwatch::testing::Spawned::Start(
      {KwatchPath(), "--backend", "perf", "--overcommit", "pages", "--json", "-q", "--write",
       "g_sink", "g_stats.misses", "g_stats.hits", "g_stats.inner", "-p", absl::StrCat(pid)});
  ASSERT_TRUE(k.ok());
  ASSERT_TRUE((*k)->WaitForStderr("armed").ok()) << (*k)->err();
  ASSERT_EQ(kill(pid, SIGUSR1), 0);
  auto r = (*k)->Finish();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->exit_code, 0) << r->err;
  ASSERT_TRUE((*target)->Finish().ok());
  EXPECT_THAT(r->err, HasSubstr("2 debug registers of pid " + std::to_string(pid) +
                                " are held outside kwatch"));
  const JsonRun run = ParseJsonLines(r->out);
  EXPECT_EQ(run.summary["external_slots"], 2);
  const auto truth = ReadTruth(truth_path);
  ASSERT_EQ(truth.size(), 2u);
  EXPECT_EQ(WatchNamed(run, "g_sink")["backend"], "perf");
  EXPECT_EQ(WatchNamed(run, "g_stats.misses")["backend"], "perf");
  // The last two lost the registers the kernel refused: pages, exact.
  const json& hits = WatchNamed(run, "g_stats.hits");
  EXPECT_EQ(hits["backend"], "page");
  EXPECT_EQ(hits["writes"], Sum(truth, &kwatch::clitest::Truth::hits_w));
  const json& inner = WatchNamed(run, "g_stats.inner");
  EXPECT_EQ(inner["backend"], "page");
  EXPECT_EQ(inner["writes"], 0);
}

TEST(DrmgrCli, KwatchSlotsShowsTheDecisionsOfALiveSession) {
  auto target = kwatch::testing::Spawned::Start(
      {TargetPath("field_writer"), "1", "10", "--wait", "--truth", TruthFile("drmgr-live")});
  ASSERT_TRUE(target.ok());
  ASSERT_TRUE((*target)->WaitForStdout("ready").ok());
  const std::string pid = std::to_string((*target)->pid());
  auto k = kwatch::testing::Spawned::Start({KwatchPath(), "--backend", "perf", "--overcommit",
                                            "pages", "--write", "g_stats.hits", "g_stats.tag",
                                            "g_sink", "g_stats.inner", "-p", pid});
  ASSERT_TRUE(k.ok());
  ASSERT_TRUE((*k)->WaitForStderr("armed").ok()) << (*k)->err();
  const RunResult r = RunKwatch({"slots", "-p", pid, "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json j = json::parse(r.out);
  ASSERT_EQ(j["processes"].size(), 1u) << r.out;
  const json& p = j["processes"][0];
  ASSERT_EQ(p["sessions"].size(), 1u) << r.out;
  EXPECT_EQ(p["sessions"][0]["kwatch_pid"], (*k)->pid());
  ASSERT_EQ(p["threads"].size(), 1u);
  const json& t = p["threads"][0];
  EXPECT_EQ(t["kwatch"], 4);
  EXPECT_EQ(t["external"], 0);
  EXPECT_EQ(t["free"], 0);
  // g_stats.hits in one register, g_stats.tag (8 bytes at offset 14) split 2 + 4 + 2.
  const std::pair<const char*, int> want[] = {
      {"g_stats.hits", 8}, {"g_stats.tag", 2}, {"g_stats.tag", 4}, {"g_stats.tag", 2}};
  ASSERT_EQ(t["slots"].size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(t["slots"][i]["labels"], json::array({want[i].first})) << t["slots"][i].dump();
    EXPECT_EQ(t["slots"][i]["len"], want[i].second);
    EXPECT_EQ(t["slots"][i]["state"], "armed");
  }
  ASSERT_EQ(p["not_in_hardware"].size(), 2u);
  EXPECT_EQ(p["not_in_hardware"][0]["label"], "g_sink");
  EXPECT_EQ(p["not_in_hardware"][0]["state"], "pages");
  EXPECT_EQ(p["not_in_hardware"][1]["label"], "g_stats.inner");
  // The session ends: its registers are free again and it is no longer listed.
  ASSERT_EQ(kill((*k)->pid(), SIGINT), 0);
  ASSERT_TRUE((*k)->Finish().ok());
  const RunResult after = RunKwatch({"slots", "-p", pid, "--json"});
  ASSERT_EQ(after.exit_code, 0) << after.err;
  const json ja = json::parse(after.out);
  EXPECT_EQ(ja["processes"][0]["sessions"].size(), 0u) << after.out;
  EXPECT_EQ(ja["processes"][0]["threads"][0]["free"], 4) << after.out;
  ASSERT_EQ(kill((*target)->pid(), SIGUSR1), 0);
  ASSERT_TRUE((*target)->Finish().ok());
}

}  // namespace
