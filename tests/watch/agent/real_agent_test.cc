// The controller with the real libkwatch-agent.so (agent/, built when the tree has it: CMake
// defines KWATCH_AGENT_LIBRARY then). The other tests use a stand-in library.

#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "agent/abi.h"
#include "core/probe/insn_fixup.h"
#include "core/ptrace/process.h"
#include "core/symbols/symbols.h"
#include "tests/test_util.h"
#include "watch/agent/controller.h"
#include "watch/agent/int3_plan.h"

#ifdef KWATCH_AGENT_LIBRARY

namespace kwatch::watch::agent {
namespace {

namespace ka = kwatch::agent;
using core::RemoteAddr;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

LoadOptions RealAgent() {
  return LoadOptions{.agent_path = KWATCH_AGENT_LIBRARY,
                     .shm = ShmConfig{.probe_capacity = 16,
                                      .code_capacity = 256,
                                      .thread_capacity = 8,
                                      .ring_bytes = 64 * 1024}};
}

RemoteAddr Fn(pid_t pid, const std::string& name) {
  auto symbols = core::symbols::Symbols::ForProcess(pid);
  EXPECT_TRUE(symbols.ok());
  auto f = (*symbols)->FindFunction(name);
  EXPECT_TRUE(f.has_value()) << name;
  return f.has_value() ? f->start : RemoteAddr{};
}

// An INT3 probe on add6's first instruction recording %rdi.
absl::StatusOr<uint32_t> ProbeAdd6(Controller& ctl, core::ptrace::Process& proc, RemoteAddr add6) {
  std::vector<uint8_t> code(15);
  if (absl::Status s = proc.ReadMemory(add6, code); !s.ok()) {
    return s;
  }
  auto insn = core::probe::AnalyzeProbedInsn(code, add6);
  if (!insn.ok()) {
    return insn.status();
  }
  ProbeEntry e;
  e.id = 7;
  e.addr = add6;
  e.program = {ka::KwFetchOp{.op = ka::kKwOpBeginArg, .a = 0, .b = 0, .imm = 0},
               ka::KwFetchOp{.op = ka::kKwOpReg, .a = ka::kKwRdi, .b = 8, .imm = 0},
               ka::KwFetchOp{.op = ka::kKwOpStoreAcc, .a = 0, .b = 8, .imm = 0}};
  e.record_bytes = sizeof(ka::KwArgHeader) + 8;
  if (absl::Status s = PlanInt3(ctl, proc, *insn, e); !s.ok()) {
    return s;
  }
  auto index = ctl.AddProbe(e);
  if (!index.ok()) {
    return index;
  }
  const uint8_t cc = 0xcc;
  if (absl::Status s = ctl.Patch(proc, *index, add6, std::span<const uint8_t>(&cc, 1)); !s.ok()) {
    return s;
  }
  return index;
}

// Until the program says it waits for SIGUSR1 (its handler is in place).
void WaitForReady(const std::string& out) {
  for (int i = 0; i < 3000 && ReadFile(out).empty(); ++i) {
    ::usleep(10'000);
  }
  ASSERT_EQ(ReadFile(out), "ready\n");
}

struct Launched {
  std::unique_ptr<core::ptrace::Process> proc;
  std::string out;
};

Launched LaunchCalls(const std::string& tag, int n) {
  Launched l;
  l.out = ::testing::TempDir() + "real_agent_" + tag + "_" + std::to_string(::getpid());
  std::remove(l.out.c_str());
  auto p = core::ptrace::Process::Start(
      std::nullopt,
      {kwatch::testing::TargetPath("remote_call"), "calls", std::to_string(n), "--out", l.out}, {});
  EXPECT_TRUE(p.ok()) << p.status();
  if (p.ok()) {
    l.proc = std::move(*p);
  }
  return l;
}

TEST(RealAgent, LoadedAtLaunchRecordsEveryHitOfAnInt3ProbeAfterKwatchLetsGo) {
  Launched l = LaunchCalls("int3", 100);
  ASSERT_NE(l.proc, nullptr);
  const pid_t pid = l.proc->pid();
  auto ctl = Controller::Load(*l.proc, RealAgent());
  ASSERT_TRUE(ctl.ok()) << ctl.status();
  const LoadTimings& t = (*ctl)->agent().timings;
  std::printf("real agent at launch: total %s: setup %s, dlopen %s, init %s\n",
              absl::FormatDuration(t.total).c_str(), absl::FormatDuration(t.setup).c_str(),
              absl::FormatDuration(t.dlopen).c_str(), absl::FormatDuration(t.init).c_str());
  const ka::KwControl& c = (*ctl)->tables().control();
  EXPECT_EQ(c.init_error, ka::kKwInitOk);
  EXPECT_NE(c.agent_features & ka::kKwFeatureInt3, 0u);
  EXPECT_NE(c.agent_features & ka::kKwFeatureWatchdog, 0u);
  EXPECT_NE(c.watchdog_tid, 0);

  const RemoteAddr add6 = Fn(pid, "add6");
  auto index = ProbeAdd6(**ctl, *l.proc, add6);
  ASSERT_TRUE(index.ok()) << index.status();
  (*ctl)->Activate();
  ASSERT_TRUE(l.proc->Detach().ok());
  l.proc.reset();
  WaitForReady(l.out);
  ::kill(pid, SIGUSR1);
  // The lifeline's POLLERR may come first (an exit closes the files before the pidfd says
  // so): then the pidfd alone.
  auto live = (*ctl)->Wait(absl::Seconds(60));
  ASSERT_TRUE(live.ok());
  if (!live->target_exited) {
    pollfd pfd{.fd = (*ctl)->pidfd(), .events = POLLIN, .revents = 0};
    ASSERT_EQ(::poll(&pfd, 1, 60'000), 1);
  }
  auto exit = (*ctl)->ReapExit();
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->ShellStatus(), 0);
  EXPECT_EQ(ReadFile(l.out), "ready\nsum 4950\n");

  std::vector<uint64_t> rdi;
  uint64_t last_ns = 0;
  bool in_order = true;
  auto drained = (*ctl)->Drain([&](const AgentHit& hit) {
    EXPECT_EQ(hit.record.type, ka::kKwRecordHit);
    EXPECT_EQ(hit.record.probe_index, *index);
    EXPECT_EQ(hit.record.ip, add6.value);
    auto args = ParseArgs(hit.payload);
    ASSERT_TRUE(args.ok());
    ASSERT_EQ(args->size(), 1u);
    ASSERT_EQ((*args)[0].bytes.size(), 8u);
    uint64_t v = 0;
    std::memcpy(&v, (*args)[0].bytes.data(), 8);
    rdi.push_back(v);
    in_order = in_order && hit.time_ns >= last_ns;
    last_ns = hit.time_ns;
  });
  ASSERT_TRUE(drained.ok()) << drained.status();
  EXPECT_EQ(drained->lost, 0u);
  ASSERT_EQ(rdi.size(), 100u);
  for (uint64_t i = 0; i < 100; ++i) {
    EXPECT_EQ(rdi[i], i);
  }
  EXPECT_TRUE(in_order);
  EXPECT_EQ((*ctl)->tables().probe(*index).hits.load(), 100u);
  ASSERT_TRUE((*ctl)->EndDetached([](const AgentHit&) {}).ok());
  std::remove(l.out.c_str());
}

TEST(RealAgent, WhenKwatchIsGoneTheWatchdogPutsTheCodeBack) {
  Launched l = LaunchCalls("watchdog", 20);
  ASSERT_NE(l.proc, nullptr);
  const pid_t pid = l.proc->pid();
  auto ctl = Controller::Load(*l.proc, RealAgent());
  ASSERT_TRUE(ctl.ok()) << ctl.status();
  const RemoteAddr add6 = Fn(pid, "add6");
  std::vector<uint8_t> original(1);
  ASSERT_TRUE(l.proc->ReadMemory(add6, original).ok());
  ASSERT_TRUE(ProbeAdd6(**ctl, *l.proc, add6).ok());
  (*ctl)->Activate();
  ASSERT_TRUE(l.proc->Detach().ok());
  l.proc.reset();
  // kwatch "dies": its lifeline write end closes, nothing restored.
  ctl->reset();
  // The watchdog restores the byte (through /proc/self/mem) within moments.
  std::vector<uint8_t> now(1, 0xcc);
  for (int i = 0; i < 1000 && now[0] == 0xcc; ++i) {
    ::usleep(10'000);
    std::ifstream mem("/proc/" + std::to_string(pid) + "/mem", std::ios::binary);
    mem.seekg(static_cast<std::streamoff>(add6.value));
    mem.read(reinterpret_cast<char*>(now.data()), 1);
  }
  EXPECT_EQ(now, original);
  WaitForReady(l.out);
  ::kill(pid, SIGUSR1);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_EQ(ReadFile(l.out), "ready\nsum 190\n");
  std::remove(l.out.c_str());
}

TEST(RealAgent, LoadedIntoAnAttachedFourThreadProgram) {
  auto target =
      kwatch::testing::Spawned::Start({kwatch::testing::TargetPath("remote_call"), "threads", "3"});
  ASSERT_TRUE(target.ok());
  ASSERT_TRUE((*target)->WaitForStdout("ready").ok());
  auto proc = core::ptrace::Process::Attach((*target)->pid());
  ASSERT_TRUE(proc.ok());
  ASSERT_TRUE((*proc)->StopAll().ok());
  auto ctl = Controller::Load(**proc, RealAgent());
  ASSERT_TRUE(ctl.ok()) << ctl.status();
  const LoadTimings& t = (*ctl)->agent().timings;
  std::printf(
      "real agent at attach, 4 threads: total %s: thread %s, setup %s, dlopen %s, "
      "init %s\n",
      absl::FormatDuration(t.total).c_str(), absl::FormatDuration(t.pick).c_str(),
      absl::FormatDuration(t.setup).c_str(), absl::FormatDuration(t.dlopen).c_str(),
      absl::FormatDuration(t.init).c_str());
  EXPECT_NE((*ctl)->tables().control().watchdog_tid, 0);
  ASSERT_TRUE((*ctl)->End(**proc).ok());
  ASSERT_TRUE((*proc)->Detach().ok());
  ASSERT_TRUE((*ctl)->Finish([](const AgentHit&) {}).ok());
  ::kill((*target)->pid(), SIGUSR1);
  auto done = (*target)->Finish();
  ASSERT_TRUE(done.ok());
  EXPECT_EQ(done->exit_code, 0);
  EXPECT_EQ(done->out, "ready\njoined 3\n");
}

}  // namespace
}  // namespace kwatch::watch::agent

#endif  // KWATCH_AGENT_LIBRARY
