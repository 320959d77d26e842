// Programs in containers (issue 28): a target in its own mount and pid namespaces, chroot'ed
// into a tmpfs that holds only the program, its libraries and /proc (the program, libraries
// and kwatch's agent exist nowhere else in its filesystem), watched and probed from outside
// with exact counts, pids shown both ways; and a file replaced at the path the process maps
// refused by its build-id. Made with unshare(1), no container runtime.
#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "tests/cli/cli_test_util.h"
#include "tests/test_util.h"
#include "tests/watch/debug_traps.h"

namespace kwatch::clitest {
namespace {

using ::kwatch::testing::Spawned;
using ::kwatch::testing::TargetPath;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr int kThreads = 3;
constexpr int kIters = 500;

// The libraries `program` loads, from ldd.
std::vector<std::string> Libraries(const std::string& program) {
  auto r = ::kwatch::testing::Run({"/usr/bin/ldd", program});
  std::vector<std::string> out;
  if (!r.ok()) {
    ADD_FAILURE() << r.status();
    return out;
  }
  for (absl::string_view word : absl::StrSplit(r->out, absl::ByAnyChar(" \t\n"))) {
    if (!word.empty() && word[0] == '/') {
      out.emplace_back(word);
    }
  }
  return out;
}

// The first child of `pid` (0 if none yet).
pid_t ChildOf(pid_t pid) {
  std::ifstream children(absl::StrCat("/proc/", pid, "/task/", pid, "/children"));
  pid_t child = 0;
  children >> child;
  return child;
}

// field_writer THREADS ITERS --wait, run as /fw in a container: new mount and pid namespaces,
// the root a tmpfs on the namespace's /mnt.
class Container {
 public:
  static std::unique_ptr<Container> Start() {
    const std::string prog = TargetPath("field_writer");
    std::string copy_libs;
    for (const std::string& lib : Libraries(prog)) {
      absl::StrAppend(&copy_libs, "mkdir -p /mnt$(dirname ", lib, ") && cp ", lib, " /mnt", lib,
                      " && ");
    }
    const std::string script =
        absl::StrCat("mount -t tmpfs kwatch-ctr /mnt && mkdir /mnt/proc && ", copy_libs, "cp ",
                     prog, " /mnt/fw && mount -t proc proc /mnt/proc && exec chroot /mnt /fw ",
                     kThreads, " ", kIters, " --wait");
    auto c = std::make_unique<Container>();
    auto s = Spawned::Start({"/usr/bin/unshare", "--mount", "--pid", "--fork", "--kill-child",
                             "--propagation", "private", "sh", "-c", script});
    if (!s.ok()) {
      ADD_FAILURE() << s.status();
      return nullptr;
    }
    c->unshare = std::move(*s);
    if (absl::Status ready = c->unshare->WaitForStdout("ready"); !ready.ok()) {
      ADD_FAILURE() << ready << "; stderr: " << c->unshare->err();
      return nullptr;
    }
    c->pid = ChildOf(c->unshare->pid());
    EXPECT_NE(c->pid, 0);
    return c;
  }

  // Lets the workers run.
  void Go() const { ::kill(pid, SIGUSR1); }

  // Waits for the end, then the program's own count of its writes (stdout).
  long Writes() {
    auto done = unshare->Finish();
    if (!done.ok()) {
      ADD_FAILURE() << done.status();
      return -1;
    }
    EXPECT_EQ(done->exit_code, 0) << done->err;
    long writes = 0;
    for (absl::string_view line : absl::StrSplit(done->out, '\n', absl::SkipEmpty())) {
      const json j = json::parse(line, nullptr, false);
      if (!j.is_discarded() && j.contains("hits_w")) {
        writes += j["hits_w"].get<long>();
      }
    }
    return writes;
  }

  std::unique_ptr<Spawned> unshare;
  pid_t pid = 0;  // kwatch's pid of /fw; 1 in its namespace
};

// kwatch ARGS against the container's program: started, armed, the program let go, finished.
RunResult RunOn(Container& c, const std::vector<std::string>& args, long* writes) {
  std::vector<std::string> argv = {KwatchPath()};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.insert(argv.end(), {"-p", std::to_string(c.pid)});
  auto k = Spawned::Start(argv);
  if (!k.ok()) {
    ADD_FAILURE() << k.status();
    return {};
  }
  if (absl::Status armed = (*k)->WaitForStderr("armed"); !armed.ok()) {
    ADD_FAILURE() << armed << ": " << (*k)->err();
    return {};
  }
  c.Go();
  auto r = (*k)->Finish();  // kwatch's output read as it comes, until the program ends
  *writes = c.Writes();
  if (!r.ok()) {
    ADD_FAILURE() << r.status();
    return {};
  }
  return *r;
}

TEST(Container, TheProgramRunsAsPidOneOfItsOwnFilesystem) {
  auto c = Container::Start();
  ASSERT_NE(c, nullptr);
  EXPECT_THAT(c->unshare->out(), HasSubstr("ready 1\n"));
  // Its files are not kwatch's: maps names /mnt/fw, which kwatch's filesystem does not have.
  std::ifstream maps(absl::StrCat("/proc/", c->pid, "/maps"));
  std::string text((std::istreambuf_iterator<char>(maps)), std::istreambuf_iterator<char>());
  EXPECT_THAT(text, HasSubstr("/mnt/fw"));
  EXPECT_NE(::access("/mnt/fw", F_OK), 0);
  c->Go();
  EXPECT_EQ(c->Writes(), kThreads * kIters);
}

class ContainerWatch : public ::testing::TestWithParam<std::string> {};

TEST_P(ContainerWatch, EveryWriteIsCountedAndThePidShownBothWays) {
  if (GetParam() != "page") {
    KW_REQUIRE_DEBUG_TRAPS();
  }
  auto c = Container::Start();
  ASSERT_NE(c, nullptr);
  const std::string rec =
      absl::StrCat(::testing::TempDir(), "/ctr-", GetParam(), getpid(), ".kwdb");
  std::remove(rec.c_str());
  long writes = 0;
  std::vector<std::string> args = {"--write", "g_stats.hits", "--json", "-o", rec};
  if (GetParam() == "stop") {
    args.emplace_back("--stop");
  } else {
    args.insert(args.end(), {"--backend", GetParam()});
  }
  const RunResult r = RunOn(*c, args, &writes);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(writes, kThreads * kIters);
  EXPECT_THAT(r.err, HasSubstr(absl::StrCat("armed 1 watch on pid ", c->pid,
                                            " (1 in its namespace) (/fw)")));
  const JsonRun run = ParseJsonLines(r.out);
  ASSERT_EQ(run.events.size(), static_cast<size_t>(kThreads * kIters));
  const int line = SourceLine("g_stats.hits = i;");
  for (const json& e : run.events) {
    ASSERT_EQ(e["pid"], c->pid);
    ASSERT_EQ(e["ns_pid"], 1);
    ASSERT_EQ(e["access"], "w");
    ASSERT_EQ(e["function"], "Work");  // the symbols of /fw, read through the process's root
    ASSERT_EQ(e["line"], line);
  }
  // The recording keeps both.
  const RunResult text = RunKwatch({"report", rec});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_THAT(text.out, HasSubstr(absl::StrCat("target    pid ", c->pid, " (1 in its namespace)")));
  const RunResult j = RunKwatch({"report", "--format", "json", rec});
  ASSERT_EQ(j.exit_code, 0) << j.err;
  const json report = json::parse(j.out);
  EXPECT_EQ(report["session"]["pid"], c->pid);
  EXPECT_EQ(report["session"]["ns_pid"], 1);
  std::remove(rec.c_str());
}

INSTANTIATE_TEST_SUITE_P(Backends, ContainerWatch, ::testing::Values("perf", "stop", "page"),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

class ContainerProbe : public ::testing::TestWithParam<std::string> {};

TEST_P(ContainerProbe, EveryCallIsCountedAndLabelledWithThePid) {
  auto c = Container::Start();
  ASSERT_NE(c, nullptr);
  long writes = 0;
  const RunResult r = RunOn(*c, {"probe", "--backend", GetParam(), "--json", "Work"}, &writes);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(writes, kThreads * kIters);
  EXPECT_THAT(r.err,
              HasSubstr(absl::StrCat("armed 1 probe on pid ", c->pid, " (1 in its namespace)")));
  if (GetParam() == "agent") {
    // The agent's file is not in the container: a copy is loaded, and the user is told.
    EXPECT_THAT(r.err, HasSubstr("the agent was loaded from a copy in a memfd (the target's "
                                 "filesystem has no "));
  } else {
    EXPECT_THAT(r.err, Not(HasSubstr("memfd")));
  }
  int hits = 0;
  for (absl::string_view line : absl::StrSplit(r.out, '\n', absl::SkipEmpty())) {
    const json h = json::parse(line);
    if (h["type"] != "hit") {
      continue;
    }
    ++hits;
    EXPECT_EQ(h["pid"], c->pid) << line;
    EXPECT_EQ(h["ns_pid"], 1) << line;
    EXPECT_EQ(h["function"], "Work");
  }
  EXPECT_EQ(hits, kThreads);  // Work runs once per worker
}

INSTANTIATE_TEST_SUITE_P(Backends, ContainerProbe, ::testing::Values("ptrace", "agent", "uprobe"),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

// A program in its own mount namespace, whose file at the path it maps is then replaced (a
// bind mount over it): that file is not the one it runs.
TEST(Container, AnotherFileAtTheMappedPathIsRefusedByItsBuildId) {
  const std::string prog = TargetPath("field_writer");
  auto s = Spawned::Start({"/usr/bin/unshare", "--mount", "--propagation", "private", "sh", "-c",
                           absl::StrCat("mount -t tmpfs kwatch-ctr /mnt && cp ", prog,
                                        " /mnt/fw && exec /mnt/fw 1 100 --wait")});
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_TRUE((*s)->WaitForStdout("ready").ok()) << (*s)->err();
  const pid_t pid = (*s)->pid();
  auto bound =
      ::kwatch::testing::Run({"/usr/bin/nsenter", "--mount", absl::StrCat("--target=", pid),
                              "mount", "--bind", TargetPath("layouts"), "/mnt/fw"});
  ASSERT_TRUE(bound.ok() && bound->exit_code == 0) << (bound.ok() ? bound->err : "");
  // Without the capability to open the mapping itself, nothing else is left.
  auto r = ::kwatch::testing::Run({"/usr/bin/setpriv", "--bounding-set",
                                   "-sys_admin,-checkpoint_restore", "--inh-caps",
                                   "-sys_admin,-checkpoint_restore", KwatchPath(), "--write",
                                   "g_stats.hits", "-q", "-p", std::to_string(pid)});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NE(r->exit_code, 0) << r->err;
  EXPECT_THAT(r->err, HasSubstr(absl::StrCat("no variable 'g_stats' in fw (no file: /proc/", pid,
                                             "/root/mnt/fw: not the file the process maps "
                                             "(build-id ")));
  EXPECT_THAT(r->err, HasSubstr("(reading a mapping needs CAP_SYS_ADMIN or "
                                "CAP_CHECKPOINT_RESTORE)"));
  // With it, the mapping itself is read: the right symbols, every write.
  auto k = Spawned::Start({KwatchPath(), "--write", "g_stats.hits", "--backend", "page", "--json",
                           "-p", std::to_string(pid)});
  ASSERT_TRUE(k.ok());
  ASSERT_TRUE((*k)->WaitForStderr("armed").ok()) << (*k)->err();
  ::kill(pid, SIGUSR1);
  auto done = (*s)->Finish();
  ASSERT_TRUE(done.ok());
  EXPECT_EQ(done->exit_code, 0);
  auto watched = (*k)->Finish();
  ASSERT_TRUE(watched.ok());
  EXPECT_EQ(watched->exit_code, 0) << watched->err;
  EXPECT_EQ(ParseJsonLines(watched->out).events.size(), 100u);
}

}  // namespace
}  // namespace kwatch::clitest

namespace kwatch::clitest {
namespace {

// kwatch itself in a container that dropped CAP_SYS_PTRACE (as Docker and podman do): the
// refusal names the capability and the flag that gives it back.
TEST(Container, KwatchWithoutPtraceCapabilityNamesTheFlagThatGivesItBack) {
  auto target = Spawned::Start({TargetPath("field_writer"), "1", "10", "--wait"});
  ASSERT_TRUE(target.ok());
  ASSERT_TRUE((*target)->WaitForStdout("ready").ok());
  auto r = ::kwatch::testing::Run({"/usr/bin/setpriv", "--bounding-set", "-sys_ptrace",
                                   "--inh-caps", "-sys_ptrace", KwatchPath(), "--write",
                                   "g_stats.hits", "-p", std::to_string((*target)->pid())});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NE(r->exit_code, 0);
  EXPECT_THAT(r->err,
              HasSubstr(absl::StrCat("ptrace(PTRACE_SEIZE, ", (*target)->pid(),
                                     "): Operation not permitted; kwatch runs as root without "
                                     "CAP_SYS_PTRACE (a container runtime drops it: `docker run "
                                     "--cap-add SYS_PTRACE`")));
  // The target was not touched.
  ::kill((*target)->pid(), SIGUSR1);
  auto done = (*target)->Finish();
  ASSERT_TRUE(done.ok());
  EXPECT_EQ(done->exit_code, 0);
}

}  // namespace
}  // namespace kwatch::clitest
