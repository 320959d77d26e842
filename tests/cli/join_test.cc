// A second kwatch on a process that a kwatch session already traces joins that session through
// its control socket (cli/join_server.h, cli/join_client.h): each kwatch counts its own watches
// exactly against field_writer's ground truth; a joiner killed with SIGKILL gives its debug
// registers back; a client of another uid is refused.
#include <linux/capability.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "tests/cli/cli_test_util.h"
#include "tests/test_util.h"
#include "tests/watch/debug_traps.h"

namespace kwatch {
namespace {

using ::kwatch::clitest::JsonRun;
using ::kwatch::clitest::ParseJsonLines;
using ::kwatch::clitest::ReadTruth;
using ::kwatch::clitest::TruthFile;
using ::kwatch::testing::KwatchPath;
using ::kwatch::testing::Spawned;
using ::kwatch::testing::TargetPath;
using ::testing::HasSubstr;

struct Totals {
  long hits = 0;
  long misses = 0;
};

Totals Sum(const std::string& truth_path) {
  Totals t;
  for (const auto& [tid, truth] : ReadTruth(truth_path)) {
    t.hits += truth.hits_w;
    t.misses += truth.misses_w;
  }
  return t;
}

std::vector<std::string> Displays(const JsonRun& run) {
  std::vector<std::string> out;
  for (const auto& w : run.summary["watches"]) {
    out.push_back(w["display"].get<std::string>());
  }
  return out;
}

// A waiting field_writer (THREADS x ITERS) and a kwatch watching g_stats.hits in it.
struct Owned {
  std::string truth_path;
  std::unique_ptr<Spawned> target;
  std::unique_ptr<Spawned> owner;
};

Owned StartOwned(const std::string& name, const std::string& threads, const std::string& iters,
                 const std::vector<std::string>& owner_options = {}) {
  Owned o;
  o.truth_path = TruthFile(name);
  auto target = Spawned::Start(
      {TargetPath("field_writer"), threads, iters, "--wait", "--truth", o.truth_path});
  EXPECT_TRUE(target.ok());
  if (!target.ok()) {
    return o;
  }
  o.target = *std::move(target);
  EXPECT_TRUE(o.target->WaitForStdout("ready").ok());
  std::vector<std::string> argv = {KwatchPath(), "--json", "-q"};
  argv.insert(argv.end(), owner_options.begin(), owner_options.end());
  for (const std::string& a : {std::string("--write"), std::string("g_stats.hits"),
                               std::string("-p"), absl::StrCat(o.target->pid())}) {
    argv.push_back(a);
  }
  auto owner = Spawned::Start(argv);
  EXPECT_TRUE(owner.ok());
  if (!owner.ok()) {
    return o;
  }
  o.owner = *std::move(owner);
  EXPECT_TRUE(o.owner->WaitForStderr("armed").ok()) << o.owner->err();
  return o;
}

// A joiner (`kwatch --json -q ARGS -p PID`) of the session `o`, run to the target's end: what
// the joiner and the owner printed, and field_writer's totals.
struct Joined {
  kwatch::testing::RunResult joiner;
  kwatch::testing::RunResult owner;
  Totals truth;
};

void RunJoinerToTheEnd(Owned& o, const std::vector<std::string>& args, Joined* out) {
  std::vector<std::string> argv = {KwatchPath(), "--json", "-q"};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.push_back("-p");
  argv.push_back(absl::StrCat(o.target->pid()));
  auto joiner = Spawned::Start(argv);
  ASSERT_TRUE(joiner.ok());
  ASSERT_TRUE((*joiner)->WaitForStderr("joined the session").ok()) << (*joiner)->err();
  ASSERT_EQ(kill(o.target->pid(), SIGUSR1), 0);
  auto jr = (*joiner)->Finish();
  auto orr = o.owner->Finish();
  ASSERT_TRUE(jr.ok() && orr.ok());
  ASSERT_TRUE(o.target->Finish().ok());
  out->joiner = *std::move(jr);
  out->owner = *std::move(orr);
  out->truth = Sum(o.truth_path);
}

TEST(KwatchJoin, TwoKwatchesEachCountTheirOwnFieldExactly) {
  KW_REQUIRE_DEBUG_TRAPS();
  Owned o = StartOwned("join", "2", "3000");
  ASSERT_NE(o.owner, nullptr);
  const std::string pid = absl::StrCat(o.target->pid());
  auto joiner =
      Spawned::Start({KwatchPath(), "--json", "-q", "--write", "g_stats.misses", "-p", pid});
  ASSERT_TRUE(joiner.ok());
  ASSERT_TRUE((*joiner)->WaitForStderr("joined the session").ok()) << (*joiner)->err();
  EXPECT_THAT((*joiner)->err(), HasSubstr("debug register DR"));  // its own register
  // `kwatch slots` shows the joiner's watch as its drmgr client's.
  auto slots = kwatch::testing::Run({KwatchPath(), "slots", "-p", pid});
  ASSERT_TRUE(slots.ok());
  EXPECT_THAT(slots->out,
              HasSubstr(absl::StrCat("g_stats.misses [joined kwatch pid ", (*joiner)->pid(), "]")))
      << slots->out;
  EXPECT_THAT(slots->out, HasSubstr("g_stats.misses")) << slots->out;
  ASSERT_EQ(kill(o.target->pid(), SIGUSR1), 0);

  auto jr = (*joiner)->Finish();
  auto orr = o.owner->Finish();
  ASSERT_TRUE(jr.ok() && orr.ok());
  ASSERT_TRUE(o.target->Finish().ok());
  const Totals truth = Sum(o.truth_path);
  ASSERT_EQ(truth.hits, 6000);
  ASSERT_EQ(truth.misses, 3000);

  EXPECT_EQ(jr->exit_code, 0) << jr->err;
  const JsonRun joined = ParseJsonLines(jr->out);
  EXPECT_EQ(joined.summary["events"], truth.misses) << jr->out;
  EXPECT_EQ(joined.summary["lost"], 0);
  EXPECT_THAT(Displays(joined), ::testing::ElementsAre("g_stats.misses"));
  ASSERT_EQ(joined.summary["watches"].size(), 1u);
  EXPECT_EQ(joined.summary["watches"][0]["writes"], truth.misses);
  EXPECT_THAT(joined.summary["stop_reason"].get<std::string>(), HasSubstr("target exited"));
  EXPECT_THAT(jr->err, HasSubstr("ended: target exited"));

  EXPECT_EQ(orr->exit_code, 0) << orr->err;
  const JsonRun owned = ParseJsonLines(orr->out);
  EXPECT_EQ(owned.summary["events"], truth.hits) << orr->out;
  EXPECT_EQ(owned.summary["lost"], 0);
  EXPECT_THAT(Displays(owned), ::testing::ElementsAre("g_stats.hits"));
  EXPECT_THAT(orr->err, HasSubstr("joined this session with watch #2 g_stats.misses"));
}

TEST(KwatchJoin, KilledJoinerGivesItsRegistersBackAndTheOwnerCountsOn) {
  KW_REQUIRE_DEBUG_TRAPS();
  Owned o = StartOwned("join-kill", "2", "2000");
  ASSERT_NE(o.owner, nullptr);
  const std::string pid = absl::StrCat(o.target->pid());
  // Three more registers: with the owner's, all four.
  auto first = Spawned::Start({KwatchPath(), "-q", "--rw", "g_stats.misses", "g_stats.flags",
                               "g_stats.inner.a", "-p", pid});
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE((*first)->WaitForStderr("armed 3 watches").ok()) << (*first)->err();
  // None is left: a fourth watch is refused, clearly, and changes nothing.
  auto full = Spawned::Start({KwatchPath(), "-q", "--write", "g_stats.inner.b", "-p", pid});
  ASSERT_TRUE(full.ok());
  auto fr = (*full)->Finish();
  ASSERT_TRUE(fr.ok());
  EXPECT_EQ(fr->exit_code, 1);
  EXPECT_THAT(fr->err, HasSubstr("no debug register left"));

  ASSERT_EQ(kill((*first)->pid(), SIGKILL), 0);
  (void)(*first)->Finish();
  ASSERT_TRUE(o.owner->WaitForStderr("went away").ok()) << o.owner->err();
  EXPECT_THAT(o.owner->err(), HasSubstr("removed, their debug registers returned"));

  // The three registers came back: three watches join again.
  auto second = Spawned::Start({KwatchPath(), "--json", "-q", "--write", "g_stats.misses",
                                "g_stats.inner.a", "g_stats.inner.b", "-p", pid});
  ASSERT_TRUE(second.ok());
  ASSERT_TRUE((*second)->WaitForStderr("armed 3 watches").ok()) << (*second)->err();
  ASSERT_EQ(kill(o.target->pid(), SIGUSR1), 0);
  auto sr = (*second)->Finish();
  auto orr = o.owner->Finish();
  ASSERT_TRUE(sr.ok() && orr.ok());
  ASSERT_TRUE(o.target->Finish().ok());
  const Totals truth = Sum(o.truth_path);
  ASSERT_EQ(truth.hits, 4000);
  const JsonRun owned = ParseJsonLines(orr->out);
  EXPECT_EQ(owned.summary["events"], truth.hits) << orr->out;
  EXPECT_EQ(owned.summary["lost"], 0);
  const JsonRun joined = ParseJsonLines(sr->out);
  EXPECT_EQ(joined.summary["events"], truth.misses) << sr->out;  // inner.a and .b: never written
  EXPECT_THAT(Displays(joined),
              ::testing::ElementsAre("g_stats.misses", "g_stats.inner.a", "g_stats.inner.b"));
}

TEST(KwatchJoin, JoinerEndsOnInterruptAndTheOwnerGoesOn) {
  KW_REQUIRE_DEBUG_TRAPS();
  Owned o = StartOwned("join-int", "1", "1000");
  ASSERT_NE(o.owner, nullptr);
  const std::string pid = absl::StrCat(o.target->pid());
  auto joiner = Spawned::Start({KwatchPath(), "--write", "g_stats.misses", "-p", pid});
  ASSERT_TRUE(joiner.ok());
  ASSERT_TRUE((*joiner)->WaitForStderr("joined the session").ok()) << (*joiner)->err();
  ASSERT_EQ(kill((*joiner)->pid(), SIGINT), 0);
  auto jr = (*joiner)->Finish();
  ASSERT_TRUE(jr.ok());
  EXPECT_EQ(jr->exit_code, 0) << jr->err;
  EXPECT_THAT(jr->out, HasSubstr("== kwatch summary: 0 events"));
  EXPECT_THAT(jr->out, HasSubstr("(interrupted by INT)"));
  ASSERT_TRUE(o.owner->WaitForStderr("that joined this session ended (interrupted by INT)").ok())
      << o.owner->err();
  ASSERT_EQ(kill(o.target->pid(), SIGUSR1), 0);
  auto orr = o.owner->Finish();
  ASSERT_TRUE(orr.ok());
  ASSERT_TRUE(o.target->Finish().ok());
  EXPECT_EQ(ParseJsonLines(orr->out).summary["events"], Sum(o.truth_path).hits);
}

// -o in a joiner: the session writes the joiner's own recording (its watches only, its command
// line), which reports the joiner's exact count; a recording that cannot be created is refused
// before anything is armed for it, and the owner counts on.
TEST(KwatchJoin, JoinerRecordsItsOwnWatchesWithO) {
  KW_REQUIRE_DEBUG_TRAPS();
  Owned o = StartOwned("join-o", "2", "2000");
  ASSERT_NE(o.owner, nullptr);
  const std::string pid = absl::StrCat(o.target->pid());
  const std::string db = absl::StrCat(::testing::TempDir(), "/joined-", getpid(), ".kwdb");
  std::filesystem::remove(db);
  auto bad = kwatch::testing::Run(
      {KwatchPath(), "-q", "--write", "g_stats.flags", "-p", pid, "-o", "/nonexistent/j.kwdb"});
  ASSERT_TRUE(bad.ok());
  EXPECT_EQ(bad->exit_code, 1);
  EXPECT_THAT(bad->err, HasSubstr("/nonexistent/j.kwdb"));
  EXPECT_THAT(bad->err, ::testing::Not(HasSubstr("joined the session")));
  Joined r;
  ASSERT_NO_FATAL_FAILURE(RunJoinerToTheEnd(o, {"--write", "g_stats.misses", "-o", db}, &r));
  ASSERT_EQ(r.truth.misses, 2000);
  EXPECT_EQ(r.joiner.exit_code, 0) << r.joiner.err;
  EXPECT_THAT(r.joiner.err, HasSubstr(absl::StrCat("recorded 2000 events to ", db)));
  EXPECT_EQ(ParseJsonLines(r.joiner.out).summary["events"], r.truth.misses);
  EXPECT_EQ(ParseJsonLines(r.owner.out).summary["events"], r.truth.hits);

  auto report = kwatch::testing::Run({KwatchPath(), "report", db, "--format=json"});
  ASSERT_TRUE(report.ok());
  ASSERT_EQ(report->exit_code, 0) << report->err;
  const nlohmann::json j = nlohmann::json::parse(report->out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << report->out;
  EXPECT_EQ(j["session"]["events"], 2000);
  EXPECT_EQ(j["session"]["complete"], true);
  EXPECT_THAT(j["session"]["command"].get<std::string>(), HasSubstr("--write g_stats.misses"));
  ASSERT_EQ(j["watches"].size(), 1u);
  EXPECT_EQ(j["watches"][0]["expr"], "g_stats.misses");
  EXPECT_EQ(j["watches"][0]["writes"], 2000);
  std::filesystem::remove(db);
}

// --if in a joiner: the owner (stop mode: exact values) filters the joiner's events with the
// joiner's condition; field_writer writes misses = i for even i < 2000 in each of 2 threads, so
// `new < 100` holds for 50 writes per thread. A perf stream session refuses `new` conditions
// clearly, and takes one on tid.
TEST(KwatchJoin, JoinerConditionFiltersItsOwnEvents) {
  KW_REQUIRE_DEBUG_TRAPS();
  Owned o = StartOwned("join-if", "2", "2000", {"--stop"});
  ASSERT_NE(o.owner, nullptr);
  Joined r;
  ASSERT_NO_FATAL_FAILURE(
      RunJoinerToTheEnd(o, {"--write", "g_stats.misses", "--if", "new < 100"}, &r));
  ASSERT_EQ(r.truth.misses, 2000);
  EXPECT_EQ(r.joiner.exit_code, 0) << r.joiner.err;
  const JsonRun joined = ParseJsonLines(r.joiner.out);
  EXPECT_EQ(joined.summary["events"], 100) << r.joiner.out;
  EXPECT_EQ(joined.summary["if"]["text"], "new < 100") << joined.summary.dump();
  EXPECT_EQ(joined.summary["if"]["evaluated"], r.truth.misses);
  EXPECT_EQ(joined.summary["if"]["matched"], 100);
  EXPECT_EQ(ParseJsonLines(r.owner.out).summary["events"], r.truth.hits);  // unfiltered
}

TEST(KwatchJoin, PerfStreamSessionRefusesValueConditionsOfJoiners) {
  KW_REQUIRE_DEBUG_TRAPS();
  Owned o = StartOwned("join-if-perf", "1", "1000");
  ASSERT_NE(o.owner, nullptr);
  const std::string pid = absl::StrCat(o.target->pid());
  auto bad = kwatch::testing::Run(
      {KwatchPath(), "-q", "--write", "g_stats.misses", "-p", pid, "--if", "new == 4"});
  ASSERT_TRUE(bad.ok());
  EXPECT_EQ(bad->exit_code, 1);
  EXPECT_THAT(bad->err, HasSubstr("--if on new or old values needs the accessing thread stopped"));
  EXPECT_THAT(bad->err, HasSubstr("perf stream mode"));
  auto syntax = kwatch::testing::Run(
      {KwatchPath(), "-q", "--write", "g_stats.misses", "-p", pid, "--if", "tid =="});
  ASSERT_TRUE(syntax.ok());
  EXPECT_EQ(syntax->exit_code, 2);  // refused by the joiner itself, as any --if
  EXPECT_THAT(syntax->err, HasSubstr("expected an operand"));
  Joined r;
  ASSERT_NO_FATAL_FAILURE(
      RunJoinerToTheEnd(o, {"--write", "g_stats.misses", "--if", "tid != 0"}, &r));
  EXPECT_EQ(ParseJsonLines(r.joiner.out).summary["events"], r.truth.misses) << r.joiner.out;
}

// (`kwatch probe` joins: tests/cli/probe_join_test.cc.)
TEST(KwatchJoin, GdbserverSaysItCannotJoinYet) {
  KW_REQUIRE_DEBUG_TRAPS();
  Owned o = StartOwned("join-probe", "1", "10");
  ASSERT_NE(o.owner, nullptr);
  const std::string pid = absl::StrCat(o.target->pid());
  auto gdb = kwatch::testing::Run({KwatchPath(), "gdbserver", "--listen", ":0", "-p", pid});
  ASSERT_TRUE(gdb.ok());
  EXPECT_EQ(gdb->exit_code, 1);
  EXPECT_THAT(gdb->err, HasSubstr("cannot join another kwatch's session yet"));
  ASSERT_EQ(kill(o.target->pid(), SIGUSR1), 0);
  ASSERT_TRUE(o.owner->Finish().ok());
  ASSERT_TRUE(o.target->Finish().ok());
}

// A kwatch of another user (nobody) cannot reach the socket (mode 0600 in a 0700 directory) and
// says who may join.
TEST(KwatchJoin, AnotherUsersKwatchIsRefused) {
  KW_REQUIRE_DEBUG_TRAPS();
  ASSERT_EQ(geteuid(), 0u) << "runs the client as nobody";
  Owned o = StartOwned("join-uid", "1", "10");
  ASSERT_NE(o.owner, nullptr);
  const std::string pid = absl::StrCat(o.target->pid());
  auto r =
      kwatch::testing::Run({"/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                            KwatchPath(), "--write", "g_stats.misses", "-p", pid});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->exit_code, 1);
  EXPECT_THAT(r->err, HasSubstr("belongs to uid 0 and this is uid 65534"));
  ASSERT_EQ(kill(o.target->pid(), SIGUSR1), 0);
  auto orr = o.owner->Finish();
  ASSERT_TRUE(orr.ok());
  ASSERT_TRUE(o.target->Finish().ok());
  EXPECT_EQ(ParseJsonLines(orr->out).summary["events"], Sum(o.truth_path).hits);
}

// A client of another uid that can open the socket anyway (CAP_DAC_OVERRIDE) is refused by the
// session itself (SO_PEERCRED), with a message; nothing is armed for it.
// Leaves a socket file at `path` as a killed session does (bound, never unlinked).
void LeaveSocketFile(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0) << path;
  close(fd);
}

// Sockets that killed sessions left over processes that are gone are removed when a session
// starts listening; one over a live process (which may be about to be replaced by its own
// session) stays.
TEST(KwatchJoin, SocketsLeftOverGoneProcessesAreRemoved) {
  KW_REQUIRE_DEBUG_TRAPS();
  ASSERT_EQ(geteuid(), 0u);
  ASSERT_FALSE(std::filesystem::exists("/run/user/0")) << "this test expects /tmp/kwatch-0";
  std::filesystem::create_directories("/tmp/kwatch-0");
  std::filesystem::permissions("/tmp/kwatch-0", std::filesystem::perms::owner_all);
  const pid_t gone = fork();
  ASSERT_GE(gone, 0);
  if (gone == 0) {
    _exit(0);
  }
  ASSERT_EQ(waitpid(gone, nullptr, 0), gone);
  const std::string stale = absl::StrCat("/tmp/kwatch-0/", gone, ".sock");
  const std::string live = absl::StrCat("/tmp/kwatch-0/", getpid(), ".sock");
  std::filesystem::remove(stale);
  std::filesystem::remove(live);
  LeaveSocketFile(stale);
  LeaveSocketFile(live);
  Owned o = StartOwned("join-stale", "1", "10");
  ASSERT_NE(o.owner, nullptr);
  EXPECT_FALSE(std::filesystem::exists(stale));
  EXPECT_TRUE(std::filesystem::exists(live));
  std::filesystem::remove(live);
  ASSERT_EQ(kill(o.target->pid(), SIGUSR1), 0);
  ASSERT_TRUE(o.owner->Finish().ok());
  ASSERT_TRUE(o.target->Finish().ok());
}

// A session that waits at --arm-at has no control socket yet: a joiner says so at once.
TEST(KwatchJoin, JoinerOfASessionWaitingAtArmAtSaysWhy) {
  KW_REQUIRE_DEBUG_TRAPS();
  auto owner = Spawned::Start({KwatchPath(), "-q", "--arm-at", "run", "--write", "g_sink", "--",
                               TargetPath("per_call"), "1", "1", "0", "--usec", "3000000"});
  ASSERT_TRUE(owner.ok());
  ASSERT_TRUE((*owner)->WaitForStderr("waiting for a thread to run").ok()) << (*owner)->err();
  pid_t target = 0;
  for (int i = 0; i < 100 && target == 0; ++i) {
    for (const auto& e : std::filesystem::directory_iterator("/proc")) {
      pid_t p = 0;
      std::ifstream status(e.path() / "status");
      std::string line;
      bool ppid = false;
      bool named = false;
      while (std::getline(status, line)) {
        named |= line == "Name:\tper_call";
        ppid |= line == absl::StrCat("PPid:\t", (*owner)->pid());
      }
      if (named && ppid && absl::SimpleAtoi(e.path().filename().string(), &p)) {
        target = p;
      }
    }
    if (target == 0) {
      usleep(20000);
    }
  }
  ASSERT_NE(target, 0);
  const auto t0 = std::chrono::steady_clock::now();
  auto r = kwatch::testing::Run(
      {KwatchPath(), "probe", "-x", TargetPath("per_call"), "recurse", "-p", absl::StrCat(target)});
  ASSERT_TRUE(r.ok());
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
  EXPECT_NE(r->exit_code, 0);
  EXPECT_THAT(r->err, HasSubstr("waits for a thread to run --arm-at run"));
  auto o = (*owner)->Finish();
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->exit_code, 0) << o->err;
}

TEST(KwatchJoin, PeerOfAnotherUidIsRefusedBySoPeercred) {
  KW_REQUIRE_DEBUG_TRAPS();
  ASSERT_EQ(geteuid(), 0u);
  Owned o = StartOwned("join-cred", "1", "10");
  ASSERT_NE(o.owner, nullptr);
  const std::string path = absl::StrCat("/tmp/kwatch-0/", o.target->pid(), ".sock");
  std::array<int, 2> pipe_fds{};
  ASSERT_EQ(pipe(pipe_fds.data()), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(pipe_fds[0]);
    // nobody, keeping CAP_DAC_OVERRIDE only.
    if (prctl(PR_SET_KEEPCAPS, 1) != 0 || setresgid(65534, 65534, 65534) != 0 ||
        setresuid(65534, 65534, 65534) != 0) {
      _exit(3);
    }
    __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
    std::array<__user_cap_data_struct, 2> data{};
    data[0].effective = data[0].permitted = 1U << CAP_DAC_OVERRIDE;
    if (syscall(SYS_capset, &hdr, data.data()) != 0) {
      _exit(4);
    }
    const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      _exit(5);
    }
    const std::string req = "kwatch-join 1\nkind write\nexpr g_stats.misses\ngo\n";
    (void)!write(fd, req.data(), req.size());
    char buf[4096];
    ssize_t n = 0;
    while ((n = read(fd, buf, sizeof(buf))) > 0) {
      (void)!write(pipe_fds[1], buf, static_cast<size_t>(n));
    }
    _exit(0);
  }
  close(pipe_fds[1]);
  std::string got;
  char buf[4096];
  ssize_t n = 0;
  while ((n = read(pipe_fds[0], buf, sizeof(buf))) > 0) {
    got.append(buf, static_cast<size_t>(n));
  }
  close(pipe_fds[0]);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0) << "3: setuid, 4: capset, 5: connect failed";
  EXPECT_THAT(got, HasSubstr("uid 65534 may not join it"));
  EXPECT_THAT(got, ::testing::Not(HasSubstr("joined")));
  ASSERT_TRUE(o.owner->WaitForStderr("refused pid").ok()) << o.owner->err();
  ASSERT_EQ(kill(o.target->pid(), SIGUSR1), 0);
  auto orr = o.owner->Finish();
  ASSERT_TRUE(orr.ok());
  ASSERT_TRUE(o.target->Finish().ok());
  EXPECT_EQ(ParseJsonLines(orr->out).summary["events"], Sum(o.truth_path).hits);
}

}  // namespace
}  // namespace kwatch
