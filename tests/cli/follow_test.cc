// End-to-end tests of `kwatch --follow`: watches through pointers that the program changes
// (tests/targets/follow_chain.c), moved at each pointer write while every thread is stopped.
// The target prints the addresses of its objects; counts per object are compared exactly.
#include <signal.h>
#include <unistd.h>

#include <map>
#include <nlohmann/json.hpp>
#include <set>
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
using json = nlohmann::json;

// The 1-based line of follow_chain.c that contains `needle`.
int ChainLine(const std::string& needle) {
  return clitest::TargetSourceLine("follow_chain.c", needle);
}

// "a=0x... b=0x... c=0x..." from the target's stderr: the objects' v fields, by name.
std::map<std::string, std::string> Objects(const std::string& err) {
  std::map<std::string, std::string> out;
  for (const char* name : {"a", "b", "c"}) {
    const std::string key = absl::StrCat(name, "=0x");
    const size_t at = err.find(key);
    if (at == std::string::npos) {
      continue;
    }
    const size_t end = err.find_first_of(" \n", at);
    out[name] = err.substr(at + 2, end - at - 2);
  }
  return out;
}

// "0x..." as kwatch prints it (lower case, no leading zeros) from the target's %p.
std::string Norm(const std::string& hex) {
  return absl::StrFormat("0x%x", std::stoull(hex, nullptr, 16));
}

// The summary's --follow entry of the (only) watch.
const json& FollowOf(const JsonRun& run) {
  return run.summary["watches"][0]["follow"];
}

// Object `addr` in the summary's --follow entry, with its counts; null when absent.
json ObjectAt(const JsonRun& run, const std::string& addr) {
  for (const json& o : FollowOf(run)["objects"]) {
    if (o["addr"] == addr) {
      return o;
    }
  }
  return json();
}

// Writes counted on each object, in the order of the events (moves in between).
std::vector<std::pair<std::string, long>> EventRuns(const JsonRun& run) {
  std::vector<std::pair<std::string, long>> out;
  for (const json& e : run.events) {
    const std::string addr = e["addr"];
    if (out.empty() || out.back().first != addr) {
      out.emplace_back(addr, 0);
    }
    ++out.back().second;
  }
  return out;
}

// Launched: g_p is NULL at the entry point, so the watch starts parked; setup points it at A
// (the first move), N writes; g_p = B (the second), M writes; then writes to A, which is no
// longer behind g_p, do not count.
TEST(KwatchFollow, FollowsAPointerChangeCountingEachObjectExactly) {
  const RunResult r = RunKwatch({"--json", "--follow", "--write", "g_p->v", "--",
                                 TargetPath("follow_chain"), "ptr", "30", "17", "9"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::map<std::string, std::string> obj = Objects(r.err);
  ASSERT_EQ(obj.size(), 3u) << r.err;
  const std::string a = Norm(obj.at("a"));
  const std::string b = Norm(obj.at("b"));
  const JsonRun run = ParseJsonLines(r.out);
  EXPECT_EQ(run.summary["events"], 30 + 17) << r.out;
  EXPECT_EQ(run.summary["backend"], "stop");
  const std::vector<std::pair<std::string, long>> runs = {{a, 30}, {b, 17}};
  EXPECT_EQ(EventRuns(run), runs);
  EXPECT_EQ(ObjectAt(run, a)["writes"], 30) << run.summary.dump();
  EXPECT_EQ(ObjectAt(run, b)["writes"], 17) << run.summary.dump();
  EXPECT_EQ(FollowOf(run)["objects"].size(), 2u);
  EXPECT_EQ(FollowOf(run)["pointers"], json::array({"g_p"}));
  EXPECT_EQ(FollowOf(run)["parked"], false);
  // The moves, in the stream and in the summary: parked -> A, A -> B, each by g_p's write.
  ASSERT_EQ(run.moves.size(), 2u) << r.out;
  EXPECT_TRUE(run.moves[0]["from"].is_null());
  EXPECT_EQ(run.moves[0]["to"], a);
  EXPECT_EQ(run.moves[1]["from"], a);
  EXPECT_EQ(run.moves[1]["to"], b);
  for (const json& m : run.moves) {
    EXPECT_EQ(m["pointer"], "g_p");
    EXPECT_EQ(m["display"], "g_p->v");
    EXPECT_EQ(m["tid"], run.summary["pid"]);
    EXPECT_EQ(m["file"].get<std::string>().find("follow_chain.c") != std::string::npos, true);
  }
  EXPECT_EQ(run.moves[0]["line"], ChainLine("g_p = a;  // ptr, null"));
  EXPECT_EQ(run.moves[1]["line"], ChainLine("g_p = b;  // ptr, null"));
  EXPECT_EQ(FollowOf(run)["moves"].size(), 2u);
  // The field is named as without --follow, on both objects.
  for (const json& e : run.events) {
    EXPECT_EQ(e["field"], "g_p->v");
  }
}

// Text: the move lines in the event stream and in the summary, with the per-object counts.
TEST(KwatchFollow, TextSaysEachMoveAndCountsPerObject) {
  const RunResult r = RunKwatch(
      {"--follow", "--write", "g_p->v", "--", TargetPath("follow_chain"), "ptr", "12", "5", "3"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::map<std::string, std::string> obj = Objects(r.err);
  const std::string a = Norm(obj.at("a"));
  const std::string b = Norm(obj.at("b"));
  const std::string moved = absl::StrCat("g_p->v moved ", a, " -> ", b, " (g_p written at ");
  const std::string line =
      absl::StrCat("follow_chain.c:", ChainLine("g_p = b;  // ptr, null"), ")");
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat("g_p->v moved parked -> ", a, " (g_p written at ")));
  EXPECT_THAT(r.out, HasSubstr(moved));
  EXPECT_THAT(r.out, HasSubstr(line));
  EXPECT_THAT(r.out, HasSubstr("--follow through 'g_p': 2 moves"));
  EXPECT_THAT(r.out, HasSubstr(absl::StrFormat("object %-18s %8d reads %8d writes", a, 0, 12)));
  EXPECT_THAT(r.out, HasSubstr(absl::StrFormat("object %-18s %8d reads %8d writes", b, 0, 5)));
  EXPECT_THAT(r.err, HasSubstr("parked (--follow): 'g_p' is NULL"));
}

// g_p = NULL between A and B: the watch is parked (writes to A and to B meanwhile are not
// counted), and armed again on B when g_p is set.
TEST(KwatchFollow, ANullPointerParksTheWatchUntilItIsSetAgain) {
  const RunResult r = RunKwatch({"--json", "--follow", "--write", "g_p->v", "--",
                                 TargetPath("follow_chain"), "null", "21", "8", "6"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::map<std::string, std::string> obj = Objects(r.err);
  const std::string a = Norm(obj.at("a"));
  const std::string b = Norm(obj.at("b"));
  const JsonRun run = ParseJsonLines(r.out);
  EXPECT_EQ(run.summary["events"], 21 + 8) << r.out;
  EXPECT_EQ(ObjectAt(run, a)["writes"], 21);
  EXPECT_EQ(ObjectAt(run, b)["writes"], 8);
  ASSERT_EQ(run.moves.size(), 3u) << r.out;
  EXPECT_EQ(run.moves[1]["from"], a);
  EXPECT_TRUE(run.moves[1]["to"].is_null());
  EXPECT_THAT(run.moves[1]["why"].get<std::string>(), HasSubstr("'g_p' is NULL"));
  EXPECT_EQ(run.moves[1]["line"], ChainLine("g_p = NULL;"));
  EXPECT_TRUE(run.moves[2]["from"].is_null());
  EXPECT_EQ(run.moves[2]["to"], b);
}

// g_h->obj->v goes through two pointers: a write of either moves the watch (the inner one's
// watch moves with the outer pointer); the old inner pointer, written after, moves nothing.
TEST(KwatchFollow, AChainOfTwoPointersMovesWhenEitherIsWritten) {
  const RunResult r = RunKwatch({"--json", "--follow", "--write", "g_h->obj->v", "--",
                                 TargetPath("follow_chain"), "chain", "11", "7", "5"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::map<std::string, std::string> obj = Objects(r.err);
  const std::string a = Norm(obj.at("a"));
  const std::string b = Norm(obj.at("b"));
  const std::string c = Norm(obj.at("c"));
  const JsonRun run = ParseJsonLines(r.out);
  EXPECT_EQ(run.summary["events"], 11 + 7 + 2 * 5) << r.out;
  const std::vector<std::pair<std::string, long>> runs = {{a, 11}, {b, 7}, {c, 10}};
  EXPECT_EQ(EventRuns(run), runs);
  EXPECT_EQ(ObjectAt(run, c)["writes"], 10);
  ASSERT_EQ(run.moves.size(), 3u) << r.out;
  EXPECT_EQ(run.moves[0]["pointer"], "g_h");
  EXPECT_EQ(run.moves[1]["pointer"], "g_h->obj");
  EXPECT_EQ(run.moves[1]["line"], ChainLine("g_h1.obj = b;"));
  EXPECT_EQ(run.moves[2]["pointer"], "g_h");
  EXPECT_EQ(run.moves[2]["to"], c);
  EXPECT_EQ(FollowOf(run)["pointers"], json::array({"g_h", "g_h->obj"}));
}

// Four threads write through g_p; main moves it while they wait in a barrier: every write of
// every thread is counted on the object it went to, and only main's write moved the watch.
TEST(KwatchFollow, ThreadsWritingThroughThePointerAreCountedPerObject) {
  const RunResult r = RunKwatch({"--json", "-q", "--follow", "--write", "g_p->v", "--",
                                 TargetPath("follow_chain"), "threads", "250", "120", "4"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::map<std::string, std::string> obj = Objects(r.err);
  const std::string a = Norm(obj.at("a"));
  const std::string b = Norm(obj.at("b"));
  const JsonRun run = ParseJsonLines(r.out);
  EXPECT_EQ(run.summary["events"], 4 * (250 + 120)) << r.err;
  EXPECT_EQ(ObjectAt(run, a)["writes"], 4 * 250) << run.summary.dump();
  EXPECT_EQ(ObjectAt(run, b)["writes"], 4 * 120);
  EXPECT_EQ(run.summary["watches"][0]["threads"].size(), 4u);
  const json& moves = FollowOf(run)["moves"];
  ASSERT_EQ(moves.size(), 2u);
  EXPECT_EQ(moves[1]["tid"], run.summary["pid"]);
  EXPECT_EQ(moves[1]["line"], ChainLine("g_p = b;  // the threads wait"));
}

// Back and forth between two objects: each keeps one entry, with every write made to it.
TEST(KwatchFollow, AnObjectItComesBackToIsCountedOnce) {
  const RunResult r = RunKwatch({"--json", "-q", "--follow", "--write", "g_p->v", "--",
                                 TargetPath("follow_chain"), "flip", "3", "2", "40"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::map<std::string, std::string> obj = Objects(r.err);
  const JsonRun run = ParseJsonLines(r.out);
  EXPECT_EQ(run.summary["events"], 40 * (3 + 2));
  ASSERT_EQ(FollowOf(run)["objects"].size(), 2u) << run.summary.dump();
  EXPECT_EQ(ObjectAt(run, Norm(obj.at("a")))["writes"], 40 * 3);
  EXPECT_EQ(ObjectAt(run, Norm(obj.at("b")))["writes"], 40 * 2);
  EXPECT_EQ(FollowOf(run)["moves"].size(), 2u * 40);  // parked -> A, then A <-> B
}

// Two watches through the same pointer: its write watch is one register they share (3 in all),
// and both move at each write of it.
TEST(KwatchFollow, TwoWatchesThroughOnePointerShareItsRegister) {
  const RunResult r = RunKwatch({"--json", "-q", "--follow", "--write", "g_p->v", "g_p->pad[1]",
                                 "--", TargetPath("follow_chain"), "ptr", "6", "4", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::map<std::string, std::string> obj = Objects(r.err);
  const JsonRun run = ParseJsonLines(r.out);
  ASSERT_EQ(run.summary["watches"].size(), 2u);
  const json& v = run.summary["watches"][0]["follow"];
  const json& pad = run.summary["watches"][1]["follow"];
  EXPECT_EQ(v["moves"].size(), 2u);
  EXPECT_EQ(pad["moves"].size(), 2u);
  EXPECT_EQ(v["objects"][0]["addr"], Norm(obj.at("a")));
  EXPECT_EQ(v["objects"][0]["writes"], 6);
  EXPECT_EQ(v["objects"][1]["writes"], 4);
  EXPECT_EQ(pad["objects"][1]["writes"], 0);
  EXPECT_EQ(pad["moves"][1]["to"],
            absl::StrFormat("0x%x", std::stoull(obj.at("b"), nullptr, 16) + 16));
  std::set<int> registers;
  for (const json& w : run.summary["watches"]) {
    for (const json& slot : w["slots"]) {
      registers.insert(slot["dr"].get<int>());
    }
    EXPECT_THAT(w["placement"].get<std::string>(), HasSubstr("g_p in DR"));
  }
  EXPECT_EQ(registers.size(), 2u);  // the data; the pointer's is the third, shared
  EXPECT_EQ(run.summary["external_slots"], 0);
}

// Attached while the pointers are still NULL: parked, then the same exact counts.
TEST(KwatchFollow, AnAttachedTargetIsFollowedFromParked) {
  auto target = kwatch::testing::Spawned::Start(
      {TargetPath("follow_chain"), "null", "14", "9", "4", "--wait"});
  ASSERT_TRUE(target.ok()) << target.status();
  ASSERT_TRUE((*target)->WaitForStdout("ready").ok()) << (*target)->out();
  auto k = kwatch::testing::Spawned::Start({KwatchPath(), "--json", "--follow", "--write", "g_p->v",
                                            "-p", absl::StrCat((*target)->pid())});
  ASSERT_TRUE(k.ok()) << k.status();
  ASSERT_TRUE((*k)->WaitForStderr("armed 1 watch").ok()) << (*k)->err();
  ASSERT_EQ(kill((*target)->pid(), SIGUSR1), 0);
  auto tr = (*target)->Finish();
  ASSERT_TRUE(tr.ok()) << tr.status();
  EXPECT_EQ(tr->exit_code, 0);
  auto r = (*k)->Finish();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->exit_code, 0) << r->err;
  const std::map<std::string, std::string> obj = Objects(tr->err);
  const JsonRun run = ParseJsonLines(r->out);
  EXPECT_EQ(run.summary["events"], 14 + 9) << r->err;
  EXPECT_EQ(ObjectAt(run, Norm(obj.at("a")))["writes"], 14);
  EXPECT_EQ(ObjectAt(run, Norm(obj.at("b")))["writes"], 9);
  EXPECT_EQ(run.moves.size(), 3u);
}

// With --arm-at the pointer is already set at the point: armed on A there, then moved to B.
TEST(KwatchFollow, WithArmAtItStartsOnTheObjectAtThePoint) {
  const RunResult r =
      RunKwatch({"--json", "--follow", "--write", "g_p->v", "--arm-at", "write_through", "--",
                 TargetPath("follow_chain"), "ptr", "19", "23", "4"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::map<std::string, std::string> obj = Objects(r.err);
  const std::string a = Norm(obj.at("a"));
  const std::string b = Norm(obj.at("b"));
  const JsonRun run = ParseJsonLines(r.out);
  EXPECT_EQ(run.summary["armed"], true);
  EXPECT_EQ(ObjectAt(run, a)["writes"], 19) << run.summary.dump();
  EXPECT_EQ(ObjectAt(run, b)["writes"], 23);
  ASSERT_EQ(run.moves.size(), 1u) << r.out;
  EXPECT_EQ(run.moves[0]["from"], a);
  EXPECT_EQ(run.moves[0]["to"], b);
}

// An expression without a pointer has nothing to follow: watched where it is, with a note.
TEST(KwatchFollow, AnExpressionWithoutPointersIsWatchedWhereItIs) {
  const RunResult r = RunKwatch({"--json", "--follow", "--write", "g_sink", "--",
                                 TargetPath("follow_chain"), "ptr", "3", "3", "3"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("--follow: 'g_sink' goes through no pointer: nothing to follow"));
  const JsonRun run = ParseJsonLines(r.out);
  EXPECT_EQ(run.summary["events"], 1);
  EXPECT_TRUE(run.moves.empty());
  EXPECT_FALSE(run.summary["watches"][0].contains("follow"));
}

TEST(KwatchFollow, KernelWatchesPerfStreamModeAndRecordingsAreRefused) {
  const RunResult kernel = RunKwatch({"--follow", "--write", "jiffies"});
  EXPECT_EQ(kernel.exit_code, 2);
  EXPECT_THAT(kernel.err, HasSubstr("--follow: kernel watches are CPU-wide perf breakpoints"));
  const RunResult perf = RunKwatch({"--follow", "--backend", "perf", "--write", "g_p->v", "--",
                                    TargetPath("follow_chain"), "ptr", "1", "1", "1"});
  EXPECT_EQ(perf.exit_code, 1);
  EXPECT_THAT(perf.err, HasSubstr("--follow: perf stream mode does not stop the thread"));
  const RunResult exec = RunKwatch({"--follow", "--exec", "write_through", "--",
                                    TargetPath("follow_chain"), "ptr", "1", "1", "1"});
  EXPECT_EQ(exec.exit_code, 2);
  EXPECT_THAT(exec.err, HasSubstr("--follow: --exec watches code"));
  const RunResult rec = RunKwatch({"--follow", "--write", "g_p->v", "-o", "/tmp/never.kwdb", "--",
                                   TargetPath("follow_chain"), "ptr", "1", "1", "1"});
  EXPECT_EQ(rec.exit_code, 2);
  EXPECT_THAT(rec.err, HasSubstr("--follow: a recording (-o) holds one address per watch"));
  const RunResult page = RunKwatch({"--follow", "--backend", "page", "--write", "g_p->v", "--",
                                    TargetPath("follow_chain"), "ptr", "1", "1", "1"});
  EXPECT_EQ(page.exit_code, 1);
  EXPECT_THAT(page.err, HasSubstr("--follow: it watches the pointers with debug registers"));
}

// A followed watch needs a register for each pointer: with two more watches, g_h->obj->v's
// second pointer finds none (1 + 2 + 2 > 4), and the error names it.
TEST(KwatchFollow, NotEnoughDebugRegistersForThePointersSaysWhich) {
  const RunResult r =
      RunKwatch({"--follow", "--write", "g_h->obj->v", "g_sink", "g_h2.tag", "--arm-at",
                 "write_chain", "--", TargetPath("follow_chain"), "chain", "1", "1", "1"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("no debug register is left for pointer 'g_h->obj' of "
                               "'g_h->obj->v'"));
  EXPECT_THAT(r.err, HasSubstr("one for each pointer it goes through ('g_h', 'g_h->obj')"));
}

}  // namespace
}  // namespace kwatch
