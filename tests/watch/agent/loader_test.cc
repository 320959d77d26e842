#include "watch/agent/loader.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "agent/abi.h"
#include "core/ptrace/process.h"
#include "tests/test_util.h"

namespace kwatch::watch::agent {
namespace {

namespace ka = kwatch::agent;
using ::testing::HasSubstr;

std::string StubAgent() {
  return kwatch::testing::TargetPath("libkwatch-stub-agent.so");
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string OutFile(const std::string& what) {
  return ::testing::TempDir() + "agent_loader_" + what + "_" + std::to_string(::getpid());
}

// The fds of `pid` and what each is ("pipe:[123]", "/dev/null", ...).
std::set<std::string> Fds(pid_t pid) {
  std::set<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(absl::StrCat("/proc/", pid, "/fd"))) {
    std::error_code ec;
    out.insert(e.path().filename().string() + " " +
               std::filesystem::read_symlink(e.path(), ec).string());
  }
  return out;
}

// The mappings of `pid` as "perms path", the heap left out (dlopen may grow it).
std::multiset<std::string> Mappings(pid_t pid) {
  std::multiset<std::string> out;
  auto maps = core::ptrace::ReadMaps(pid);
  EXPECT_TRUE(maps.ok());
  for (const core::ptrace::MapEntry& m : *maps) {
    if (m.path == "[heap]") {
      continue;
    }
    out.insert(absl::StrCat(m.read ? "r" : "-", m.write ? "w" : "-", m.exec ? "x" : "-", " ",
                            m.end - m.start, " ", m.path));
  }
  return out;
}

void RunToExit(core::ptrace::Process& p) {
  while (p.alive()) {
    auto events = p.Poll(/*block=*/true);
    ASSERT_TRUE(events.ok()) << events.status();
  }
}

std::unique_ptr<core::ptrace::Process> LaunchAtEntry(const std::vector<std::string>& argv) {
  auto p = core::ptrace::Process::Start(std::nullopt, argv, {});
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? std::move(*p) : nullptr;
}

TEST(FindAgentLibrary, LooksNextToTheBinaryThenInTheInstallLayout) {
  ASSERT_EQ(::unsetenv("KWATCH_AGENT"), 0);
  const std::filesystem::path root =
      std::filesystem::path(::testing::TempDir()) / absl::StrCat("agent_find_", ::getpid());
  std::filesystem::remove_all(root);
  std::filesystem::create_directories(root / "bin");
  std::filesystem::create_directories(root / "lib" / "kwatch");
  const std::string exe = (root / "bin" / "kwatch").string();
  std::ofstream(exe) << "";
  // Nothing there yet: the build tree's library when this tree builds one (last), else the
  // error names every place.
  auto none = FindAgentLibrary(exe);
#ifdef KWATCH_AGENT_LIBRARY
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(std::filesystem::canonical(*none), std::filesystem::canonical(KWATCH_AGENT_LIBRARY));
#else
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(none.status().message()),
              HasSubstr((root / "bin" / "libkwatch-agent.so").string()));
  EXPECT_THAT(std::string(none.status().message()),
              HasSubstr((root / "lib" / "kwatch" / "libkwatch-agent.so").string()));
#endif
  // The install layout.
  std::ofstream((root / "lib" / "kwatch" / "libkwatch-agent.so").string()) << "x";
  auto installed = FindAgentLibrary(exe);
  ASSERT_TRUE(installed.ok()) << installed.status();
  EXPECT_EQ(*installed, (root / "lib" / "kwatch" / "libkwatch-agent.so").string());
  // Next to the binary (the build tree) comes first.
  std::ofstream((root / "bin" / "libkwatch-agent.so").string()) << "x";
  auto beside = FindAgentLibrary(exe);
  ASSERT_TRUE(beside.ok());
  EXPECT_EQ(*beside, (root / "bin" / "libkwatch-agent.so").string());
  // KWATCH_AGENT wins, and must exist.
  ASSERT_EQ(::setenv("KWATCH_AGENT", "/nonexistent/libagent.so", 1), 0);
  auto missing = FindAgentLibrary(exe);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()),
              HasSubstr("KWATCH_AGENT=/nonexistent/libagent.so"));
  ASSERT_EQ(::unsetenv("KWATCH_AGENT"), 0);
  std::filesystem::remove_all(root);
}

TEST(FindDlopen, InGlibcAndRefusedInAStaticProgram) {
  auto proc = LaunchAtEntry(
      {kwatch::testing::TargetPath("remote_call"), "count", "1", "--out", "/dev/null"});
  ASSERT_NE(proc, nullptr);
  auto maps = proc->Maps();
  ASSERT_TRUE(maps.ok());
  auto site = FindDlopen(*proc, *maps);
  ASSERT_TRUE(site.ok()) << site.status();
  EXPECT_THAT(site->libc, HasSubstr("libc.so.6"));
  EXPECT_FALSE(site->libc_dlopen_mode);
  auto m = core::ptrace::FindMapping(*maps, site->dlopen);
  ASSERT_TRUE(m.has_value());
  EXPECT_TRUE(m->exec);
  EXPECT_EQ(m->path, site->libc);
  EXPECT_NE(site->dlerror.value, 0u);
  EXPECT_NE(site->dlclose.value, 0u);
  ASSERT_TRUE(proc->Kill().ok());

  auto stat = LaunchAtEntry(
      {kwatch::testing::TargetPath("remote_call_static"), "count", "1", "--out", "/dev/null"});
  ASSERT_NE(stat, nullptr);
  auto smaps = stat->Maps();
  ASSERT_TRUE(smaps.ok());
  auto refused = FindDlopen(*stat, *smaps);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("statically linked"));
  // LoadAgent says the same, and leaves the program as it was.
  auto load = LoadAgent(*stat, LoadOptions{.agent_path = StubAgent()});
  EXPECT_EQ(load.status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(stat->Kill().ok());
}

TEST(LoadAgent, AtTheEntryPointMapsTheMemoryTakesTheLifelineAndCallsInit) {
  const std::string out = OutFile("launch");
  auto proc =
      LaunchAtEntry({kwatch::testing::TargetPath("remote_call"), "count", "4", "--out", out});
  ASSERT_NE(proc, nullptr);
  const pid_t pid = proc->pid();
  const std::set<std::string> fds_before = Fds(pid);
  auto agent = LoadAgent(*proc, LoadOptions{.agent_path = StubAgent(),
                                            .shm = ShmConfig{.probe_capacity = 8,
                                                             .code_capacity = 64,
                                                             .thread_capacity = 4,
                                                             .ring_bytes = 4096}});
  ASSERT_TRUE(agent.ok()) << agent.status();
  EXPECT_EQ(agent->thread, pid);
  std::printf("load at launch (stub agent): total %s: thread %s, setup %s, dlopen %s, init %s\n",
              absl::FormatDuration(agent->timings.total).c_str(),
              absl::FormatDuration(agent->timings.pick).c_str(),
              absl::FormatDuration(agent->timings.setup).c_str(),
              absl::FormatDuration(agent->timings.dlopen).c_str(),
              absl::FormatDuration(agent->timings.init).c_str());

  // The control block, as kwatch wrote it and as the stub filled it.
  const auto* c = static_cast<const ka::KwControl*>(agent->shm.get());
  EXPECT_EQ(c->magic, ka::kKwMagic);
  EXPECT_EQ(c->target_pid, pid);
  EXPECT_EQ(c->controller_pid, ::getpid());
  EXPECT_EQ(c->state.load(), ka::kKwStateInit);
  EXPECT_EQ(c->agent_base, agent->agent_base.value);
  auto maps = proc->Maps();
  ASSERT_TRUE(maps.ok());
  auto stub = core::ptrace::FindMapping(*maps, core::RemoteAddr{c->jump_entry});
  ASSERT_TRUE(stub.has_value());
  EXPECT_EQ(stub->path, std::filesystem::canonical(StubAgent()).string());
  // The target's mapping of the memfd is kwatch's: what one writes the other reads.
  bool shared = false;
  for (const core::ptrace::MapEntry& m : *maps) {
    if (m.start == agent->remote_shm) {
      shared = m.shared && m.write && m.path == "/memfd:kwatch-agent (deleted)" &&
               m.end - m.start == agent->layout.total_size;
    }
  }
  EXPECT_TRUE(shared);
  uint64_t word = 0;
  ASSERT_TRUE(
      proc->ReadMemory(agent->remote_shm, std::span<uint8_t>(reinterpret_cast<uint8_t*>(&word), 8))
          .ok());
  EXPECT_EQ(word, ka::kKwMagic);

  // One new fd in the target: the lifeline's read end, >= 1000, close-on-exec.
  std::set<std::string> fds_after = Fds(pid);
  std::vector<std::string> added;
  std::set_difference(fds_after.begin(), fds_after.end(), fds_before.begin(), fds_before.end(),
                      std::back_inserter(added));
  ASSERT_EQ(added.size(), 1u) << ::testing::PrintToString(added);
  EXPECT_EQ(agent->remote_lifeline, static_cast<int>(c->lifeline_fd));
  EXPECT_GE(agent->remote_lifeline, 1000);
  EXPECT_THAT(added[0], HasSubstr(absl::StrCat(agent->remote_lifeline, " pipe:[")));
  EXPECT_THAT(ReadFile(absl::StrCat("/proc/", pid, "/fdinfo/", agent->remote_lifeline)),
              HasSubstr("flags:\t02000000"));  // O_CLOEXEC, read end
  // kwatch holds the only write end: alive, no POLLERR.
  pollfd pfd{.fd = agent->lifeline.get(), .events = 0, .revents = 0};
  EXPECT_EQ(::poll(&pfd, 1, 0), 0);

  // The program runs as it would have; its end closes the read end.
  ASSERT_TRUE(proc->ResumeAll().ok());
  RunToExit(*proc);
  EXPECT_EQ(proc->exit_info()->ShellStatus(), 0);
  EXPECT_EQ(ReadFile(out), "tick 0\ntick 1\ntick 2\ntick 3\nsum 14\n");
  EXPECT_EQ(::poll(&pfd, 1, 0), 1);
  EXPECT_NE(pfd.revents & POLLERR, 0);
  std::remove(out.c_str());
}

TEST(LoadAgent, AFailedLoadLeavesNothingBehind) {
  const std::string out = OutFile("undo");
  auto proc =
      LaunchAtEntry({kwatch::testing::TargetPath("remote_call"), "count", "2", "--out", out});
  ASSERT_NE(proc, nullptr);
  const pid_t pid = proc->pid();
  const std::set<std::string> fds = Fds(pid);
  const std::multiset<std::string> maps = Mappings(pid);

  // init refuses (the stub's test knob): dlclose, fds closed, mappings gone.
  LoadOptions refuse{.agent_path = StubAgent(),
                     .shm = ShmConfig{.thread_capacity = 2, .ring_bytes = 4096}};
  refuse.shm.flags = 1u << 31;
  auto r = LoadAgent(*proc, refuse);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("kwatch_agent_init"));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("returned -95"));
  EXPECT_EQ(Fds(pid), fds);
  EXPECT_EQ(Mappings(pid), maps);

  // dlopen refuses a library with a symbol nothing defines, and says why (dlerror).
  auto d = LoadAgent(
      *proc, LoadOptions{.agent_path = kwatch::testing::TargetPath("libkwatch-stub-unresolved.so"),
                         .shm = ShmConfig{.thread_capacity = 2, .ring_bytes = 4096}});
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(std::string(d.status().message()), HasSubstr("dlopen("));
  EXPECT_THAT(std::string(d.status().message()),
              HasSubstr("undefined symbol: kwatch_stub_missing"));
  EXPECT_EQ(Fds(pid), fds);
  EXPECT_EQ(Mappings(pid), maps);

  // A file that is no library is refused before anything happens in the target.
  const std::string junk = OutFile("junk.so");
  std::ofstream(junk) << "not an ELF file";
  auto j = LoadAgent(*proc, LoadOptions{.agent_path = junk});
  std::remove(junk.c_str());
  ASSERT_FALSE(j.ok());
  EXPECT_THAT(std::string(j.status().message()), HasSubstr("not an ELF file"));
  EXPECT_EQ(Fds(pid), fds);
  EXPECT_EQ(Mappings(pid), maps);

  ASSERT_TRUE(proc->ResumeAll().ok());
  RunToExit(*proc);
  EXPECT_EQ(proc->exit_info()->ShellStatus(), 0);
  EXPECT_EQ(ReadFile(out), "tick 0\ntick 1\nsum 1\n");
  std::remove(out.c_str());
}

TEST(LoadAgent, IntoAnAttachedFourThreadProgram) {
  auto target =
      kwatch::testing::Spawned::Start({kwatch::testing::TargetPath("remote_call"), "threads", "3"});
  ASSERT_TRUE(target.ok());
  ASSERT_TRUE((*target)->WaitForStdout("ready").ok());
  auto proc = core::ptrace::Process::Attach((*target)->pid());
  ASSERT_TRUE(proc.ok()) << proc.status();
  ASSERT_TRUE((*proc)->StopAll().ok());
  EXPECT_EQ((*proc)->TracedThreads().size(), 4u);
  auto agent =
      LoadAgent(**proc, LoadOptions{.agent_path = StubAgent(),
                                    .shm = ShmConfig{.thread_capacity = 8, .ring_bytes = 4096}});
  ASSERT_TRUE(agent.ok()) << agent.status();
  std::printf(
      "load at attach, 4 threads (stub agent): total %s: thread %s, setup %s, dlopen %s, "
      "init %s (thread %d)\n",
      absl::FormatDuration(agent->timings.total).c_str(),
      absl::FormatDuration(agent->timings.pick).c_str(),
      absl::FormatDuration(agent->timings.setup).c_str(),
      absl::FormatDuration(agent->timings.dlopen).c_str(),
      absl::FormatDuration(agent->timings.init).c_str(), agent->thread);
  const auto* c = static_cast<const ka::KwControl*>(agent->shm.get());
  EXPECT_EQ(c->agent_base, agent->agent_base.value);
  // The three workers block SIGUSR1 (the program's own choice), main does not.
  auto blocking = ThreadsBlocking((*target)->pid(), SIGUSR1);
  ASSERT_TRUE(blocking.ok());
  std::vector<pid_t> workers = (*proc)->TracedThreads();
  std::sort(workers.begin(), workers.end());
  workers.erase(std::find(workers.begin(), workers.end(), (*target)->pid()));
  EXPECT_EQ(*blocking, workers);
  ASSERT_TRUE((*proc)->Detach().ok());
  ::kill((*target)->pid(), SIGUSR1);
  auto done = (*target)->Finish();
  ASSERT_TRUE(done.ok());
  EXPECT_EQ(done->exit_code, 0);
  EXPECT_EQ(done->out, "ready\njoined 3\n");
}

// A thread inside dl_iterate_phdr holds the loader's lock: dlopen there would deadlock.
TEST(PickLoadThread, RefusesAThreadInsideTheLoaderAndTakesAnother) {
  for (const int workers : {1, 0}) {
    auto target = kwatch::testing::Spawned::Start(
        {kwatch::testing::TargetPath("remote_call"), "dliter", std::to_string(workers)});
    ASSERT_TRUE(target.ok());
    ASSERT_TRUE((*target)->WaitForStdout("ready").ok());
    auto proc = core::ptrace::Process::Attach((*target)->pid());
    ASSERT_TRUE(proc.ok()) << proc.status();
    ASSERT_TRUE((*proc)->StopAll().ok());
    auto picked = PickLoadThread(**proc);
    if (workers == 1) {
      ASSERT_TRUE(picked.ok()) << picked.status();
      EXPECT_NE(*picked, (*target)->pid());
    } else {
      ASSERT_FALSE(picked.ok());
      EXPECT_EQ(picked.status().code(), absl::StatusCode::kFailedPrecondition);
      EXPECT_THAT(std::string(picked.status().message()),
                  HasSubstr(absl::StrCat("thread ", (*target)->pid(),
                                         " is inside dl_iterate_phdr (libc)")));
    }
    // SIGUSR1 while the target is stopped: its handler runs before the loop in the callback
    // checks again. Sent after the detach, it could land between that check and pause(), and
    // the target would wait forever (once in a full ctest under load).
    ASSERT_EQ(::kill((*target)->pid(), SIGUSR1), 0);
    ASSERT_TRUE((*proc)->Detach().ok());
    auto done = (*target)->Finish();
    ASSERT_TRUE(done.ok());
    EXPECT_EQ(done->out, absl::StrCat("ready\njoined ", workers, "\n"));
  }
}

}  // namespace
}  // namespace kwatch::watch::agent
