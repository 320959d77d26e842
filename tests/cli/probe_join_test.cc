// A `kwatch probe` on a process that a kwatch session already traces joins that session
// (cli/probe_join.h, cli/join_server.h): the session places the joiner's probes in its INT3
// engine and sends their hits, which the joiner prints as any `kwatch probe` does. Checked
// against tests/targets/probe_join.c, which calls step(i, r) a known number of times with known
// arguments and writes g_stats.calls in each call (the owner's watch).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "tests/cli/cli_test_util.h"
#include "tests/cli/probe_test_util.h"
#include "tests/test_util.h"
#include "tests/watch/debug_traps.h"

namespace kwatch {
namespace {

using ::kwatch::testing::KwatchPath;
using ::kwatch::testing::OfEvent;
using ::kwatch::testing::ParseJson;
using ::kwatch::testing::PrivateTargetPath;
using ::kwatch::testing::RunResult;
using ::kwatch::testing::Spawned;
using ::testing::HasSubstr;
using ::testing::Not;
using json = nlohmann::json;

// A waiting probe_join (THREADS x CALLS, --pace US when given) and a kwatch watching
// g_stats.calls in it (--json -q, plus `owner_options`).
struct Owned {
  std::unique_ptr<Spawned> target;
  std::unique_ptr<Spawned> owner;
  std::string pid;
};

Owned StartOwned(const std::string& threads, const std::string& calls, const std::string& pace,
                 const std::vector<std::string>& owner_options = {}) {
  Owned o;
  std::vector<std::string> targv = {PrivateTargetPath("probe_join"), threads, calls, "--wait"};
  if (!pace.empty()) {
    targv.insert(targv.end(), {"--pace", pace});
  }
  auto target = Spawned::Start(targv);
  EXPECT_TRUE(target.ok());
  if (!target.ok()) {
    return o;
  }
  o.target = *std::move(target);
  EXPECT_TRUE(o.target->WaitForStdout("ready").ok());
  o.pid = absl::StrCat(o.target->pid());
  std::vector<std::string> argv = {KwatchPath(), "--json", "-q"};
  argv.insert(argv.end(), owner_options.begin(), owner_options.end());
  argv.insert(argv.end(), {"--write", "g_stats.calls", "-p", o.pid});
  auto owner = Spawned::Start(argv);
  EXPECT_TRUE(owner.ok());
  if (!owner.ok()) {
    return o;
  }
  o.owner = *std::move(owner);
  EXPECT_TRUE(o.owner->WaitForStderr("armed").ok()) << o.owner->err();
  return o;
}

// `kwatch probe ARGS -p PID` joining `o`, started and placed.
std::unique_ptr<Spawned> StartJoiner(const Owned& o, const std::vector<std::string>& args) {
  std::vector<std::string> argv = {KwatchPath(), "probe"};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.insert(argv.end(), {"-p", o.pid});
  auto joiner = Spawned::Start(argv);
  EXPECT_TRUE(joiner.ok());
  if (!joiner.ok()) {
    return nullptr;
  }
  EXPECT_TRUE((*joiner)->WaitForStderr("joined the session of kwatch pid").ok())
      << (*joiner)->err();
  return *std::move(joiner);
}

long OwnerEvents(const RunResult& owner) {
  return ::kwatch::clitest::ParseJsonLines(owner.out).summary["events"].get<long>();
}

// Checks the hits of 'step i r->len' (and 'step%return $retval' when `returns`) of THREADS x
// CALLS: each thread's i = 0..CALLS-1 in order, one r->len per thread (100 + index), return
// values 3i + r->len.
void ExpectStepHits(const testing::JsonRun& run, int threads, long calls, bool returns) {
  const std::vector<json> entries = OfEvent(run.hits, "step");
  ASSERT_EQ(entries.size(), static_cast<size_t>(threads * calls)) << run.summary.dump();
  std::map<int, std::vector<long>> by_tid;
  std::map<int, std::set<long>> lens;
  for (const json& h : entries) {
    by_tid[h["tid"].get<int>()].push_back(h["args"]["i"].get<long>());
    lens[h["tid"].get<int>()].insert(h["args"]["r->len"].get<long>());
  }
  ASSERT_EQ(by_tid.size(), static_cast<size_t>(threads));
  std::set<long> all_lens;
  for (const auto& [tid, is] : by_tid) {
    ASSERT_EQ(is.size(), static_cast<size_t>(calls)) << tid;
    for (long i = 0; i < calls; ++i) {
      ASSERT_EQ(is[i], i) << tid;
    }
    ASSERT_EQ(lens[tid].size(), 1u);
    all_lens.insert(*lens[tid].begin());
  }
  std::set<long> want;
  for (long t = 0; t < threads; ++t) {
    want.insert(100 + t);
  }
  EXPECT_EQ(all_lens, want);
  if (!returns) {
    return;
  }
  const std::vector<json> rets = OfEvent(run.hits, "step__return");
  ASSERT_EQ(rets.size(), static_cast<size_t>(threads * calls));
  std::map<int, long> next;  // per thread: the i of its next return
  for (const json& h : rets) {
    const int tid = h["tid"].get<int>();
    const long i = next[tid]++;
    ASSERT_EQ(h["args"]["arg1"].get<long>(), 3 * i + *lens[tid].begin()) << h.dump();
  }
}

TEST(ProbeJoin, JoinedProbesCountEveryCallWithExactArguments) {
  KW_REQUIRE_DEBUG_TRAPS();
  Owned o = StartOwned("2", "3000", "");
  ASSERT_NE(o.owner, nullptr);
  std::unique_ptr<Spawned> joiner =
      StartJoiner(o, {"--json", "step i r->len", "step%return $retval"});
  ASSERT_NE(joiner, nullptr);
  EXPECT_THAT(joiner->err(), HasSubstr("ptrace backend"));
  EXPECT_THAT(joiner->err(), HasSubstr("INT3 engine"));
  ASSERT_TRUE(o.owner->WaitForStderr("joined this session with 2 probes").ok()) << o.owner->err();
  ASSERT_EQ(kill(o.target->pid(), SIGUSR1), 0);
  auto jr = joiner->Finish();
  auto orr = o.owner->Finish();
  auto tr = o.target->Finish();
  ASSERT_TRUE(jr.ok() && orr.ok() && tr.ok());
  ASSERT_EQ(tr->exit_code, 0) << tr->err;

  EXPECT_EQ(jr->exit_code, 0) << jr->err;
  const testing::JsonRun run = ParseJson(jr->out);
  ASSERT_NO_FATAL_FAILURE(ExpectStepHits(run, 2, 3000, /*returns=*/true));
  EXPECT_EQ(run.summary["hits"], 12000) << run.summary.dump();
  EXPECT_EQ(run.summary["backend"], "ptrace") << run.summary.dump();
  EXPECT_THAT(run.summary["stop_reason"].get<std::string>(), HasSubstr("target exited"));
  for (const json& p : run.summary["probes"]) {
    EXPECT_EQ(p["hits"], 6000) << p.dump();
  }
  EXPECT_EQ(OwnerEvents(*orr), 6000) << orr->out;  // the owner's watch: every store, no hit
  EXPECT_EQ(::kwatch::clitest::ParseJsonLines(orr->out).summary["lost"], 0);
}

// The joiner's lines are those of a `kwatch probe --backend ptrace` of its own: the same text
// (times and thread ids aside), the same summary rows.
TEST(ProbeJoin, JoinedTextOutputIsTheStandaloneOne) {
  KW_REQUIRE_DEBUG_TRAPS();
  const RunResult alone = testing::KwatchProbe(
      {"--backend", "ptrace", "step i r->len", "--", PrivateTargetPath("probe_join"), "1", "5"});
  ASSERT_EQ(alone.exit_code, 0) << alone.err;
  Owned o = StartOwned("1", "5", "");
  ASSERT_NE(o.owner, nullptr);
  std::unique_ptr<Spawned> joiner = StartJoiner(o, {"step i r->len"});
  ASSERT_NE(joiner, nullptr);
  ASSERT_EQ(kill(o.target->pid(), SIGUSR1), 0);
  auto jr = joiner->Finish();
  ASSERT_TRUE(jr.ok() && o.owner->Finish().ok() && o.target->Finish().ok());
  EXPECT_EQ(jr->exit_code, 0) << jr->err;
  // Times, thread ids and durations differ; nothing else may.
  const auto shape = [](const std::string& out) {
    std::vector<std::string> lines;
    for (absl::string_view l : absl::StrSplit(out, '\n', absl::SkipEmpty())) {
      std::string s(l);
      if (absl::StartsWith(s, "calls=")) {
        continue;  // the target's own line
      }
      s = std::regex_replace(s, std::regex("[0-9]+\\.[0-9]+"), "T");
      s = std::regex_replace(s, std::regex("\\b[0-9]{3,7}\\b"), "N");
      lines.push_back(s);
    }
    return lines;
  };
  EXPECT_EQ(shape(jr->out), shape(alone.out)) << jr->out << "\n---\n" << alone.out;
}

TEST(ProbeJoin, KilledJoinerLeavesNoInt3AndTheOwnerCountsOn) {
  KW_REQUIRE_DEBUG_TRAPS();
  Owned o = StartOwned("2", "3000", "300");
  ASSERT_NE(o.owner, nullptr);
  std::unique_ptr<Spawned> joiner = StartJoiner(o, {"--json", "step i"});
  ASSERT_NE(joiner, nullptr);
  ASSERT_EQ(kill(o.target->pid(), SIGUSR1), 0);
  ASSERT_TRUE(joiner->WaitForStdout(R"("type":"hit")").ok()) << joiner->err();
  ASSERT_EQ(kill(joiner->pid(), SIGKILL), 0);
  (void)joiner->Finish();
  ASSERT_TRUE(o.owner->WaitForStderr("that joined this session went away").ok()) << o.owner->err();
  EXPECT_THAT(o.owner->err(), HasSubstr("its 1 probe removed (the original code back)"));
  // No INT3 is left: the target, without a SIGTRAP handler, runs to its end.
  auto tr = o.target->Finish();
  auto orr = o.owner->Finish();
  ASSERT_TRUE(tr.ok() && orr.ok());
  EXPECT_EQ(tr->exit_code, 0) << tr->err;
  EXPECT_THAT(tr->out, HasSubstr("calls=6000"));
  EXPECT_EQ(orr->exit_code, 0) << orr->err;
  EXPECT_EQ(OwnerEvents(*orr), 6000) << orr->out;
}

TEST(ProbeJoin, InterruptedJoinerPrintsItsSummaryAndTheOwnerGoesOn) {
  KW_REQUIRE_DEBUG_TRAPS();
  Owned o = StartOwned("1", "4000", "300");
  ASSERT_NE(o.owner, nullptr);
  std::unique_ptr<Spawned> joiner = StartJoiner(o, {"--json", "step i"});
  ASSERT_NE(joiner, nullptr);
  ASSERT_EQ(kill(o.target->pid(), SIGUSR1), 0);
  ASSERT_TRUE(joiner->WaitForStdout(R"("type":"hit")").ok()) << joiner->err();
  ASSERT_EQ(kill(joiner->pid(), SIGINT), 0);
  auto jr = joiner->Finish();
  ASSERT_TRUE(jr.ok());
  EXPECT_EQ(jr->exit_code, 0) << jr->err;
  const testing::JsonRun run = ParseJson(jr->out);
  EXPECT_EQ(run.summary["stop_reason"], "interrupted by INT") << run.summary.dump();
  EXPECT_EQ(run.summary["hits"].get<size_t>(), run.hits.size());
  // Its hits are the first calls, in order.
  for (size_t k = 0; k < run.hits.size(); ++k) {
    ASSERT_EQ(run.hits[k]["args"]["i"].get<long>(), static_cast<long>(k));
  }
  EXPECT_THAT(jr->err, HasSubstr("probes removed by the session this kwatch joined"));
  ASSERT_TRUE(o.owner->WaitForStderr("ended (interrupted by INT)").ok()) << o.owner->err();
  auto tr = o.target->Finish();
  auto orr = o.owner->Finish();
  ASSERT_TRUE(tr.ok() && orr.ok());
  EXPECT_EQ(tr->exit_code, 0) << tr->err;
  EXPECT_EQ(OwnerEvents(*orr), 4000) << orr->out;
}

// The session's kwatch SIGKILLed: the joiner prints its summary and says so (exit status 1);
// the guardian of the session's engine puts the code back, and the target (no SIGTRAP handler)
// runs to its end. Ten calls a second: the kill window of a ptrace probe (README, "Known
// limits") is far from every call.
TEST(ProbeJoin, KilledSessionLeavesTheJoinerItsSummaryAndTheCodeRestored) {
  KW_REQUIRE_DEBUG_TRAPS();
  Owned o = StartOwned("1", "30", "100000");
  ASSERT_NE(o.owner, nullptr);
  std::unique_ptr<Spawned> joiner = StartJoiner(o, {"--json", "step i"});
  ASSERT_NE(joiner, nullptr);
  ASSERT_EQ(kill(o.target->pid(), SIGUSR1), 0);
  ASSERT_TRUE(joiner->WaitForStdout(R"("i":1})").ok()) << joiner->out() << joiner->err();
  ASSERT_EQ(kill(o.owner->pid(), SIGKILL), 0);
  (void)o.owner->Finish();
  auto jr = joiner->Finish();
  ASSERT_TRUE(jr.ok());
  EXPECT_EQ(jr->exit_code, 1) << jr->err;
  EXPECT_THAT(jr->err, HasSubstr("went away without taking the probes out (killed?)"));
  const testing::JsonRun run = ParseJson(jr->out);
  EXPECT_THAT(run.summary["stop_reason"].get<std::string>(), HasSubstr("went away"));
  EXPECT_GE(run.summary["hits"].get<long>(), 2);
  auto tr = o.target->Finish();
  ASSERT_TRUE(tr.ok());
  EXPECT_EQ(tr->exit_code, 0) << tr->err;
  EXPECT_THAT(tr->out, HasSubstr("calls=30"));
}

// -c ends the joiner (the session takes its probes out), -o records its own hits.
TEST(ProbeJoin, CountEndsTheJoinerAndItRecordsItsHits) {
  KW_REQUIRE_DEBUG_TRAPS();
  Owned o = StartOwned("1", "2000", "100");
  ASSERT_NE(o.owner, nullptr);
  const std::string db = absl::StrCat(::testing::TempDir(), "/probe-join-", getpid(), ".kwdb");
  std::remove(db.c_str());
  std::unique_ptr<Spawned> joiner = StartJoiner(o, {"--json", "-c", "10", "-o", db, "step i"});
  ASSERT_NE(joiner, nullptr);
  ASSERT_EQ(kill(o.target->pid(), SIGUSR1), 0);
  auto jr = joiner->Finish();
  ASSERT_TRUE(jr.ok());
  EXPECT_EQ(jr->exit_code, 0) << jr->err;
  const testing::JsonRun run = ParseJson(jr->out);
  EXPECT_EQ(run.summary["hits"], 10) << run.summary.dump();
  EXPECT_EQ(run.summary["stop_reason"], "--count 10 reached");
  ASSERT_EQ(run.hits.size(), 10u);
  for (size_t k = 0; k < run.hits.size(); ++k) {
    EXPECT_EQ(run.hits[k]["args"]["i"].get<long>(), static_cast<long>(k));
  }
  EXPECT_THAT(jr->err, HasSubstr(absl::StrCat("recorded 10 probe hits to ", db)));
  ASSERT_TRUE(o.owner->WaitForStderr("ended (--count 10 reached)").ok()) << o.owner->err();
  auto tr = o.target->Finish();
  auto orr = o.owner->Finish();
  ASSERT_TRUE(tr.ok() && orr.ok());
  EXPECT_EQ(tr->exit_code, 0) << tr->err;
  EXPECT_EQ(OwnerEvents(*orr), 2000) << orr->out;
  const RunResult report = ::kwatch::clitest::RunKwatch({"report", db});
  EXPECT_EQ(report.exit_code, 0) << report.err;
  EXPECT_THAT(report.out, HasSubstr("10 probe hits"));
  std::remove(db.c_str());
}

// Two joiners probing the same instruction share the session's breakpoint there; each counts
// every call. -q and --agg work as in any `kwatch probe`.
TEST(ProbeJoin, TwoJoinersOnOneAddressEachCountExactlyWithQuietAndAgg) {
  KW_REQUIRE_DEBUG_TRAPS();
  Owned o = StartOwned("2", "1000", "");
  ASSERT_NE(o.owner, nullptr);
  std::unique_ptr<Spawned> first = StartJoiner(o, {"--json", "step i r->len"});
  ASSERT_NE(first, nullptr);
  std::unique_ptr<Spawned> second =
      StartJoiner(o, {"--json", "-q", "--agg", "count() by r->len", "step r->len"});
  ASSERT_NE(second, nullptr);
  ASSERT_EQ(kill(o.target->pid(), SIGUSR1), 0);
  auto fr = first->Finish();
  auto sr = second->Finish();
  auto orr = o.owner->Finish();
  auto tr = o.target->Finish();
  ASSERT_TRUE(fr.ok() && sr.ok() && orr.ok() && tr.ok());
  ASSERT_EQ(tr->exit_code, 0) << tr->err;
  EXPECT_EQ(fr->exit_code, 0) << fr->err;
  EXPECT_EQ(sr->exit_code, 0) << sr->err;
  ASSERT_NO_FATAL_FAILURE(ExpectStepHits(ParseJson(fr->out), 2, 1000, /*returns=*/false));
  const testing::JsonRun quiet = ParseJson(sr->out);
  EXPECT_TRUE(quiet.hits.empty());
  EXPECT_EQ(quiet.summary["hits"], 2000) << quiet.summary.dump();
  std::map<long, long> counts;  // one line per key
  for (const json& row : quiet.aggregates) {
    EXPECT_EQ(row["agg"], "count() by r->len") << row.dump();
    counts[row["key"]["r->len"].get<long>()] = row["value"].get<long>();
  }
  EXPECT_EQ(counts, (std::map<long, long>{{100, 1000}, {101, 1000}})) << sr->out;
  EXPECT_EQ(OwnerEvents(*orr), 2000) << orr->out;
}

TEST(ProbeJoin, OptionsThatCannotJoinAreRefusedByName) {
  KW_REQUIRE_DEBUG_TRAPS();
  Owned o = StartOwned("1", "100", "");
  ASSERT_NE(o.owner, nullptr);
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{{"--hw", "step"},
                                             {"--backend", "agent", "step"},
                                             {"--no-jump", "step"},
                                             {"-f", "step"},
                                             {"--stop-on", "step"}}) {
    SCOPED_TRACE(args.front());
    std::vector<std::string> argv = args;
    argv.insert(argv.end(), {"-p", o.pid});
    const RunResult r = testing::KwatchProbe(argv);
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_THAT(r.err, HasSubstr("which this kwatch would join, but " + args.front()));
    EXPECT_THAT(r.err, HasSubstr("cannot join a session yet"));
    EXPECT_THAT(r.err, Not(HasSubstr("already traced")));
  }
  // A spec the session cannot place is refused with its reason; the owner goes on.
  const RunResult bad = testing::KwatchProbe({"no_such_function_here", "-p", o.pid});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_THAT(bad.err, HasSubstr("no_such_function_here"));
  ASSERT_EQ(kill(o.target->pid(), SIGUSR1), 0);
  auto orr = o.owner->Finish();
  auto tr = o.target->Finish();
  ASSERT_TRUE(orr.ok() && tr.ok());
  EXPECT_EQ(tr->exit_code, 0);
  EXPECT_EQ(OwnerEvents(*orr), 100) << orr->out;
}

// A `kwatch probe` session on its ptrace backend takes no joiners: a watch is refused with what
// to do instead, not "already traced"; the probe session goes on.
TEST(ProbeJoin, AWatchCannotJoinAProbeSessionAndSaysWhatToDo) {
  auto target = Spawned::Start({PrivateTargetPath("probe_join"), "1", "200", "--wait"});
  ASSERT_TRUE(target.ok());
  ASSERT_TRUE((*target)->WaitForStdout("ready").ok());
  const std::string pid = absl::StrCat((*target)->pid());
  auto probe = Spawned::Start(
      {KwatchPath(), "probe", "--json", "-q", "--backend", "ptrace", "step i", "-p", pid});
  ASSERT_TRUE(probe.ok());
  ASSERT_TRUE((*probe)->WaitForStderr("armed").ok()) << (*probe)->err();
  const RunResult watch = ::kwatch::clitest::RunKwatch({"--write", "g_stats.calls", "-p", pid});
  EXPECT_EQ(watch.exit_code, 1);
  EXPECT_THAT(watch.err, HasSubstr("is a `kwatch probe` session (its ptrace backend), which "
                                   "takes no joiners yet"));
  EXPECT_THAT(watch.err, Not(HasSubstr("already traced")));
  ASSERT_EQ(kill((*target)->pid(), SIGUSR1), 0);
  auto pr = (*probe)->Finish();
  auto tr = (*target)->Finish();
  ASSERT_TRUE(pr.ok() && tr.ok());
  EXPECT_EQ(tr->exit_code, 0);
  EXPECT_EQ(ParseJson(pr->out).summary["hits"], 200) << pr->out;
}

}  // namespace
}  // namespace kwatch
