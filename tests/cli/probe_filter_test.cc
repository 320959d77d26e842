// End-to-end tests of what decides which probe hits are taken: `if COND` at the end of a spec,
// --skip and -c EVENT:N, on every backend, against tests/targets/probe_args.c, whose calls
// and arguments are known (see its header).

#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "tests/cli/probe_test_util.h"
#include "tests/test_util.h"

namespace kwatch {
namespace {

using ::kwatch::testing::json;
using ::kwatch::testing::JsonRun;
using ::kwatch::testing::KwatchProbe;
using ::kwatch::testing::OfEvent;
using ::kwatch::testing::ParseJson;
using ::kwatch::testing::PrivateTargetPath;
using ::kwatch::testing::RunResult;
using ::kwatch::testing::Spawned;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<long> ArgValues(const std::vector<json>& hits, const std::string& arg) {
  std::vector<long> out;
  for (const json& h : hits) {
    out.push_back(h["args"].at(arg).get<long>());
  }
  return out;
}

const json& ProbeSummary(const JsonRun& run, const std::string& event) {
  for (const json& p : run.summary["probes"]) {
    if (p["event"] == event) {
      return p;
    }
  }
  static const json kNone;
  ADD_FAILURE() << "no probe " << event << " in " << run.summary.dump();
  return kNone;
}

class ProbeConditions : public ::testing::TestWithParam<std::string> {};

// add_ints(i, 10 * i) for i = 0..4; fact(5) recurses with n = 5..1 and returns 1, 2, 6, 24,
// 120 (innermost first); name_len is called once with ("hello probe", 64).
TEST_P(ProbeConditions, FilterExactlyOnEachBackend) {
  const RunResult r =
      KwatchProbe({"--json", "--backend", GetParam(), "add_ints a b if b >= 20 && a != 3",
                   "fact n if n % 2 == 1", "fact%return $retval if $retval > 2",
                   "name_len if comm == \"probe_args\" && limit == 64", "sum_item if p->id == 202",
                   "--", PrivateTargetPath("probe_args")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const JsonRun run = ParseJson(r.out);
  EXPECT_THAT(ArgValues(OfEvent(run.hits, "add_ints"), "a"), ElementsAre(2, 4));
  EXPECT_THAT(ArgValues(OfEvent(run.hits, "add_ints"), "b"), ElementsAre(20, 40));
  EXPECT_THAT(ArgValues(OfEvent(run.hits, "fact"), "n"), ElementsAre(5, 3, 1));
  EXPECT_THAT(ArgValues(OfEvent(run.hits, "fact__return"), "arg1"), ElementsAre(6, 24, 120));
  ASSERT_EQ(OfEvent(run.hits, "name_len").size(), 1U);
  // A name the spec does not list is fetched for the condition only: not shown.
  EXPECT_TRUE(OfEvent(run.hits, "name_len")[0]["args"].empty());
  // The uprobe backend samples registers and the stack only: g_items' ids are not read (no
  // value: not matched), the third call's item is on the stack (303: not matched).
  const bool uprobe = GetParam() == "uprobe";
  ASSERT_EQ(OfEvent(run.hits, "sum_item").size(), uprobe ? 0U : 1U);
  if (!uprobe) {
    EXPECT_TRUE(OfEvent(run.hits, "sum_item")[0]["args"].empty());
  }

  struct Expected {
    std::string event;
    std::string condition;
    int seen;
    int matched;
    int no_value = 0;
    // With the agent, where the condition is tested: in the target unless it compares strings.
    std::string in_agent = "target";
  };
  const bool agent = GetParam() == "agent";
  for (const Expected& e : std::vector<Expected>{
           {"add_ints", "b >= 20 && a != 3", 5, 2},
           {"fact", "n % 2 == 1", 5, 3},
           {"fact__return", "$retval > 2", 5, 3},
           {"name_len", "comm == \"probe_args\" && limit == 64", 1, 1, 0, "kwatch"},
           {"sum_item", "p->id == 202", 3, uprobe ? 0 : 1, uprobe ? 2 : 0},
       }) {
    const json& p = ProbeSummary(run, e.event);
    EXPECT_EQ(p["condition"], e.condition) << e.event;
    EXPECT_EQ(p["seen"], e.seen) << e.event;
    EXPECT_EQ(p["matched"], e.matched) << e.event;
    EXPECT_EQ(p["no_value"], e.no_value) << e.event;
    EXPECT_EQ(p["condition_in"], agent ? e.in_agent : "kwatch") << e.event;
  }
}

// With the agent, a condition is tested in the target before the hit's record is written: four
// threads calling tick() flat out fill their rings, yet every hit is tested and counted, and
// the hits that match are all delivered when few match. uprobe_loop: thread k calls tick(i, r)
// for i = 0..N-1 with r->len == 100 + k.
TEST(ProbeFilter, TheAgentTestsEveryHitInTheTarget) {
  const RunResult r = KwatchProbe({"--json", "--backend", "agent", "tick i if i % 1000 == 7",
                                   "t2=tick r->len if r->len == 102 && i < 5", "--",
                                   PrivateTargetPath("uprobe_loop"), "200000", "--threads", "4"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const JsonRun run = ParseJson(r.out);
  const json& tick = ProbeSummary(run, "tick");
  EXPECT_EQ(tick["condition_in"], "target");
  EXPECT_EQ(tick["seen"], 800000);
  EXPECT_EQ(tick["matched"], 800);
  EXPECT_EQ(tick["hits"], 800);
  EXPECT_EQ(tick["lost"], 0);
  const std::vector<long> is = ArgValues(OfEvent(run.hits, "tick"), "i");
  ASSERT_EQ(is.size(), 800U);
  EXPECT_TRUE(std::all_of(is.begin(), is.end(), [](long i) { return i % 1000 == 7; }));
  const json& t2 = ProbeSummary(run, "t2");
  EXPECT_EQ(t2["seen"], 800000);
  EXPECT_EQ(t2["matched"], 5);
  EXPECT_THAT(ArgValues(OfEvent(run.hits, "t2"), "r->len"), ElementsAre(102, 102, 102, 102, 102));

  // The text summary says where it was tested; a string comparison stays in kwatch, saying why.
  const RunResult text =
      KwatchProbe({"-q", "--backend", "agent", "tick i if i < 0", "name=tick if comm == \"nobody\"",
                   "--", PrivateTargetPath("uprobe_loop"), "1000"});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_THAT(text.out, HasSubstr("    if i < 0: 0 of 1000 hits matched (tested in the target)\n"));
  EXPECT_THAT(text.out, HasSubstr("    if comm == \"nobody\": 0 of 1000 hits matched (tested in "
                                  "kwatch: it compares strings)\n"));
}

INSTANTIATE_TEST_SUITE_P(Backends, ProbeConditions, ::testing::Values("agent", "ptrace", "uprobe"));

TEST(ProbeFilter, TextSummaryCountsSeenAndMatched) {
  const RunResult r = KwatchProbe({"-q", "--backend", "ptrace", "add_ints a if a < 0 || b == 30",
                                   "--", PrivateTargetPath("probe_args")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("    if a < 0 || b == 30: 1 of 5 hits matched\n"));
  EXPECT_THAT(r.out, HasSubstr("    a                1 distinct: 3 (1)\n"));
}

TEST(ProbeFilter, SkipAndPerProbeCountsTakeExactlyTheirHits) {
  const RunResult r =
      KwatchProbe({"--json", "--skip", "add_ints:1", "-c", "add_ints:2", "--skip", "1",
                   "add_ints a", "fact n", "--", PrivateTargetPath("probe_args")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const JsonRun run = ParseJson(r.out);
  // add_ints: the first hit skipped, the next two taken, the last two over the count.
  EXPECT_THAT(ArgValues(OfEvent(run.hits, "add_ints"), "a"), ElementsAre(1, 2));
  // fact: --skip 1 applies to every probe without its own.
  EXPECT_THAT(ArgValues(OfEvent(run.hits, "fact"), "n"), ElementsAre(4, 3, 2, 1));
  const json& add = ProbeSummary(run, "add_ints");
  EXPECT_EQ(add["skipped"], 1);
  EXPECT_EQ(add["over_count"], 2);
  EXPECT_EQ(ProbeSummary(run, "fact")["skipped"], 1);
  EXPECT_EQ(run.summary["stop_reason"], "target exited");
}

TEST(ProbeFilter, EveryProbeAtItsCountEndsTheSession) {
  const RunResult r = KwatchProbe({"--json", "-c", "add_ints:2", "-c", "fact:1", "add_ints a",
                                   "fact n", "--", PrivateTargetPath("probe_args")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const JsonRun run = ParseJson(r.out);
  EXPECT_THAT(ArgValues(OfEvent(run.hits, "add_ints"), "a"), ElementsAre(0, 1));
  EXPECT_THAT(ArgValues(OfEvent(run.hits, "fact"), "n"), ElementsAre(5));
  EXPECT_EQ(run.summary["stop_reason"], "every probe reached its -c count");
}

TEST(ProbeFilter, BadConditionsArePointedAtBeforeAnythingRuns) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::string target = PrivateTargetPath("probe_args");
  for (const Case& c : std::vector<Case>{
           {{"add_ints a if a >> "},
            "probe 'add_ints a if a >> ': expected an operand at column 19\n"
            "  add_ints a if a >> \n"
            "                    ^"},
           {{"add_ints a if zz > 1"},
            "'zz' in the condition is not an argument of the probe and cannot be fetched at "
            "add_ints: no variable 'zz' at add_ints (available: a, b)\n"
            "  add_ints a if zz > 1\n"
            "                ^~"},
           {{"scale x if x > 1"},
            "probe 'scale x if x > 1': 'x' is a floating-point value: conditions compare "
            "integers and strings"},
           {{"add_ints if comm > 2"},
            "'comm' is a string: compare it with == or != to a \"literal\" at column 13"},
           {{"add_ints a if"}, "'if' without a condition"},
           {{"add_ints if $retval > 0"},
            "'$retval' in the condition is not an argument of the probe"},
           {{"-c", "nosuch:2", "add_ints"},
            "-c nosuch:2: no probe is named 'nosuch' (events: add_ints)"},
           {{"--skip", "x:y", "add_ints"}, "--skip 'x:y': expected N or EVENT:N"},
       }) {
    std::vector<std::string> args = c.args;
    args.insert(args.end(), {"--", target});
    const RunResult r = KwatchProbe(args);
    EXPECT_NE(r.exit_code, 0) << c.args[0];
    EXPECT_THAT(r.err, HasSubstr(c.message)) << c.args[0];
    EXPECT_THAT(r.err, ::testing::Not(HasSubstr("armed"))) << c.args[0];
  }
}

// The aggregations of one event and agg, by their key's JSON text ("null" without a key).
std::map<std::string, json> Aggregates(const JsonRun& run, const std::string& event,
                                       const std::string& agg) {
  std::map<std::string, json> out;
  for (const json& a : run.aggregates) {
    if (a["event"] == event && a["agg"] == agg) {
      std::string key = a["key"].dump();
      if (a.contains("low")) {
        key += " " + a["low"].dump();
      }
      out[key] = a;
    }
  }
  return out;
}

class ProbeAggregations : public ::testing::TestWithParam<std::string> {};

// uprobe_loop with 4 threads: each calls tick(i, r) for i = 0..999, r->len = 100 + its index
// (few enough that the agent's per-thread rings hold every record of both probes).
TEST_P(ProbeAggregations, ExactPerKeyAndPerBucket) {
  const RunResult r = KwatchProbe({"--json",    "-q",
                                   "--backend", GetParam(),
                                   "--agg",     "count() by tid",
                                   "--agg",     "sum(i) by r->len",
                                   "--agg",     "hist(i)",
                                   "--agg",     "lhist(i, 0, 1000, 250)",
                                   "--agg",     "min(i)",
                                   "--agg",     "max(i)",
                                   "--agg",     "avg(i)",
                                   "--agg",     "even:count() by comm",
                                   "tick i",    "even=tick if i % 2 == 0",
                                   "--",        PrivateTargetPath("uprobe_loop"),
                                   "1000",      "--threads",
                                   "4"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const JsonRun run = ParseJson(r.out);
  EXPECT_TRUE(run.hits.empty());  // -q

  const std::map<std::string, json> by_tid = Aggregates(run, "tick", "count() by tid");
  ASSERT_EQ(by_tid.size(), 4U) << r.out;
  for (const auto& [key, a] : by_tid) {
    EXPECT_EQ(a["value"], 1000) << key;
    EXPECT_TRUE(a["key"]["tid"].is_number()) << key;
  }
  const std::map<std::string, json> sums = Aggregates(run, "tick", "sum(i) by r->len");
  ASSERT_EQ(sums.size(), 4U);
  for (int len = 100; len < 104; ++len) {
    const std::string key = "{\"r->len\":" + std::to_string(len) + "}";
    ASSERT_EQ(sums.count(key), 1U) << key;
    EXPECT_EQ(sums.at(key)["value"], 1000 * 999 / 2) << key;
  }
  // Power-of-two buckets of i = 0..999, four times.
  const std::map<std::string, json> hist = Aggregates(run, "tick", "hist(i)");
  std::vector<std::vector<long>> rows;
  for (const auto& [key, a] : hist) {
    rows.push_back({a["low"].get<long>(), a["high"].get<long>(), a["count"].get<long>()});
  }
  std::sort(rows.begin(), rows.end());
  std::vector<std::vector<long>> expected = {{0, 1, 4}, {1, 2, 4}};
  for (long low = 2; low < 1024; low *= 2) {
    expected.push_back({low, low * 2, 4 * (std::min(low * 2, 1000L) - low)});
  }
  EXPECT_EQ(rows, expected);
  const std::map<std::string, json> lhist = Aggregates(run, "tick", "lhist(i, 0, 1000, 250)");
  ASSERT_EQ(lhist.size(), 4U);
  for (const auto& [key, a] : lhist) {
    EXPECT_EQ(a["count"], 1000) << key;
    EXPECT_EQ(a["high"].get<long>() - a["low"].get<long>(), 250) << key;
  }
  EXPECT_EQ(Aggregates(run, "tick", "min(i)").at("null")["value"], 0);
  EXPECT_EQ(Aggregates(run, "tick", "max(i)").at("null")["value"], 999);
  EXPECT_DOUBLE_EQ(Aggregates(run, "tick", "avg(i)").at("null")["value"].get<double>(), 499.5);
  // The condition comes first: only even i are counted, by the thread's name (a hidden $comm).
  const std::map<std::string, json> even = Aggregates(run, "even", "count() by comm");
  ASSERT_EQ(even.size(), 1U) << r.out;
  EXPECT_EQ(even.begin()->second["value"], 2000);
  EXPECT_EQ(even.begin()->second["key"]["comm"], "uprobe_loop");
  // The aggregate lines come before the summary, the last line.
  EXPECT_EQ(run.summary["hits"].get<int>() > 0, true);
}

INSTANTIATE_TEST_SUITE_P(Backends, ProbeAggregations, ::testing::Values("agent", "ptrace"));

// With the agent, aggregations are accumulated in the target before the records are written:
// four threads calling tick() flat out lose records in their full rings, yet every hit is in
// the aggregations. A key the target cannot compute (comm) stays in kwatch, which says what
// it missed. uprobe_loop: thread k calls tick(i, r) for i = 0..199999, r->len = 100 + k.
TEST(ProbeAggregation, TheTargetAggregatesEveryHit) {
  const RunResult r = KwatchProbe({"--json",    "-q",
                                   "--backend", "agent",
                                   "--agg",     "tick:count() by tid",
                                   "--agg",     "tick:sum(i) by r->len",
                                   "--agg",     "tick:hist(i)",
                                   "--agg",     "tick:lhist(i, 0, 200000, 50000)",
                                   "--agg",     "even:count()",
                                   "--agg",     "even:count() by comm",
                                   "tick i",    "even=tick if i % 2 == 0",
                                   "--",        PrivateTargetPath("uprobe_loop"),
                                   "200000",    "--threads",
                                   "4"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const JsonRun run = ParseJson(r.out);
  const std::map<std::string, json> by_tid = Aggregates(run, "tick", "count() by tid");
  ASSERT_EQ(by_tid.size(), 4U) << r.out;
  for (const auto& [key, a] : by_tid) {
    EXPECT_EQ(a["value"], 200000) << key;
  }
  const std::map<std::string, json> sums = Aggregates(run, "tick", "sum(i) by r->len");
  ASSERT_EQ(sums.size(), 4U);
  for (const char* len : {"100", "101", "102", "103"}) {
    const std::string key = std::string(R"({"r->len":)") + len + "}";
    ASSERT_TRUE(sums.contains(key)) << key << " in " << r.out;
    EXPECT_EQ(sums.at(key)["value"], 19999900000LL) << key;  // 0 + 1 + ... + 199999
  }
  // Power-of-two buckets: [2^(k-1), 2^k) holds 2^(k-1) values of each thread; the last one,
  // [131072, 262144), the 68928 values from 131072 to 199999.
  const std::map<std::string, json> hist = Aggregates(run, "tick", "hist(i)");
  uint64_t total = 0;
  for (const auto& [key, a] : hist) {
    total += a["count"].get<uint64_t>();
  }
  EXPECT_EQ(total, 800000U);
  EXPECT_EQ(hist.at("null 0")["count"], 4);
  EXPECT_EQ(hist.at("null 1")["count"], 4);
  EXPECT_EQ(hist.at("null 65536")["count"], 4 * 65536);
  EXPECT_EQ(hist.at("null 131072")["count"], 4 * 68928);
  const std::map<std::string, json> lhist = Aggregates(run, "tick", "lhist(i, 0, 200000, 50000)");
  for (const char* low : {"0", "50000", "100000", "150000"}) {
    EXPECT_EQ(lhist.at(std::string("null ") + low)["count"], 200000) << low;
  }
  EXPECT_EQ(Aggregates(run, "even", "count()").at("null")["value"], 400000);
  const json& even = ProbeSummary(run, "even");
  EXPECT_EQ(even["matched"], 400000);
  EXPECT_EQ(even["condition_in"], "target");
  // comm is a string: kwatch counts the records it received, and says so when some were lost.
  const std::map<std::string, json> by_comm = Aggregates(run, "even", "count() by comm");
  ASSERT_EQ(by_comm.size(), 1U);
  const uint64_t lost = even["lost"].get<uint64_t>();
  EXPECT_EQ(by_comm.begin()->second["value"].get<uint64_t>(), 400000U - lost);
  if (lost > 0) {
    EXPECT_THAT(run.summary["notes"].dump(),
                HasSubstr("even: count() by comm was aggregated by kwatch from the records it "
                          "received (not in the target: comm is a string)"));
  }
}

TEST(ProbeAggregation, TextHistogramAndInterval) {
  const RunResult r = KwatchProbe({"-q", "--agg", "fact:hist(n)", "--agg", "add_ints:sum(b)",
                                   "add_ints", "fact", "--", PrivateTargetPath("probe_args")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("\n== aggregations ==\nfact: hist(n)\n"
                               "    [1, 2)                            1 |" +
                               std::string(25, '@') + std::string(25, ' ') +
                               "|\n"
                               "    [2, 4)                            2 |" +
                               std::string(50, '@') +
                               "|\n"
                               "    [4, 8)                            2 |" +
                               std::string(50, '@') +
                               "|\n"
                               "add_ints: sum(b)\n"
                               "    -                                        100\n"));
}

TEST(ProbeAggregation, BadAggregationsArePointedAt) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::string target = PrivateTargetPath("probe_args");
  for (const Case& c : std::vector<Case>{
           {{"--agg", "hist(n", "fact"},
            "--agg 'hist(n': expected ')' at column 7\n  hist(n\n        ^"},
           {{"--agg", "median(n)", "fact"}, "unknown aggregation 'median'"},
           {{"--agg", "lhist(n, 10, 0, 1)", "fact"}, "lhist needs MIN < MAX and 0 < STEP"},
           {{"--agg", "sum(n)", "fact", "add_ints"},
            "--agg 'sum(n)': probe add_ints has no value 'n' (it has: tid, pid, cpu; give "
            "EVENT: to aggregate one probe)"},
           {{"--agg", "nosuch:count()", "fact"}, "no probe is named 'nosuch' (events: fact)"},
           {{"--agg", "count() by stack", "fact"}, "the user stack is 'ustack'"},
           {{"--interval", "1", "fact"}, "--interval prints aggregations: give --agg too"},
       }) {
    std::vector<std::string> args = c.args;
    args.insert(args.end(), {"--", target});
    const RunResult r = KwatchProbe(args);
    EXPECT_NE(r.exit_code, 0) << c.args[1];
    EXPECT_THAT(r.err, HasSubstr(c.message)) << c.args[1];
    EXPECT_THAT(r.err, ::testing::Not(HasSubstr("armed"))) << c.args[1];
  }
}

class ProbeDurations : public ::testing::TestWithParam<std::string> {};

// call_latency: nap(1), nap(20), nap(5) sleep that many ms; dive(0) recurses to 4 and
// longjmps out (five calls that never return); dive(4) then returns at once; nap(2) last.
TEST_P(ProbeDurations, TimeSinceTheEntryOfTheSameCall) {
  const RunResult r = KwatchProbe(
      {"--json", "--backend", GetParam(), "nap%return $retval $duration", "dive%return $duration",
       "long=nap%return if $duration > 10000000", "--agg", "nap__return:hist($duration)", "--agg",
       "nap__return:max($duration)", "--", PrivateTargetPath("call_latency")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const JsonRun run = ParseJson(r.out);
  const std::vector<json> naps = OfEvent(run.hits, "nap__return");
  ASSERT_EQ(naps.size(), 4U) << r.out;
  std::vector<long> ms;
  std::vector<long> ns;
  for (const json& h : naps) {
    ms.push_back(h["args"]["arg1"].get<long>());
    ns.push_back(h["args"]["$duration"].get<long>());
  }
  ASSERT_THAT(ms, ElementsAre(1, 20, 5, 2));
  // Each at least its sleep, and well under the next longer one (bounds, not exact times).
  for (size_t k = 0; k < ms.size(); ++k) {
    EXPECT_GE(ns[k], ms[k] * 1'000'000) << k;
    EXPECT_LT(ns[k], ms[k] * 1'000'000 + 200'000'000) << k;
  }
  EXPECT_LT(ns[3], ns[2]);  // 2 ms < 5 ms
  EXPECT_LT(ns[2], ns[1]);  // 5 ms < 20 ms
  // dive(4) after the longjmp pairs with its own entry, not with the five abandoned ones: it
  // returns at once, so its time is the backend's own between two hits (on the ptrace backend
  // two stops, which a loaded machine stretched past nap(1)'s 1.2 ms once: bounded by nap(20)).
  const std::vector<json> dives = OfEvent(run.hits, "dive__return");
  ASSERT_EQ(dives.size(), 1U);
  EXPECT_LT(dives[0]["args"]["$duration"].get<long>(), ns[1]);
  // The condition on $duration keeps the one call over 10 ms.
  const std::vector<json> longs = OfEvent(run.hits, "long");
  ASSERT_EQ(longs.size(), 1U);
  EXPECT_TRUE(longs[0]["args"].empty());  // $duration not listed: not shown
  const std::map<std::string, json> max = Aggregates(run, "nap__return", "max($duration)");
  ASSERT_EQ(max.size(), 1U);
  EXPECT_EQ(max.begin()->second["value"].get<long>(), ns[1]);
  long bucketed = 0;
  for (const auto& [key, a] : Aggregates(run, "nap__return", "hist($duration)")) {
    bucketed += a["count"].get<long>();
  }
  EXPECT_EQ(bucketed, 4);
  // The internal entry probes are not in the summary.
  for (const json& p : run.summary["probes"]) {
    EXPECT_THAT(p["event"].get<std::string>(), ::testing::Not(HasSubstr("__entry")));
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, ProbeDurations, ::testing::Values("agent", "ptrace", "uprobe"));

TEST(ProbeDuration, OnlyOnReturnProbes) {
  const RunResult r = KwatchProbe({"nap ms $duration", "--", PrivateTargetPath("call_latency")});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("$duration is the time of a call: it is for FUNC%return probes"));
  const RunResult c =
      KwatchProbe({"nap if $duration > 1", "--", PrivateTargetPath("call_latency")});
  EXPECT_EQ(c.exit_code, 1);
  EXPECT_THAT(c.err, HasSubstr("$duration is the time of a call"));
}

TEST(ProbeDryRun, SaysWhereEachProbeGoesAndTouchesNothing) {
  const std::string target = PrivateTargetPath("probe_args");
  const RunResult r =
      KwatchProbe({"--dry-run", "add_ints a if b > 2", "fact%return $duration", "--", target});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // The command was not run (it prints "sum=..."), nothing was armed.
  EXPECT_THAT(r.out, ::testing::Not(HasSubstr("sum=")));
  EXPECT_THAT(r.err, ::testing::Not(HasSubstr("armed")));
  EXPECT_THAT(r.out, HasSubstr("kwatch probe --dry-run: 3 probes in " + target +
                               ", agent backend (auto: the ptrace backend if the agent cannot "
                               "load); nothing was started or touched\n"));
  EXPECT_THAT(r.out, HasSubstr("\nadd_ints  add_ints (probe_args.c:48) at 0x"));
  EXPECT_THAT(r.out, HasSubstr(": int3\n    not jump: no jump at add_ints+0x0"));
  EXPECT_THAT(r.out, HasSubstr("    if b > 2  (tested in the target)\n"
                               "    a                s32     copied by the agent at the hit\n"
                               "    b                s32     copied by the agent at the hit "
                               "[not shown: for the condition or --agg]\n"));
  EXPECT_THAT(r.out, HasSubstr(": jump\n    the jmp displaces: mov $0x1, %eax\n"));
  EXPECT_THAT(r.out, HasSubstr("[internal: the entry of a return probe, for $duration]"));

  const RunResult u =
      KwatchProbe({"--dry-run", "--json", "--backend", "uprobe", "-x", target, "sum_item p->id"});
  ASSERT_EQ(u.exit_code, 0) << u.err;
  const json plan = json::parse(u.out);
  EXPECT_EQ(plan["type"], "plan");
  EXPECT_EQ(plan["event"], "sum_item");
  EXPECT_EQ(plan["path"], "uprobe");
  EXPECT_EQ(plan["args"][0]["name"], "p->id");
  EXPECT_EQ(plan["args"][0]["type"], "s64");

  const RunResult n = KwatchProbe({"--dry-run", "--no-jump", "-x", target, "fact n"});
  EXPECT_THAT(n.out, HasSubstr(": int3\n    not jump: --no-jump\n"));
  // Errors a session would give come first.
  const RunResult bad = KwatchProbe({"--dry-run", "-x", target, "fact n if m > 1"});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_THAT(bad.err, HasSubstr("'m' in the condition is not an argument"));
}

class ProbeStacks : public ::testing::TestWithParam<std::string> {};

// probe_args: fact(5) recurses down to fact(1) (five hits, each one frame deeper); loop_lines
// calls tick four times.
TEST_P(ProbeStacks, EachHitsUserStackAndCountsByStack) {
  const RunResult r =
      KwatchProbe({"--json", "--backend", GetParam(), "--stack", "--agg", "count() by ustack",
                   "fact n", "tick", "--", PrivateTargetPath("probe_args")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const JsonRun run = ParseJson(r.out);
  const std::vector<json> facts = OfEvent(run.hits, "fact");
  ASSERT_EQ(facts.size(), 5U);
  for (size_t k = 0; k < facts.size(); ++k) {
    const json& st = facts[k]["stack"];
    ASSERT_GE(st.size(), k + 2) << facts[k].dump();
    for (size_t f = 0; f <= k; ++f) {
      EXPECT_EQ(st[f]["function"], "fact") << k << " " << f;
    }
    EXPECT_EQ(st[k + 1]["function"], "main") << k;
    EXPECT_EQ(st[0]["line"], facts[k]["line"]);
  }
  // One stack per depth: "..._start;...;main;fact", then ";fact" once more per level.
  const std::map<std::string, json> by_stack = Aggregates(run, "fact", "count() by ustack");
  ASSERT_EQ(by_stack.size(), 5U) << r.out;
  std::set<size_t> depths;
  for (const auto& [key, a] : by_stack) {
    const std::string folded = a["key"]["ustack"].get<std::string>();
    const size_t main_at = folded.find(";main;");
    ASSERT_NE(main_at, std::string::npos) << folded;
    const std::string after = folded.substr(main_at + 6);
    std::string expected = "fact";
    size_t depth = 1;
    while (expected.size() < after.size()) {
      expected += ";fact";
      ++depth;
    }
    EXPECT_EQ(after, expected) << folded;
    EXPECT_EQ(a["value"], 1) << folded;
    depths.insert(depth);
  }
  EXPECT_EQ(depths, (std::set<size_t>{1, 2, 3, 4, 5}));
  const std::map<std::string, json> ticks = Aggregates(run, "tick", "count() by ustack");
  ASSERT_EQ(ticks.size(), 1U);
  const std::string folded = ticks.begin()->second["key"]["ustack"].get<std::string>();
  EXPECT_TRUE(folded.size() > 20 &&
              folded.compare(folded.size() - 20, 20, "main;loop_lines;tick") == 0)
      << folded;
  EXPECT_EQ(ticks.begin()->second["value"], 4);
}

INSTANTIATE_TEST_SUITE_P(Backends, ProbeStacks, ::testing::Values("agent", "ptrace", "uprobe"));

TEST(ProbeStack, DepthBoundsTheFramesAndTextShowsThem) {
  const RunResult r = KwatchProbe({"--stack", "--stack-depth", "2", "--backend", "ptrace", "fact",
                                   "--", PrivateTargetPath("probe_args")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("    #0  fact (probe_args.c:69)\n    #1  main+0x"));
  EXPECT_THAT(r.out, HasSubstr("    #0  fact (probe_args.c:69)\n    #1  fact+0x"));
  EXPECT_THAT(r.out, ::testing::Not(HasSubstr("    #2 ")));
}

// kwatch probe --stack -o F, then kwatch report F --format folded: one line per distinct stack,
// the probe's event first, outermost frame next, counts of the hits.
TEST(ProbeStack, RecordedStacksReportAsFoldedStacks) {
  const std::string file =
      absl::StrCat(::testing::TempDir(), "/probe_filter_test.", getpid(), ".stacks.kwdb");
  std::filesystem::remove(file);
  const RunResult r = KwatchProbe(
      {"-q", "--stack", "-o", file, "fact n", "tick", "--", PrivateTargetPath("probe_args")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const absl::StatusOr<RunResult> f = ::kwatch::testing::Run(
      {::kwatch::testing::KwatchPath(), "report", file, "--format", "folded"});
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ(f->exit_code, 0) << f->err;
  EXPECT_THAT(f->err, HasSubstr("kwatch: folded: 9 hits in 6 stacks"));
  std::vector<std::string> lines = absl::StrSplit(f->out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 6U) << f->out;
  // Sorted: the five depths of fact, then tick (four calls from loop_lines).
  std::string chain = ";main;fact";
  for (size_t k = 0; k < 5; ++k) {
    EXPECT_EQ(lines[k].rfind("fact;", 0), 0U) << lines[k];
    const std::string tail = chain + " 1";
    EXPECT_EQ(lines[k].substr(lines[k].size() - std::min(tail.size(), lines[k].size())), tail)
        << lines[k];
    chain += ";fact";
  }
  EXPECT_EQ(lines[5].rfind("tick;", 0), 0U) << lines[5];
  const std::string tick_tail = ";main;loop_lines;tick 4";
  EXPECT_EQ(lines[5].substr(lines[5].size() - tick_tail.size()), tick_tail);

  // Without --stack there is nothing to fold: said, with how to get them.
  std::filesystem::remove(file);
  ASSERT_EQ(
      KwatchProbe({"-q", "-o", file, "fact", "--", PrivateTargetPath("probe_args")}).exit_code, 0);
  const absl::StatusOr<RunResult> none = ::kwatch::testing::Run(
      {::kwatch::testing::KwatchPath(), "report", file, "--format", "folded"});
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->exit_code, 1);
  EXPECT_THAT(none->err, HasSubstr("holds no stacks: record them with `kwatch probe --stack -o "
                                   "FILE ...`"));
  std::filesystem::remove(file);
}

std::string ProcStatusLine(pid_t pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) {
      return line;
    }
  }
  return "";
}

// probe_cli_pause 10 GO: step(i) for i < 10, "phase1 sum=100", waits for GO, step(i) for
// i = 10..19, "phase2 sum=400". --stop-on stops it at step(13), before step runs, for gdb.
TEST(ProbeStopOn, LeavesTheTargetStoppedAtTheHitForGdb) {
  const std::string go =
      absl::StrCat(::testing::TempDir(), "/probe_filter_test.", getpid(), ".go-stop-on");
  std::filesystem::remove(go);
  auto target = Spawned::Start({PrivateTargetPath("probe_cli_pause"), "10", go});
  ASSERT_TRUE(target.ok());
  ASSERT_TRUE((*target)->WaitForStdout("phase1 sum=100").ok());
  const pid_t pid = (*target)->pid();
  auto k = Spawned::Start({::kwatch::testing::KwatchPath(), "probe", "--json", "--stop-on", "-p",
                           std::to_string(pid), "step i if i == 13"});
  ASSERT_TRUE(k.ok());
  ASSERT_TRUE((*k)->WaitForStderr("armed").ok()) << (*k)->err();
  std::ofstream(go).put('1');
  auto r = (*k)->Finish();
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->exit_code, 0) << r->err;
  const JsonRun run = ParseJson(r->out);
  ASSERT_EQ(run.hits.size(), 1U) << r->out;
  EXPECT_EQ(run.hits[0]["args"]["i"], 13);
  EXPECT_EQ(run.summary["stop_reason"], "--stop-on: step hit by thread " + std::to_string(pid));
  EXPECT_THAT(r->err, HasSubstr("note: --stop-on uses the ptrace backend"));
  EXPECT_THAT(r->err, HasSubstr("--stop-on: target " + std::to_string(pid) +
                                " is stopped (SIGSTOP) with its code restored, thread " +
                                std::to_string(pid) + " at step (probe_cli_pause.c:"));
  // Stopped, detached, at step's first instruction with i = 13.
  EXPECT_EQ(ProcStatusLine(pid, "State"), "State:\tT (stopped)");
  EXPECT_EQ(ProcStatusLine(pid, "TracerPid"), "TracerPid:\t0");
  const absl::StatusOr<RunResult> g =
      ::kwatch::testing::Run({"/usr/bin/gdb", "-p", std::to_string(pid), "-batch", "-nx", "-ex",
                              "p i", "-ex", "p $pc == (void *)step"});
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_THAT(g->out, HasSubstr("$1 = 13\n$2 = 1\n")) << g->out << g->err;
  // gdb takes over and lets it run to its end: the rest of its calls, unharmed.
  const absl::StatusOr<RunResult> c =
      ::kwatch::testing::Run({"/usr/bin/gdb", "-p", std::to_string(pid), "-batch", "-nx", "-ex",
                              "handle SIGSTOP nostop noprint", "-ex", "continue"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(c->out, HasSubstr("exited normally")) << c->out << c->err;
  auto t = (*target)->Finish();
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->exit_code, 0);
  EXPECT_THAT(t->out, HasSubstr("phase2 sum=400"));
}

TEST(ProbeStopOn, NeedsThePtraceBackend) {
  const RunResult r = KwatchProbe(
      {"--stop-on", "--backend", "agent", "step", "--", PrivateTargetPath("probe_args")});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--stop-on leaves the thread of its hit stopped at the probe, "
                               "which the ptrace backend does"));
}

}  // namespace
}  // namespace kwatch
