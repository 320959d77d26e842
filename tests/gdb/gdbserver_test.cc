// `kwatch gdbserver` driven by the real gdb (Debian's gdb 13, /usr/bin/gdb) in batch mode, and
// by a raw client for what gdb never sends. The target, tests/targets/gdb_target.c, knows its
// own totals: Bump runs N times, g_counter ends at 3*N, g_stats.hits at N, misses at N/2.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/base/unique_fd.h"
#include "tests/test_util.h"
#include "tests/watch/debug_traps.h"
#include "watch/gdb/packet.h"

namespace kwatch {
namespace {

using ::kwatch::testing::KwatchPath;
using ::kwatch::testing::RunResult;
using ::kwatch::testing::Spawned;
using ::kwatch::testing::TargetPath;
using ::testing::HasSubstr;
using json = nlohmann::json;

constexpr char kGdb[] = "/usr/bin/gdb";

bool HaveGdb() {
  return ::access(kGdb, X_OK) == 0;
}

#define KW_REQUIRE_GDB() KW_REQUIRE_FEATURE(HaveGdb(), "gdb is not installed at /usr/bin/gdb")

// gdb -batch -nx over `target remote TARGET` with `commands`, its output (stdout and stderr,
// which carries kwatch's and, with --stdio, the program's) as one string.
RunResult RunGdb(const std::string& target, const std::vector<std::string>& commands,
                 const std::string& program = TargetPath("gdb_target"),
                 const std::string& how = "target remote ") {
  std::vector<std::string> argv = {kGdb,  "-batch",        "-nx", "-ex",       "set confirm off",
                                   "-ex", "set sysroot /", "-ex", how + target};
  for (const std::string& c : commands) {
    argv.push_back("-ex");
    argv.push_back(c);
  }
  argv.push_back(program);
  absl::StatusOr<RunResult> r = ::kwatch::testing::Run(argv, 90);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : RunResult{};
}

// The summary line of kwatch's --json output, which the program's own lines interleave; null
// when there is none.
json SummaryIn(const std::string& out) {
  json summary;
  for (absl::string_view line : absl::StrSplit(out, '\n', absl::SkipEmpty())) {
    if (line[0] != '{') {
      continue;  // the program's own line
    }
    json j = json::parse(std::string(line));
    if (j.value("type", "") == "summary") {
      summary = std::move(j);
    }
  }
  return summary;
}

std::string Stdio(const std::string& kwatch_args, int n) {
  return absl::StrCat("| ", KwatchPath(), " gdbserver --stdio ", kwatch_args, " -- ",
                      TargetPath("gdb_target"), " ", n);
}

// A kwatch gdbserver on a free TCP port of 127.0.0.1; `port` is where it listens.
std::unique_ptr<Spawned> ListenOnFreePort(const std::vector<std::string>& args, int& port) {
  std::vector<std::string> argv = {KwatchPath(), "gdbserver", "--listen", "127.0.0.1:0"};
  argv.insert(argv.end(), args.begin(), args.end());
  absl::StatusOr<std::unique_ptr<Spawned>> s = Spawned::Start(argv);
  EXPECT_TRUE(s.ok()) << s.status();
  if (!s.ok()) {
    return nullptr;
  }
  const absl::Status w = (*s)->WaitForStderr("listening on port ");
  EXPECT_TRUE(w.ok()) << w << "\n" << (*s)->err();
  std::smatch m;
  const std::string err = (*s)->err();
  if (std::regex_search(err, m, std::regex("listening on port ([0-9]+)"))) {
    EXPECT_TRUE(absl::SimpleAtoi(m[1].str(), &port));
  }
  return *std::move(s);
}

TEST(GdbServer, GdbBreaksStepsReadsAndRunsToTheExitCode) {
  KW_REQUIRE_GDB();
  const RunResult r =
      RunGdb(Stdio("", 4), {"break Bump", "continue", "info registers rip", "bt", "x/4dw &g_values",
                            "print g_counter", "step", "print g_counter", "print/x $fs_base",
                            "set var g_counter = 100", "print g_counter", "delete", "continue"});
  const std::string all = r.out + r.err;
  EXPECT_EQ(r.exit_code, 0) << all;
  EXPECT_THAT(all, HasSubstr("Breakpoint 1, Bump (step=step@entry=3)")) << all;
  EXPECT_TRUE(std::regex_search(all, std::regex("rip +0x[0-9a-f]+ +0x[0-9a-f]+ <Bump>"))) << all;
  EXPECT_TRUE(std::regex_search(all, std::regex("#1 +0x[0-9a-f]+ in main \\("))) << all;
  EXPECT_THAT(all, HasSubstr("<g_values>:\t10\t20\t30\t40")) << all;
  EXPECT_THAT(all, HasSubstr("$1 = 0\n")) << all;
  EXPECT_THAT(all, HasSubstr("$2 = 3\n")) << all;  // the step ran `g_counter += step`
  EXPECT_TRUE(std::regex_search(all, std::regex("\\$3 = 0x7f[0-9a-f]{6,}\n"))) << all;  // TLS
  EXPECT_THAT(all, HasSubstr("$4 = 100\n")) << all;
  // Written by gdb, then three more calls: 100 + 3 * 3.
  EXPECT_THAT(all, HasSubstr("counter 109 hits 4 misses 2")) << all;
  EXPECT_THAT(all, HasSubstr("exited with code 07")) << all;
}

// gdb steps over its own breakpoint while the condition is false (z0, a step, Z0 again), and
// `finish` puts a temporary breakpoint at the return address.
TEST(GdbServer, ConditionalBreakpointFinishAndNext) {
  KW_REQUIRE_GDB();
  const RunResult r =
      RunGdb(Stdio("", 5), {"break Bump if g_counter == 6", "continue", "print g_counter", "finish",
                            "next", "info breakpoints", "continue"});
  const std::string all = r.out + r.err;
  EXPECT_THAT(all, HasSubstr("$1 = 6\n")) << all;  // the third call: two were stepped over
  EXPECT_THAT(all, HasSubstr("Value returned is $2 = 9")) << all;
  EXPECT_THAT(all, HasSubstr("breakpoint already hit 1 time")) << all;
  EXPECT_THAT(all, HasSubstr("counter 15 hits 5 misses 2")) << all;
  EXPECT_THAT(all, HasSubstr("exited with code 07")) << all;
}

TEST(GdbServer, ExtendedRemoteBreaksAndRunsToTheExit) {
  KW_REQUIRE_GDB();
  const RunResult r =
      RunGdb(Stdio("", 4),
             {"break Bump", "continue", "info threads", "delete", "continue", "info threads"},
             TargetPath("gdb_target"), "target extended-remote ");
  const std::string all = r.out + r.err;
  EXPECT_EQ(r.exit_code, 0) << all;
  EXPECT_THAT(all, HasSubstr("Breakpoint 1, Bump (step=step@entry=3)")) << all;
  EXPECT_TRUE(std::regex_search(all, std::regex("\\* 1 +Thread [0-9]+ +Bump"))) << all;
  EXPECT_THAT(all, HasSubstr("exited with code 07")) << all;
  EXPECT_THAT(all, HasSubstr("No threads.")) << all;
}

TEST(GdbServer, HardwareWatchpointStopsWithExactOldAndNewValues) {
  KW_REQUIRE_GDB();
  KW_REQUIRE_DEBUG_TRAPS();
  const RunResult r = RunGdb(Stdio("", 4), {"break Bump", "continue", "delete", "watch g_counter",
                                            "continue", "continue", "delete", "continue"});
  const std::string all = r.out + r.err;
  EXPECT_THAT(all, HasSubstr("Hardware watchpoint 2: g_counter")) << all;
  EXPECT_THAT(all, HasSubstr("Old value = 0\nNew value = 3\n")) << all;
  EXPECT_THAT(all, HasSubstr("Old value = 3\nNew value = 6\n")) << all;
  EXPECT_THAT(all, Not(HasSubstr("Old value = 6"))) << all;  // deleted before the third write
  EXPECT_THAT(all, HasSubstr("counter 12 hits 4 misses 2")) << all;
  EXPECT_THAT(all, HasSubstr("exited with code 07")) << all;
}

TEST(GdbServer, KwatchCountsExactlyWhileGdbsBreakpointHits) {
  KW_REQUIRE_GDB();
  KW_REQUIRE_DEBUG_TRAPS();
  int port = 0;
  std::unique_ptr<Spawned> kw =
      ListenOnFreePort({"--json", "-q", "--write", "g_stats.hits", "g_stats.misses", "--",
                        TargetPath("gdb_target"), "10"},
                       port);
  ASSERT_NE(kw, nullptr);
  ASSERT_GT(port, 0);
  const RunResult g =
      RunGdb(absl::StrCat("127.0.0.1:", port), {"break Bump", "continue", "continue", "continue",
                                                "print g_stats.hits", "delete", "continue"});
  const std::string all = g.out + g.err;
  EXPECT_THAT(all, HasSubstr("$1 = 2\n")) << all;  // two iterations done at the third stop
  EXPECT_THAT(all, HasSubstr("exited with code 07")) << all;
  absl::StatusOr<RunResult> k = kw->Finish();
  ASSERT_TRUE(k.ok()) << k.status();
  EXPECT_EQ(k->exit_code, 7) << k->err;
  const json summary = SummaryIn(k->out);
  ASSERT_TRUE(summary.is_object()) << k->out;
  // gdb's three stops are not kwatch's events; kwatch's writes are all there.
  EXPECT_EQ(summary["events"], 15) << summary.dump();
  EXPECT_EQ(summary["lost"], 0);
  ASSERT_EQ(summary["watches"].size(), 2u);
  EXPECT_EQ(summary["watches"][0]["writes"], 10);
  EXPECT_EQ(summary["watches"][1]["writes"], 5);
}

TEST(GdbServer, DetachLeavesTheTargetRunningAndKwatchCounting) {
  KW_REQUIRE_GDB();
  KW_REQUIRE_DEBUG_TRAPS();
  int port = 0;
  std::unique_ptr<Spawned> kw = ListenOnFreePort(
      {"--json", "-q", "--write", "g_stats.hits", "--", TargetPath("gdb_target"), "1000"}, port);
  ASSERT_NE(kw, nullptr);
  ASSERT_GT(port, 0);
  const RunResult g =
      RunGdb(absl::StrCat("127.0.0.1:", port), {"break Bump", "continue", "continue", "detach"});
  const std::string all = g.out + g.err;
  EXPECT_THAT(all, HasSubstr("[Inferior 1 (Remote target) detached]")) << all;
  absl::StatusOr<RunResult> k = kw->Finish();
  ASSERT_TRUE(k.ok()) << k.status();
  EXPECT_EQ(k->exit_code, 7) << k->err;  // the target ran to its end
  EXPECT_THAT(k->out, HasSubstr("counter 3000 hits 1000 misses 500")) << k->out;
  EXPECT_THAT(k->err, HasSubstr("gdb detached")) << k->err;
  const json summary = SummaryIn(k->out);
  ASSERT_TRUE(summary.is_object()) << k->out;
  EXPECT_EQ(summary["watches"][0]["writes"], 1000) << summary.dump();
}

// Arbitration: kwatch's four watches hold every debug register; gdb's `watch` (debugger
// priority) takes one, kwatch's watches take turns in the other three meanwhile (multiplexed,
// said on the event stream and in the summary: not page protection, the default, because
// g_counter, which gdb watches, shares their page), and get it back once gdb deletes its watch.
TEST(GdbServer, GdbsWatchpointTakesARegisterFromKwatchAndGivesItBack) {
  KW_REQUIRE_GDB();
  KW_REQUIRE_DEBUG_TRAPS();
  int port = 0;
  std::unique_ptr<Spawned> kw =
      ListenOnFreePort({"--json", "-q", "--write", "g_stats.hits", "g_stats.misses",
                        "g_stats.flags", "g_values[3]", "--", TargetPath("gdb_target"), "10"},
                       port);
  ASSERT_NE(kw, nullptr);
  ASSERT_GT(port, 0);
  const RunResult g = RunGdb(absl::StrCat("127.0.0.1:", port),
                             {"break Bump", "continue", "delete", "watch g_counter", "continue",
                              "continue", "delete", "continue"});
  const std::string all = g.out + g.err;
  EXPECT_THAT(all, HasSubstr("Hardware watchpoint 2: g_counter")) << all;
  EXPECT_THAT(all, HasSubstr("Old value = 0\nNew value = 3\n")) << all;
  EXPECT_THAT(all, HasSubstr("Old value = 3\nNew value = 6\n")) << all;
  EXPECT_THAT(all, HasSubstr("exited with code 07")) << all;
  absl::StatusOr<RunResult> k = kw->Finish();
  ASSERT_TRUE(k.ok()) << k.status();
  EXPECT_EQ(k->exit_code, 7) << k->err;
  const json summary = SummaryIn(k->out);
  ASSERT_TRUE(summary.is_object()) << k->out;
  const std::string notes = summary["notes"].dump();
  EXPECT_THAT(notes, HasSubstr("watch #1 g_stats.hits: taking turns for the debug registers left "
                               "(multiplexed); not page protection, which would hide the "
                               "accesses the debugger watches on its page (the debugger holds 1 "
                               "debug register)"))
      << notes;
  EXPECT_THAT(notes, HasSubstr("watch #4 g_values[3]: back in a debug register (the debugger "
                               "holds 0 debug registers)"))
      << notes;
  ASSERT_EQ(summary["watches"].size(), 4u);
  // Multiplexed for a while: at most the truth, and back in hardware at the end.
  EXPECT_LE(summary["watches"][0]["writes"].get<int>(), 10);
  EXPECT_LE(summary["watches"][1]["writes"].get<int>(), 5);
  EXPECT_EQ(summary["watches"][0]["multiplexed"], false);
}

// Arbitration with page protection (the default): gdb's two hardware breakpoints leave kwatch's
// three watches two registers; the lowest-ranked moves to page protection (said on the event
// stream and in the summary) and counts on exactly, gdb's `next` steps over a store to the
// protected page, and the watch gets its register back after gdb's `delete`. Every count is the
// program's: Bump runs 10 times (g_counter written once each), g_stats.hits 10, misses 5.
TEST(GdbServer, GdbsRegistersMoveAWatchToPagesWhereItCountsExactly) {
  KW_REQUIRE_GDB();
  KW_REQUIRE_DEBUG_TRAPS();
  int port = 0;
  std::unique_ptr<Spawned> kw =
      ListenOnFreePort({"--json", "-q", "--write", "g_stats.hits", "g_stats.misses", "g_counter",
                        "--", TargetPath("gdb_target"), "10"},
                       port);
  ASSERT_NE(kw, nullptr);
  ASSERT_GT(port, 0);
  const RunResult g = RunGdb(absl::StrCat("127.0.0.1:", port),
                             {"hbreak main", "hbreak Bump", "continue", "continue", "finish",
                              "next", "print g_stats.hits", "delete", "continue"});
  const std::string all = g.out + g.err;
  EXPECT_THAT(all, HasSubstr("Breakpoint 2, Bump")) << all;
  EXPECT_THAT(all, HasSubstr("Value returned is $1 = 3")) << all;
  EXPECT_THAT(all, HasSubstr("$2 = 1\n")) << all;  // `next` ran the first g_stats.hits++
  EXPECT_THAT(all, HasSubstr("exited with code 07")) << all;
  absl::StatusOr<RunResult> k = kw->Finish();
  ASSERT_TRUE(k.ok()) << k.status();
  EXPECT_EQ(k->exit_code, 7) << k->err;
  EXPECT_THAT(k->out, HasSubstr("counter 30 hits 10 misses 5")) << k->out;
  const json summary = SummaryIn(k->out);
  ASSERT_TRUE(summary.is_object()) << k->out;
  const std::string notes = summary["notes"].dump();
  EXPECT_THAT(notes, ::testing::ContainsRegex(
                         "watch #[123] [a-z_.]+: moved to page protection \\(exact counts go "
                         "on, at a fault per access to its page\\) \\(the debugger holds 2 "
                         "debug registers\\)"))
      << notes;
  EXPECT_THAT(notes, ::testing::ContainsRegex("watch #[123] [a-z_.]+: back in a debug register "
                                              "\\(the debugger holds 0 debug registers\\)"))
      << notes;
  ASSERT_EQ(summary["watches"].size(), 3u);
  EXPECT_EQ(summary["watches"][0]["writes"], 10) << summary.dump();
  EXPECT_EQ(summary["watches"][1]["writes"], 5) << summary.dump();
  EXPECT_EQ(summary["watches"][2]["writes"], 10) << summary.dump();
  EXPECT_EQ(summary["lost"], 0);
  for (const json& w : summary["watches"]) {
    EXPECT_EQ(w["multiplexed"], false) << w.dump();  // never took turns: pages, then back
  }
}

// Arbitration with page protection, the issue's case: kwatch watches the four fields of g_rec
// (tests/targets/gdb_pages.c: a page of their own) in all four debug registers; gdb's `watch
// g_far` (another page) takes one, and the watch drmgr displaces moves to page protection (said
// in the notes and by `kwatch slots`: page-protected) and goes on counting exactly. gdb steps
// (`next`) over an add to g_rec.a (the page backend steps it with the page open) and a plain
// store to g_rec.b (emulated) on the protected page: both are normal steps for gdb and kwatch
// events, never gdb stops. After gdb's `delete` the watch is back in a register. Every count
// is the program's: 10 writes of a and b, 5 of c, 2 of d.
TEST(GdbServer, DisplacedWatchMovesToPagesCountsExactlyThroughGdbsStepsAndComesBack) {
  KW_REQUIRE_GDB();
  KW_REQUIRE_DEBUG_TRAPS();
  int port = 0;
  std::unique_ptr<Spawned> kw =
      ListenOnFreePort({"--json", "--write", "g_rec.a", "g_rec.b", "g_rec.c", "g_rec.d", "--",
                        TargetPath("gdb_pages"), "10"},
                       port);
  ASSERT_NE(kw, nullptr);
  ASSERT_GT(port, 0);
  const RunResult g = RunGdb(
      absl::StrCat("127.0.0.1:", port),
      {"break Touch", "continue", "watch g_far", "continue", "delete 1", "break Store", "continue",
       absl::StrCat("shell ", KwatchPath(), " slots"), "next", "next", "print g_rec", "delete 3",
       "continue", "continue", "continue", "continue", "delete", "continue"},
      TargetPath("gdb_pages"));
  const std::string all = g.out + g.err;
  EXPECT_THAT(all, HasSubstr("Hardware watchpoint 2: g_far")) << all;
  EXPECT_THAT(all, HasSubstr("Old value = 0\nNew value = 1\n")) << all;
  EXPECT_THAT(all, HasSubstr("Breakpoint 3, Store (i=i@entry=1)")) << all;
  // Two `next`s ran the add and the store of Store(1): the values are the program's.
  EXPECT_THAT(all, HasSubstr("$1 = {a = 2, b = 1, c = 0, d = 0}")) << all;
  EXPECT_THAT(all, Not(HasSubstr("SIGSEGV"))) << all;
  // gdb's watchpoint stops in Touch(1) to Touch(4) (Store(4) writes g_rec.d), then no more.
  EXPECT_THAT(all, HasSubstr("Old value = 10\nNew value = 15\n")) << all;
  EXPECT_THAT(all, Not(HasSubstr("Old value = 15"))) << all;
  EXPECT_TRUE(std::regex_search(all, std::regex("g_rec\\.[abcd] \\(kwatch [0-9]+\\): [0-9]+ "
                                                "bytes at 0x[0-9a-f]+ write, page-protected")))
      << all;
  EXPECT_THAT(all, HasSubstr("exited with code 07")) << all;
  absl::StatusOr<RunResult> k = kw->Finish();
  ASSERT_TRUE(k.ok()) << k.status();
  EXPECT_EQ(k->exit_code, 7) << k->err;
  EXPECT_THAT(k->out, HasSubstr("a 10 b 9 c 5 d 2 far 55")) << k->out;
  json summary;
  std::map<std::string, int> events;  // by expression
  std::map<std::string, int> paged;   // of those, the page backend's (ip and trap_ip alike)
  for (absl::string_view line : absl::StrSplit(k->out, '\n', absl::SkipEmpty())) {
    if (line[0] != '{') {
      continue;  // the program's own line
    }
    json j = json::parse(std::string(line));
    if (j.value("type", "") == "summary") {
      summary = j;
    } else if (j.value("type", "") == "event") {
      ++events[j["expr"].get<std::string>()];
      if (j["ip"] == j["trap_ip"]) {
        ++paged[j["expr"].get<std::string>()];
      }
    }
  }
  ASSERT_TRUE(summary.is_object()) << k->out;
  const std::string notes = summary["notes"].dump();
  std::smatch moved;
  ASSERT_TRUE(std::regex_search(
      notes, moved,
      std::regex("watch #([1-4]) (g_rec\\.[abcd]): moved to page protection \\(exact counts go "
                 "on, at a fault per access to its page\\) \\(the debugger holds 1 debug "
                 "register\\)")))
      << notes;
  EXPECT_THAT(notes, HasSubstr(absl::StrCat("watch #", moved[1].str(), " ", moved[2].str(),
                                            ": back in a debug register (the debugger holds 0 "
                                            "debug registers)")))
      << notes;
  EXPECT_THAT(k->err, HasSubstr(absl::StrCat("watch #", moved[1].str(), " ", moved[2].str(),
                                             ": moved to page protection")))
      << k->err;
  EXPECT_THAT(notes, Not(HasSubstr("multiplexed"))) << notes;
  ASSERT_EQ(summary["watches"].size(), 4u);
  EXPECT_EQ(summary["watches"][0]["writes"], 10) << summary.dump();
  EXPECT_EQ(summary["watches"][1]["writes"], 10) << summary.dump();
  EXPECT_EQ(summary["watches"][2]["writes"], 5) << summary.dump();
  EXPECT_EQ(summary["watches"][3]["writes"], 2) << summary.dump();
  EXPECT_EQ(summary["events"], 27) << summary.dump();
  EXPECT_EQ(events, (std::map<std::string, int>{
                        {"g_rec.a", 10}, {"g_rec.b", 10}, {"g_rec.c", 5}, {"g_rec.d", 2}}));
  // While the watch was on pages every write to the page faulted: the page backend counted the
  // displaced watch's writes, and the plain stores it emulated for the others (the debug
  // registers never saw those), gdb's step over g_rec.b's store included; what it stepped with
  // the page open the registers counted. Nothing twice, nothing lost (the counts above).
  EXPECT_GE(paged[moved[2].str()], 1) << k->out;
  EXPECT_GE(paged["g_rec.b"], 1) << k->out;
  EXPECT_EQ(summary["lost"], 0);
  for (const json& w : summary["watches"]) {
    EXPECT_EQ(w["multiplexed"], false) << w.dump();
    // Back in a register at the end, the displaced one too (on pages it says "page").
    EXPECT_EQ(w["backend"], "perf") << w.dump();
    EXPECT_THAT(w["placement"].get<std::string>(), ::testing::StartsWith("debug register DR"))
        << w.dump();
  }
}

// SIGTERM ends `kwatch gdbserver` while a watch gdb displaced runs on pages (a build of this
// once spun at 100% CPU ignoring it), the pages restored: the target runs on to its own end
// without kwatch and prints its totals (no SIGSEGV from a page left protected).
TEST(GdbServer, SigtermEndsTheSessionWhileADisplacedWatchIsOnPages) {
  KW_REQUIRE_GDB();
  KW_REQUIRE_DEBUG_TRAPS();
  int port = 0;
  std::unique_ptr<Spawned> kw =
      ListenOnFreePort({"--json", "-q", "--write", "g_rec.a", "g_rec.b", "g_rec.c", "g_rec.d", "--",
                        TargetPath("gdb_pages"), "3000000"},
                       port);
  ASSERT_NE(kw, nullptr);
  ASSERT_GT(port, 0);
  absl::StatusOr<std::unique_ptr<Spawned>> gdb =
      Spawned::Start({kGdb, "-batch", "-nx", "-ex", "set confirm off", "-ex", "set sysroot /",
                      "-ex", absl::StrCat("target remote 127.0.0.1:", port), "-ex", "hbreak abort",
                      "-ex", "continue", TargetPath("gdb_pages")});
  ASSERT_TRUE(gdb.ok()) << gdb.status();
  ASSERT_TRUE(kw->WaitForStderr("moved to page protection").ok()) << kw->err();
  ::usleep(300 * 1000);  // some writes through the pages
  ASSERT_EQ(::kill(kw->pid(), SIGTERM), 0);
  absl::StatusOr<RunResult> k = kw->Finish(30);
  ASSERT_TRUE(k.ok()) << k.status();
  EXPECT_EQ(k->exit_code, 0) << k->err;
  EXPECT_THAT(k->err, HasSubstr("keeps running")) << k->err;
  EXPECT_THAT(k->out, HasSubstr("a 3000000 b 2999999 c 1500000 d 600000 far ")) << k->out;
  const json summary = SummaryIn(k->out);
  ASSERT_TRUE(summary.is_object()) << k->out;
  EXPECT_EQ(summary["stop_reason"], "interrupted by TERM") << summary.dump();
  EXPECT_EQ(summary["lost"], 0);
  ASSERT_EQ(summary["watches"].size(), 4u);
  int on_pages = 0;
  for (const json& w : summary["watches"]) {
    on_pages += w["backend"] == "page" ? 1 : 0;
  }
  EXPECT_EQ(on_pages, 1) << summary.dump();  // the displaced one, when SIGTERM came
  absl::StatusOr<RunResult> g = (*gdb)->Finish(30);
  EXPECT_TRUE(g.ok()) << g.status();
}

// SIGTERM also ends `kwatch gdbserver` while gdb holds the target stopped (the server waits for
// gdb's next packet; it used to wait until gdb resumed or went away): gdb's points are removed,
// the target runs on to its own end, and kwatch's summary says why it ended.
TEST(GdbServer, SigtermEndsTheSessionWhileGdbHoldsTheTargetStopped) {
  KW_REQUIRE_GDB();
  int port = 0;
  std::unique_ptr<Spawned> kw = ListenOnFreePort(
      {"--json", "-q", "--write", "g_rec.a", "--", TargetPath("gdb_pages"), "1000"}, port);
  ASSERT_NE(kw, nullptr);
  ASSERT_GT(port, 0);
  absl::StatusOr<std::unique_ptr<Spawned>> gdb =
      Spawned::Start({kGdb, "-batch", "-nx", "-ex", "set confirm off", "-ex", "set sysroot /",
                      "-ex", absl::StrCat("target remote 127.0.0.1:", port), "-ex", "break Store",
                      "-ex", "continue", "-ex", "shell sleep 30", TargetPath("gdb_pages")});
  ASSERT_TRUE(gdb.ok()) << gdb.status();
  ASSERT_TRUE((*gdb)->WaitForStdout("Breakpoint 1, Store").ok()) << (*gdb)->out();
  const absl::Time sent = absl::Now();
  ASSERT_EQ(::kill(kw->pid(), SIGTERM), 0);
  absl::StatusOr<RunResult> k = kw->Finish(20);
  ASSERT_TRUE(k.ok()) << k.status();
  EXPECT_LT(absl::Now() - sent, absl::Seconds(10));  // not after gdb's `shell sleep 30`
  EXPECT_EQ(k->exit_code, 0) << k->err;
  EXPECT_THAT(k->err, HasSubstr("a signal ends kwatch while gdb holds pid")) << k->err;
  EXPECT_THAT(k->out, HasSubstr("a 1000 b 999 c 500 d 200 far 500500")) << k->out;
  EXPECT_THAT(k->out, HasSubstr("\"stop_reason\":\"interrupted by TERM\"")) << k->out;
  ASSERT_EQ(::kill((*gdb)->pid(), SIGKILL), 0);  // its `shell sleep` would hold it 30 s
  (void)(*gdb)->Finish(10);
}

// And before gdb connects: kwatch ends at once, the launched target (which never ran) killed.
TEST(GdbServer, SigtermBeforeGdbConnectsEndsKwatch) {
  int port = 0;
  std::unique_ptr<Spawned> kw =
      ListenOnFreePort({"-q", "--write", "g_rec.a", "--", TargetPath("gdb_pages"), "10"}, port);
  ASSERT_NE(kw, nullptr);
  ASSERT_GT(port, 0);
  ASSERT_EQ(::kill(kw->pid(), SIGTERM), 0);
  absl::StatusOr<RunResult> k = kw->Finish(20);
  ASSERT_TRUE(k.ok()) << k.status();
  EXPECT_EQ(k->exit_code, 0) << k->err;
  EXPECT_THAT(k->err, HasSubstr("a signal ends kwatch before gdb connected; pid ")) << k->err;
  EXPECT_THAT(k->err, HasSubstr(" killed (it never ran)")) << k->err;
}

// Attach (-p) to a threaded program waiting for SIGUSR1: gdb's `signal SIGUSR1` starts it,
// the breakpoint in Work stops two of its three workers in turn (each reported with its own
// thread), and after the detach the program runs to its end with every write done.
// `kwatch slots` while gdb's watchpoint is in: gdb's point holds a register as gdb's, and
// kwatch's four watches (fields the program never writes) take turns in the other three.
TEST(GdbServer, KwatchSlotsShowsGdbsWatchpointAsGdbs) {
  KW_REQUIRE_GDB();
  KW_REQUIRE_DEBUG_TRAPS();
  const std::string slots = absl::StrCat(KwatchPath(), " slots");
  // Waits (up to 10 s) for the session to publish gdb's point while the program still runs.
  const std::string poll =
      absl::StrCat("shell for i in $(seq 200); do ", slots,
                   " | grep -q 'gdb watch' && break; sleep 0.05; done; ", slots);
  const RunResult r =
      RunGdb(Stdio("-q --write g_stats.flags g_stats.pad g_values[2] g_values[3]", 700000000),
             {"watch g_values[0]", "continue &", poll});
  const std::string all = r.out + r.err;
  EXPECT_TRUE(std::regex_search(
      all, std::regex("DR[0-3] +gdb watch 0x[0-9a-f]+ \\(kwatch [0-9]+\\) +4 bytes at "
                      "0x[0-9a-f]+ +write +armed")))
      << all;
  EXPECT_TRUE(std::regex_search(all, std::regex("g_values\\[3\\] \\(kwatch [0-9]+\\): 4 bytes "
                                                "at 0x[0-9a-f]+ write, multiplexed")))
      << all;
}

TEST(GdbServer, AttachBreaksInEachThreadAndDetachLeavesTheProgramWhole) {
  KW_REQUIRE_GDB();
  absl::StatusOr<std::unique_ptr<Spawned>> fw =
      Spawned::Start({TargetPath("field_writer"), "3", "1000", "--wait"});
  ASSERT_TRUE(fw.ok()) << fw.status();
  ASSERT_TRUE((*fw)->WaitForStdout("ready").ok()) << (*fw)->out();
  const pid_t pid = (*fw)->pid();
  const RunResult g =
      RunGdb(absl::StrCat("| ", KwatchPath(), " gdbserver --stdio -p ", pid),
             {"break Work", "signal SIGUSR1", "info threads", "continue", "delete", "detach"},
             TargetPath("field_writer"));
  const std::string all = g.out + g.err;
  const std::regex hit("Thread [0-9]+ hit Breakpoint 1, Work \\(arg=");
  EXPECT_EQ(
      std::distance(std::sregex_iterator(all.begin(), all.end(), hit), std::sregex_iterator()), 2)
      << all;
  EXPECT_THAT(all, HasSubstr("[Inferior 1 (Remote target) detached]")) << all;
  absl::StatusOr<RunResult> r = (*fw)->Finish();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->exit_code, 0) << r->err;
  int workers = 0;
  for (absl::string_view line : absl::StrSplit(r->out, '\n', absl::SkipEmpty())) {
    if (line[0] == '{') {
      const json j = json::parse(std::string(line));
      EXPECT_EQ(j["hits_w"], 1000) << line;
      EXPECT_EQ(j["misses_w"], 500) << line;
      ++workers;
    }
  }
  EXPECT_EQ(workers, 3) << r->out;
}

// A second kwatch joins the session of `kwatch gdbserver` (attached with -p) while gdb runs the
// program: each counts its own field of field_writer exactly (docs/gdbserver.md, "Joining").
TEST(GdbServer, ASecondKwatchJoinsTheGdbserversSessionAndBothCountExactly) {
  KW_REQUIRE_GDB();
  KW_REQUIRE_DEBUG_TRAPS();
  absl::StatusOr<std::unique_ptr<Spawned>> fw =
      Spawned::Start({TargetPath("field_writer"), "2", "1000", "--wait"});
  ASSERT_TRUE(fw.ok()) << fw.status();
  ASSERT_TRUE((*fw)->WaitForStdout("ready").ok()) << (*fw)->out();
  const std::string pid = absl::StrCat((*fw)->pid());
  int port = 0;
  std::unique_ptr<Spawned> kw =
      ListenOnFreePort({"--json", "-q", "--write", "g_stats.hits", "-p", pid}, port);
  ASSERT_NE(kw, nullptr);
  ASSERT_GT(port, 0);
  // gdb lets the program run (it waits for SIGUSR1, which gdb passes without stopping).
  absl::StatusOr<std::unique_ptr<Spawned>> gdb = Spawned::Start(
      {kGdb, "-batch", "-nx", "-ex", "set confirm off", "-ex", "set sysroot /", "-ex",
       absl::StrCat("target remote 127.0.0.1:", port), "-ex", "handle SIGUSR1 nostop noprint pass",
       "-ex", "continue", TargetPath("field_writer")});
  ASSERT_TRUE(gdb.ok()) << gdb.status();
  absl::StatusOr<std::unique_ptr<Spawned>> joiner =
      Spawned::Start({KwatchPath(), "--json", "-q", "--write", "g_stats.misses", "-p", pid});
  ASSERT_TRUE(joiner.ok()) << joiner.status();
  ASSERT_TRUE((*joiner)->WaitForStderr("joined the session").ok()) << (*joiner)->err();
  ASSERT_EQ(::kill((*fw)->pid(), SIGUSR1), 0);
  absl::StatusOr<RunResult> g = (*gdb)->Finish(90);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_THAT(g->out + g->err, HasSubstr("exited normally")) << g->out << g->err;
  absl::StatusOr<RunResult> j = (*joiner)->Finish();
  absl::StatusOr<RunResult> k = kw->Finish();
  ASSERT_TRUE(j.ok() && k.ok());
  ASSERT_TRUE((*fw)->Finish().ok());
  const json owned = SummaryIn(k->out);
  ASSERT_TRUE(owned.is_object()) << k->out << k->err;
  ASSERT_EQ(owned["watches"].size(), 1u);
  EXPECT_EQ(owned["watches"][0]["display"], "g_stats.hits");
  EXPECT_EQ(owned["events"], 2000) << owned.dump();  // 2 workers x 1000 writes
  const json joined = SummaryIn(j->out);
  ASSERT_TRUE(joined.is_object()) << j->out << j->err;
  ASSERT_EQ(joined["watches"].size(), 1u);
  EXPECT_EQ(joined["watches"][0]["display"], "g_stats.misses");
  EXPECT_EQ(joined["events"], 1000) << joined.dump();  // every other iteration
  EXPECT_EQ(j->exit_code, 0) << j->err;
  EXPECT_THAT(j->err, HasSubstr("ended: target exited")) << j->err;
}

// A `kwatch probe` joins the session of `kwatch gdbserver` while gdb runs the program, and gdb's
// breakpoint and the joined probe are on the same instruction (step's first byte): gdb stops
// there at every call and continues (a step over the shared INT3, Int3Engine::StepOver), the
// joined probe counts every call once with its argument, the owner's watch every store.
TEST(GdbServer, AJoinedKwatchProbeSharesGdbsBreakpointAndBothSeeEveryCall) {
  KW_REQUIRE_GDB();
  KW_REQUIRE_DEBUG_TRAPS();
  absl::StatusOr<std::unique_ptr<Spawned>> pj =
      Spawned::Start({TargetPath("probe_join"), "1", "20", "--wait"});
  ASSERT_TRUE(pj.ok()) << pj.status();
  ASSERT_TRUE((*pj)->WaitForStdout("ready").ok()) << (*pj)->out();
  const std::string pid = absl::StrCat((*pj)->pid());
  int port = 0;
  std::unique_ptr<Spawned> kw =
      ListenOnFreePort({"--json", "-q", "--write", "g_stats.calls", "-p", pid}, port);
  ASSERT_NE(kw, nullptr);
  ASSERT_GT(port, 0);
  const std::string script = absl::StrCat(::testing::TempDir(), "/probe-join-", ::getpid(), ".gdb");
  {
    std::ofstream f(script);
    f << "set confirm off\nset sysroot /\ntarget remote 127.0.0.1:" << port
      << "\nhandle SIGUSR1 nostop noprint pass\nbreak *step\ncommands\nsilent\n"
         "printf \"gdb-hit %ld\\n\", $rdi\ncontinue\nend\ncontinue\n";
  }
  absl::StatusOr<std::unique_ptr<Spawned>> gdb =
      Spawned::Start({kGdb, "-batch", "-nx", "-x", script, TargetPath("probe_join")});
  ASSERT_TRUE(gdb.ok()) << gdb.status();
  absl::StatusOr<std::unique_ptr<Spawned>> joiner =
      Spawned::Start({KwatchPath(), "probe", "--json", "step i", "-p", pid});
  ASSERT_TRUE(joiner.ok()) << joiner.status();
  ASSERT_TRUE((*joiner)->WaitForStderr("joined the session").ok()) << (*joiner)->err();
  ASSERT_EQ(::kill((*pj)->pid(), SIGUSR1), 0);
  absl::StatusOr<RunResult> g = (*gdb)->Finish(90);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_THAT(g->out + g->err, HasSubstr("exited normally")) << g->out << g->err;
  for (int i = 0; i < 20; ++i) {
    EXPECT_THAT(g->out, HasSubstr(absl::StrCat("gdb-hit ", i, "\n"))) << g->out;
  }
  absl::StatusOr<RunResult> j = (*joiner)->Finish();
  absl::StatusOr<RunResult> k = kw->Finish();
  absl::StatusOr<RunResult> t = (*pj)->Finish();
  ASSERT_TRUE(j.ok() && k.ok() && t.ok());
  std::remove(script.c_str());
  EXPECT_EQ(t->exit_code, 0) << t->err;
  EXPECT_EQ(j->exit_code, 0) << j->err;
  std::vector<long> is;
  for (absl::string_view line : absl::StrSplit(j->out, '\n', absl::SkipEmpty())) {
    const json h = json::parse(std::string(line));
    if (h["type"] == "hit") {
      is.push_back(h["args"]["i"].get<long>());
    }
  }
  ASSERT_EQ(is.size(), 20u) << j->out;
  for (long i = 0; i < 20; ++i) {
    EXPECT_EQ(is[i], i);
  }
  EXPECT_EQ(SummaryIn(j->out)["hits"], 20) << j->out;
  EXPECT_EQ(SummaryIn(k->out)["events"], 20) << k->out << k->err;
}

TEST(GdbServer, APortInUseIsNamedAndNoTargetIsStarted) {
  core::UniqueFd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  ASSERT_TRUE(s.valid());
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(::listen(s.get(), 1), 0);
  socklen_t len = sizeof(a);
  ASSERT_EQ(::getsockname(s.get(), reinterpret_cast<sockaddr*>(&a), &len), 0);
  const int port = ntohs(a.sin_port);
  absl::StatusOr<RunResult> r =
      ::kwatch::testing::Run({KwatchPath(), "gdbserver", "--listen",
                              absl::StrCat("127.0.0.1:", port), "--", TargetPath("gdb_target")});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->exit_code, 1);
  EXPECT_THAT(r->err, HasSubstr(absl::StrCat("port ", port, " is in use"))) << r->err;
  EXPECT_THAT(r->out, Not(HasSubstr("counter"))) << r->out;  // the program never ran
}

// A raw client: sends `payload` framed and returns the next reply's payload.
class RawClient {
 public:
  explicit RawClient(int port) : fd_(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    connected_ = ::connect(fd_.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  }
  bool connected() const { return connected_; }
  void SendRaw(const std::string& bytes) {
    ASSERT_EQ(::write(fd_.get(), bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  }
  // The next frame kwatch sends.
  watch::gdb::Frame Next() {
    while (frames_.empty()) {
      char buf[4096];
      const ssize_t n = ::read(fd_.get(), buf, sizeof(buf));
      if (n <= 0) {
        return {watch::gdb::Frame::Kind::kMalformed, "<closed>"};
      }
      std::vector<watch::gdb::Frame> got;
      decoder_.Feed(std::string(buf, static_cast<size_t>(n)), got);
      frames_.insert(frames_.end(), got.begin(), got.end());
    }
    watch::gdb::Frame f = frames_.front();
    frames_.erase(frames_.begin());
    return f;
  }
  // Sends a packet and returns the reply's payload (after kwatch's '+').
  std::string Ask(const std::string& payload) {
    SendRaw(watch::gdb::EncodePacket(payload));
    EXPECT_EQ(Next().kind, watch::gdb::Frame::Kind::kAck) << payload;
    watch::gdb::Frame f = Next();
    SendRaw("+");
    return f.payload;
  }

 private:
  core::UniqueFd fd_;
  bool connected_ = false;
  watch::gdb::PacketDecoder decoder_;
  std::vector<watch::gdb::Frame> frames_;
};

TEST(GdbServer, MalformedPacketsGetErrorsAndTheTargetRunsOnUnharmed) {
  int port = 0;
  std::unique_ptr<Spawned> kw = ListenOnFreePort({"--", TargetPath("gdb_target"), "6"}, port);
  ASSERT_NE(kw, nullptr);
  ASSERT_GT(port, 0);
  {
    RawClient c(port);
    ASSERT_TRUE(c.connected());
    // A bad checksum is refused with '-' (gdb would send it again).
    c.SendRaw("$g#00");
    EXPECT_EQ(c.Next().kind, watch::gdb::Frame::Kind::kNack);
    EXPECT_EQ(c.Ask("m"), "E01");          // no address
    EXPECT_EQ(c.Ask("mzz,4"), "E01");      // not hex
    EXPECT_EQ(c.Ask("m0,4"), "E01");       // unmapped
    EXPECT_EQ(c.Ask("M0,2:zz"), "E01");    // bad data
    EXPECT_EQ(c.Ask("M10,4:00"), "E01");   // length and data disagree
    EXPECT_EQ(c.Ask("p999"), "E01");       // no such register
    EXPECT_EQ(c.Ask("P0=11"), "E01");      // rax has 8 bytes
    EXPECT_EQ(c.Ask("G00"), "E01");        // not every register
    EXPECT_EQ(c.Ask("Z0,zz,1"), "E01");    // bad address
    EXPECT_EQ(c.Ask("Z2,1000,0"), "E01");  // an empty watch
    EXPECT_EQ(c.Ask("Z9,1000,1"), "");     // not supported
    EXPECT_EQ(c.Ask("vCont;x"), "E01");    // no such action
    EXPECT_EQ(c.Ask("Hgzz"), "E01");
    EXPECT_EQ(c.Ask("qXfer:features:read:nope.xml:0,100"), "E00");
    EXPECT_EQ(c.Ask("vRun;abc"), "E01");
    EXPECT_EQ(c.Ask("no-such-packet"), "");
    // Still a working server over a healthy target: it runs to its end.
    EXPECT_THAT(c.Ask("?"), HasSubstr("T05thread:"));
    EXPECT_EQ(c.Ask("c"), "W07");
  }  // gdb goes: kwatch ends
  absl::StatusOr<RunResult> k = kw->Finish();
  ASSERT_TRUE(k.ok()) << k.status();
  EXPECT_EQ(k->exit_code, 7) << k->err;
  EXPECT_THAT(k->out, HasSubstr("counter 18 hits 6 misses 3")) << k->out;
}

// gdb's Ctrl-C (0x03) while the target runs stops every thread and reports SIGINT (gdb's 2);
// `k` then kills the target.
TEST(GdbServer, InterruptStopsTheRunningTargetAndKillEndsIt) {
  int port = 0;
  std::unique_ptr<Spawned> kw =
      ListenOnFreePort({"--", TargetPath("gdb_target"), "2000000000"}, port);
  ASSERT_NE(kw, nullptr);
  ASSERT_GT(port, 0);
  {
    RawClient c(port);
    ASSERT_TRUE(c.connected());
    EXPECT_THAT(c.Ask("?"), HasSubstr("T05thread:"));
    c.SendRaw(watch::gdb::EncodePacket("vCont;c"));
    EXPECT_EQ(c.Next().kind, watch::gdb::Frame::Kind::kAck);
    c.SendRaw("\x03");
    const watch::gdb::Frame stop = c.Next();
    EXPECT_EQ(stop.kind, watch::gdb::Frame::Kind::kPacket);
    EXPECT_THAT(stop.payload, HasSubstr("T02thread:")) << stop.payload;
    c.SendRaw("+");
    EXPECT_THAT(c.Ask("qfThreadInfo"), HasSubstr("m"));
    c.SendRaw(watch::gdb::EncodePacket("k"));
    EXPECT_EQ(c.Next().kind, watch::gdb::Frame::Kind::kAck);
  }
  absl::StatusOr<RunResult> k = kw->Finish();
  ASSERT_TRUE(k.ok()) << k.status();
  EXPECT_EQ(k->exit_code, 0) << k->err;
  EXPECT_THAT(k->out, Not(HasSubstr("counter"))) << k->out;  // killed before its end
}

}  // namespace
}  // namespace kwatch
