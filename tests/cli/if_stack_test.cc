// `kwatch --if EXPR` and `kwatch --stack` end to end, in page mode (exact values, the thread
// stopped at the access), against field_writer's own ground truth.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/cli/cli_test_util.h"
#include "tests/test_util.h"

namespace {

using ::kwatch::clitest::JsonRun;
using ::kwatch::clitest::ParseJsonLines;
using ::kwatch::clitest::ReadTruth;
using ::kwatch::clitest::RunKwatch;
using ::kwatch::clitest::SourceLine;
using ::kwatch::clitest::TruthFile;
using ::kwatch::testing::RunResult;
using ::kwatch::testing::TargetPath;
using ::testing::HasSubstr;
using json = nlohmann::json;

TEST(KwatchIf, ReportsOnlyTheAccessesForWhichTheConditionHolds) {
  // Each worker stores g_stats.hits = i for i in 0..299: the values 100 and 200 match.
  const std::string truth_path = TruthFile("if");
  const RunResult r = RunKwatch({"--backend", "page", "--json", "--if", "new % 100 == 0 && new > 0",
                                 "--write", "g_stats.hits", "--", TargetPath("field_writer"), "2",
                                 "300", "--truth", truth_path});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto truth = ReadTruth(truth_path);
  ASSERT_EQ(truth.size(), 2u);
  const JsonRun run = ParseJsonLines(r.out);
  ASSERT_EQ(run.events.size(), 4u);
  std::map<int, std::vector<long>> values;
  for (const json& e : run.events) {
    values[e["tid"].get<int>()].push_back(e["value"].get<long>());
  }
  for (const auto& [tid, t] : truth) {
    EXPECT_THAT(values[tid], ::testing::ElementsAre(100, 200)) << "tid " << tid;
  }
  EXPECT_EQ(run.summary["events"], 4);
  EXPECT_EQ(run.summary["if"]["text"], "new % 100 == 0 && new > 0");
  EXPECT_EQ(run.summary["if"]["evaluated"], 600);
  EXPECT_EQ(run.summary["if"]["matched"], 4);
  EXPECT_EQ(run.summary["if"]["undefined"], 0);
}

TEST(KwatchIf, ComparesOldAndNewValues) {
  const std::string truth_path = TruthFile("if-old");
  const RunResult r = RunKwatch({"--backend", "page", "--json", "--if", "new - old == 2", "--write",
                                 "g_stats.misses", "--", TargetPath("field_writer"), "1", "10",
                                 "--truth", truth_path});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // One worker stores misses = i for even i: 0, 2, 4, 6, 8 (the first over a 0); each
  // store after the first adds 2.
  const JsonRun run = ParseJsonLines(r.out);
  ASSERT_EQ(run.events.size(), 4u);
  for (const json& e : run.events) {
    EXPECT_EQ(e["value"].get<long>() - e["old_value"].get<long>(), 2);
  }
  EXPECT_EQ(run.summary["if"]["evaluated"], 5);
}

// layouts stores g_stats.mode = argc & 7 and g_stats.ready = 1 in one byte store (mode : 3
// then ready : 1): the byte goes 0 -> (argc & 7) | 8. A watch on the bitfield shows and tests
// the bitfield's own value, in text, JSON and --if, never the storage byte.
TEST(KwatchIf, ABitfieldIsDecodedInLinesJsonAndConditions) {
  const RunResult text = RunKwatch({"--backend", "page", "--write", "g_stats.mode", "--",
                                    TargetPath("layouts"), "a", "b", "c", "d", "e"});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_THAT(
      text.out,
      ::testing::ContainsRegex(
          "w +g_stats\\.mode +0 -> 6 +Touch inlined in main\\+0x[0-9a-f]+ \\(layouts\\.c:"));
  const RunResult j = RunKwatch({"--backend", "page", "--json", "--write", "g_stats.mode", "--",
                                 TargetPath("layouts"), "a", "b", "c", "d", "e"});
  ASSERT_EQ(j.exit_code, 0) << j.err;
  const JsonRun run = ParseJsonLines(j.out);
  ASSERT_EQ(run.events.size(), 1u) << j.out;
  EXPECT_EQ(run.events[0]["value"], 6);
  EXPECT_EQ(run.events[0]["old_value"], 0);
  EXPECT_EQ(run.events[0]["access_size"], 1);  // the store itself is still a byte
  for (const auto& [cond, events] : std::vector<std::pair<std::string, int>>{
           {"new == 6", 1}, {"new == 14", 0}, {"old == 0 && new > old", 1}}) {
    const RunResult c =
        RunKwatch({"--backend", "page", "--json", "-q", "--if", cond, "--write", "g_stats.mode",
                   "--", TargetPath("layouts"), "a", "b", "c", "d", "e"});
    ASSERT_EQ(c.exit_code, 0) << c.err;
    EXPECT_EQ(ParseJsonLines(c.out).summary["events"], events) << cond;
  }
  // With no arguments, mode = 1: the byte is 9.
  const RunResult one = RunKwatch(
      {"--backend", "page", "--json", "--write", "g_stats.mode", "--", TargetPath("layouts")});
  ASSERT_EQ(one.exit_code, 0) << one.err;
  const JsonRun run1 = ParseJsonLines(one.out);
  ASSERT_EQ(run1.events.size(), 1u) << one.out;
  EXPECT_EQ(run1.events[0]["value"], 1);
}

TEST(KwatchIf, ASyntaxErrorSaysWhereAndIsAUsageError) {
  const RunResult r = RunKwatch(
      {"--if", "new >> ", "--write", "g_stats.hits", "--", TargetPath("field_writer"), "1", "1"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--if 'new >> ': expected an operand at column 8"));
  EXPECT_EQ(r.out, "");  // the target never ran
}

TEST(KwatchIf, StreamModeRefusesAConditionOnValues) {
  const RunResult r = RunKwatch({"--backend", "perf", "--if", "new > 1", "--write", "g_stats.hits",
                                 "--", TargetPath("field_writer"), "1", "1"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("use --stop (debug registers through ptrace) or --backend page"));
}

TEST(KwatchStack, EachAccessCarriesItsBacktrace) {
  const std::string truth_path = TruthFile("stack");
  const RunResult r =
      RunKwatch({"--backend", "page", "--json", "--stack", "--write", "g_stats.hits", "--",
                 TargetPath("field_writer"), "2", "50", "--truth", truth_path});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const JsonRun run = ParseJsonLines(r.out);
  ASSERT_EQ(run.events.size(), 100u);
  const int line = SourceLine("    g_stats.hits = i;");
  for (const json& e : run.events) {
    ASSERT_TRUE(e.contains("stack")) << e.dump();
    const json& st = e["stack"];
    ASSERT_GE(st.size(), 2u) << e.dump();
    // Frame 0 is the storing instruction itself, then the thread's start in libc.
    EXPECT_EQ(st[0]["function"], "Work");
    EXPECT_EQ(st[0]["line"], line);
    EXPECT_EQ(st[0]["ip"], e["ip"]);
    EXPECT_EQ(st[1]["function"], "start_thread") << e.dump();
  }
}

TEST(KwatchStack, TextOutputPrintsOneLinePerFrame) {
  const RunResult r = RunKwatch({"--backend", "page", "--stack", "--stack-depth", "2", "--count",
                                 "1", "--write", "g_stats.hits", "--", TargetPath("field_writer"),
                                 "1", "5", "--truth", TruthFile("stack-text")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("\n    #0  Work+"));
  EXPECT_THAT(r.out, HasSubstr("\n    #1  start_thread+"));
  EXPECT_THAT(r.out, ::testing::Not(HasSubstr("\n    #2 ")));
}

TEST(KwatchStack, StreamModeRefusesIt) {
  const RunResult r = RunKwatch({"--backend", "perf", "--stack", "--write", "g_stats.hits", "--",
                                 TargetPath("field_writer"), "1", "1"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("--stack needs the accessing thread stopped at the access"));
}

}  // namespace
