#include "watch/agent/controller.h"

#include <signal.h>
#include <sys/user.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "agent/abi.h"
#include "core/ptrace/process.h"
#include "core/ptrace/remote_call.h"
#include "core/symbols/symbols.h"
#include "tests/test_util.h"

namespace kwatch::watch::agent {
namespace {

namespace ka = kwatch::agent;
using core::RemoteAddr;
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

RemoteAddr Fn(pid_t pid, const std::string& name) {
  auto symbols = core::symbols::Symbols::ForProcess(pid);
  if (!symbols.ok()) {
    ADD_FAILURE() << symbols.status();
    return RemoteAddr{};
  }
  auto f = (*symbols)->FindFunction(name);
  if (!f.has_value()) {
    ADD_FAILURE() << "no function " << name;
    return RemoteAddr{};
  }
  return f->start;
}

std::vector<uint8_t> Bytes(const core::ptrace::Process& proc, RemoteAddr at, size_t n) {
  std::vector<uint8_t> out(n);
  EXPECT_TRUE(proc.ReadMemory(at, out).ok());
  return out;
}

LoadOptions Small() {
  return LoadOptions{
      .agent_path = StubAgent(),
      .shm = ShmConfig{
          .probe_capacity = 8, .code_capacity = 64, .thread_capacity = 4, .ring_bytes = 4096}};
}

// A jmp rel32 from `from` to `to`, filled with INT3 up to `len`.
std::vector<uint8_t> Jump(RemoteAddr from, RemoteAddr to, size_t len) {
  std::vector<uint8_t> b(len, 0xcc);
  b[0] = 0xe9;
  const auto rel = static_cast<int32_t>(to.value - (from.value + 5));
  std::memcpy(&b[1], &rel, 4);
  return b;
}

struct Session {
  std::unique_ptr<core::ptrace::Process> proc;
  std::unique_ptr<Controller> ctl;
  std::string out;
};

Session LaunchAndLoad(const std::string& tag, const std::vector<std::string>& args) {
  Session s;
  s.out = ::testing::TempDir() + "agent_ctl_" + tag + "_" + std::to_string(::getpid());
  std::remove(s.out.c_str());
  std::vector<std::string> argv = {kwatch::testing::TargetPath("remote_call")};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.push_back("--out");
  argv.push_back(s.out);
  auto p = core::ptrace::Process::Start(std::nullopt, argv, {});
  if (!p.ok()) {
    ADD_FAILURE() << p.status();
    return s;
  }
  s.proc = std::move(*p);
  auto ctl = Controller::Load(*s.proc, Small());
  if (!ctl.ok()) {
    ADD_FAILURE() << ctl.status();
    return s;
  }
  s.ctl = std::move(*ctl);
  return s;
}

TEST(Controller, PatchesJournalFirstAndEndPutsEveryByteBack) {
  Session s = LaunchAndLoad("patch", {"count", "3"});
  ASSERT_NE(s.ctl, nullptr);
  core::ptrace::Process& proc = *s.proc;
  Controller& ctl = *s.ctl;
  const RemoteAddr add6 = Fn(proc.pid(), "add6");
  const RemoteAddr spin = Fn(proc.pid(), "spin");
  const std::vector<uint8_t> add6_code = Bytes(proc, add6, 16);
  const std::vector<uint8_t> spin_code = Bytes(proc, spin, 16);

  // Code placed near spin: within reach of a rel32 jump.
  const std::vector<uint8_t> body = {0x90, 0x90, 0xc3};
  auto placed = ctl.PlaceCode(
      proc, spin, 32, [&](RemoteAddr) { return absl::StatusOr<std::vector<uint8_t>>(body); });
  ASSERT_TRUE(placed.ok()) << placed.status();
  EXPECT_EQ(placed->value % 16, 0u);
  EXPECT_LT(placed->value > spin.value ? placed->value - spin.value : spin.value - placed->value,
            uint64_t{1} << 30);
  EXPECT_EQ(Bytes(proc, *placed, 4), (std::vector<uint8_t>{0x90, 0x90, 0xc3, 0xcc}));
  auto second = ctl.PlaceCode(proc, spin, 8, [&](RemoteAddr) {
    return absl::StatusOr<std::vector<uint8_t>>(std::vector<uint8_t>{0xc3});
  });
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->value, placed->value + 16);  // the same area, aligned

  ProbeEntry int3{.id = 1, .addr = add6, .insn_len = 1};
  auto i1 = ctl.AddProbe(int3);
  ASSERT_TRUE(i1.ok()) << i1.status();
  ProbeEntry jump{.id = 2,
                  .addr = spin,
                  .flags = ka::kKwProbeEnabled | ka::kKwProbeJump,
                  .xol_addr = placed->value};
  auto i2 = ctl.AddProbe(jump);
  ASSERT_TRUE(i2.ok());
  const uint8_t cc = 0xcc;
  ASSERT_TRUE(ctl.Patch(proc, *i1, add6, std::span<const uint8_t>(&cc, 1)).ok());
  const std::vector<uint8_t> jmp = Jump(spin, *placed, 6);
  ASSERT_TRUE(ctl.Patch(proc, *i2, spin, jmp).ok());
  EXPECT_EQ(ctl.patches(), 2u);
  EXPECT_EQ(Bytes(proc, add6, 1)[0], 0xcc);
  EXPECT_EQ(Bytes(proc, spin, 6), jmp);
  // The journal, as the agent's watchdog would read it.
  const ShmTables& t = ctl.tables();
  int int3s = 0;
  int jumps = 0;
  for (uint32_t i = 0; i < t.layout().patch_capacity; ++i) {
    const ka::KwPatch& p = t.patch(i);
    if (p.state.load() == ka::kKwPatchInt3) {
      ++int3s;
      EXPECT_EQ(p.addr, add6.value);
      EXPECT_EQ(p.original[0], add6_code[0]);
      EXPECT_EQ(p.probe_index, *i1);
    } else if (p.state.load() == ka::kKwPatchJump) {
      ++jumps;
      EXPECT_EQ(p.len, 6u);
      EXPECT_EQ(std::vector<uint8_t>(p.original.begin(), p.original.begin() + 6),
                std::vector<uint8_t>(spin_code.begin(), spin_code.begin() + 6));
      EXPECT_EQ(std::vector<uint8_t>(p.patched.begin(), p.patched.begin() + 6), jmp);
    }
  }
  EXPECT_EQ(int3s, 1);
  EXPECT_EQ(jumps, 1);
  // Overlaps and bad shapes are refused.
  EXPECT_EQ(ctl.Patch(proc, *i1, spin + 2, std::span<const uint8_t>(&cc, 1)).code(),
            absl::StatusCode::kAlreadyExists);
  const uint8_t four[4] = {0xe9, 0, 0, 0};
  EXPECT_EQ(ctl.Patch(proc, *i1, add6 + 64, four).code(), absl::StatusCode::kInvalidArgument);

  ctl.Activate();
  EXPECT_EQ(t.state(), ka::kKwStateActive);
  ASSERT_TRUE(ctl.End(proc).ok());
  EXPECT_EQ(Bytes(proc, add6, 16), add6_code);
  EXPECT_EQ(Bytes(proc, spin, 16), spin_code);
  EXPECT_EQ(t.state(), ka::kKwStateRestored);
  for (uint32_t i = 0; i < t.layout().patch_capacity; ++i) {
    EXPECT_EQ(t.patch(i).state.load(), ka::kKwPatchFree);
  }
  ASSERT_TRUE(proc.ResumeAll().ok());
  while (proc.alive()) {
    ASSERT_TRUE(proc.Poll(/*block=*/true).ok());
  }
  EXPECT_EQ(proc.exit_info()->ShellStatus(), 0);
  ASSERT_TRUE(ctl.Finish([](const AgentHit&) {}).ok());
  EXPECT_EQ(ReadFile(s.out), "tick 0\ntick 1\ntick 2\nsum 5\n");
  std::remove(s.out.c_str());
}

TEST(Controller, AJumpOverAThreadParkedInsideItsRangeIsRefused) {
  auto target =
      kwatch::testing::Spawned::Start({kwatch::testing::TargetPath("remote_call"), "hold"});
  ASSERT_TRUE(target.ok());
  ASSERT_TRUE((*target)->WaitForStdout("ready").ok());
  auto p = core::ptrace::Process::Attach((*target)->pid());
  ASSERT_TRUE(p.ok());
  core::ptrace::Process& proc = **p;
  ASSERT_TRUE(proc.StopAll().ok());
  const RemoteAddr spin = Fn(proc.pid(), "hold_spin");
  // Until the thread is stopped past the loop's first instruction, inside its 11 bytes.
  for (int i = 0; i < 1000; ++i) {
    auto regs = proc.GetRegs(proc.pid());
    ASSERT_TRUE(regs.ok());
    if (regs->rip > spin.value && regs->rip < spin.value + 11) {
      break;
    }
    ASSERT_TRUE(proc.ResumeAll().ok());
    ::usleep(1000);
    ASSERT_TRUE(proc.StopAll().ok());
  }
  auto ctl = Controller::Load(proc, Small());
  ASSERT_TRUE(ctl.ok()) << ctl.status();
  const std::vector<uint8_t> before = Bytes(proc, spin, 11);
  auto index = (*ctl)->AddProbe(ProbeEntry{.id = 1, .addr = spin, .flags = ka::kKwProbeJump});
  ASSERT_TRUE(index.ok());
  const absl::Status s = (*ctl)->Patch(proc, *index, spin, Jump(spin, spin + 0x1000, 11));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), HasSubstr(absl::StrCat("thread ", proc.pid())));
  EXPECT_EQ(Bytes(proc, spin, 11), before);
  EXPECT_EQ((*ctl)->patches(), 0u);
  // An INT3 there is fine.
  const uint8_t cc = 0xcc;
  ASSERT_TRUE((*ctl)->Patch(proc, *index, spin, std::span<const uint8_t>(&cc, 1)).ok());
  ASSERT_TRUE((*ctl)->End(proc).ok());
  EXPECT_EQ(Bytes(proc, spin, 11), before);
  ASSERT_TRUE(proc.Detach().ok());
}

TEST(Controller, DrainsWhatTheAgentWritesWhereTheAgentFindsItsRings) {
  Session s = LaunchAndLoad("drain", {"count", "1"});
  ASSERT_NE(s.ctl, nullptr);
  Controller& ctl = *s.ctl;
  // Ring 2, found as the agent finds it: from the control block's offsets.
  auto* base = static_cast<uint8_t*>(ctl.agent().shm.get());
  const auto* c = reinterpret_cast<const ka::KwControl*>(base);
  auto* ring = reinterpret_cast<ka::KwRing*>(base + c->rings_offset +
                                             2 * (sizeof(ka::KwRing) + c->ring_bytes));
  uint8_t* data = reinterpret_cast<uint8_t*>(ring) + sizeof(ka::KwRing);
  ka::KwRecord r{};
  r.type = ka::kKwRecordHit;
  r.size = sizeof(r) + 16;
  r.probe_index = 3;
  r.tid = 77;
  r.ip = 0x1234;
  const uint64_t tsc = ReadTsc();
  r.tsc = tsc;
  std::memcpy(data, &r, sizeof(r));
  const ka::KwArgHeader h{.arg = 0, .status = 0, .len = 8};
  std::memcpy(data + sizeof(r), &h, sizeof(h));
  const uint64_t value = 0xfeedface;
  std::memcpy(data + sizeof(r) + sizeof(h), &value, 8);
  ring->tid.store(77);
  ring->head.store(r.size, std::memory_order_release);
  ring->lost.store(5);

  std::vector<AgentHit> hits;
  std::vector<uint64_t> values;
  auto stats = ctl.Drain([&](const AgentHit& hit) {
    hits.push_back(hit);
    auto args = ParseArgs(hit.payload);
    ASSERT_TRUE(args.ok());
    uint64_t v = 0;
    std::memcpy(&v, (*args)[0].bytes.data(), 8);
    values.push_back(v);
  });
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->records, 1u);
  EXPECT_EQ(stats->lost, 5u);
  ASSERT_EQ(hits.size(), 1u);
  EXPECT_EQ(hits[0].ring, 2u);
  EXPECT_EQ(hits[0].record.tid, 77);
  EXPECT_EQ(hits[0].record.probe_index, 3u);
  EXPECT_EQ(hits[0].time_ns, ctl.clock().ToMonotonicNs(tsc));
  EXPECT_EQ(values, std::vector<uint64_t>{0xfeedface});
  EXPECT_EQ(ring->tail.load(), r.size);
  // Nothing twice.
  stats = ctl.Drain([&](const AgentHit&) { ADD_FAILURE() << "drained twice"; });
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->records + stats->lost, 0u);
  ASSERT_TRUE(s.proc->Kill().ok());
  std::remove(s.out.c_str());
}

TEST(Controller, SeesTheAgentGoneAndTheTargetExitAfterDetaching) {
  Session s = LaunchAndLoad("live", {"signals"});
  ASSERT_NE(s.ctl, nullptr);
  core::ptrace::Process& proc = *s.proc;
  Controller& ctl = *s.ctl;
  const RemoteAddr add6 = Fn(proc.pid(), "add6");
  const std::vector<uint8_t> code = Bytes(proc, add6, 1);
  auto index = ctl.AddProbe(ProbeEntry{.id = 1, .addr = add6, .insn_len = 1});
  ASSERT_TRUE(index.ok());
  const uint8_t cc = 0xcc;
  ASSERT_TRUE(ctl.Patch(proc, *index, add6, std::span<const uint8_t>(&cc, 1)).ok());
  ctl.Activate();
  auto live = ctl.Wait(absl::ZeroDuration());
  ASSERT_TRUE(live.ok());
  EXPECT_FALSE(live->agent_gone);
  EXPECT_FALSE(live->target_exited);

  // kwatch lets go entirely; the program runs (it waits in pause()).
  ASSERT_TRUE(proc.Detach().ok());
  s.proc.reset();
  // A second patch while detached: the world seized, stopped, patched, let go.
  const RemoteAddr spin = Fn(ctl.pid(), "spin");
  auto second = ctl.AddProbe(ProbeEntry{.id = 2, .addr = spin, .insn_len = 1});
  ASSERT_TRUE(second.ok());
  ASSERT_TRUE(ctl.RunStopped([&](core::ptrace::Process& p) {
                   return ctl.Patch(p, *second, spin, std::span<const uint8_t>(&cc, 1));
                 })
                  .ok());
  EXPECT_EQ(ctl.patches(), 2u);
  ASSERT_TRUE(ctl.EndDetached([](const AgentHit&) {}).ok());
  // The byte is back (read through a fresh seize, then let go).
  ASSERT_TRUE(ctl.RunStopped([&](core::ptrace::Process& p) {
                   EXPECT_EQ(Bytes(p, add6, 1), code);
                   EXPECT_NE(Bytes(p, spin, 1)[0], 0xcc);
                   // Sent while the program is stopped, both signals are pending when it is let
                   // go and both handlers run before its loop looks again. Sent to a running
                   // program, the second could land between the loop's check and its pause()
                   // and be waited for forever (seen once in CI under load).
                   ::kill(p.pid(), SIGUSR1);
                   ::kill(p.pid(), SIGUSR2);
                   return absl::OkStatus();
                 })
                  .ok());
  EXPECT_EQ(ctl.tables().state(), ka::kKwStateRestored);
  auto gone = ctl.Wait(absl::Seconds(30));
  ASSERT_TRUE(gone.ok());
  EXPECT_TRUE(gone->target_exited);
  auto exit = ctl.ReapExit();
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->ShellStatus(), 0);
  EXPECT_THAT(ReadFile(s.out), HasSubstr("ready\nusr1 1\n"));
  std::remove(s.out.c_str());
}

TEST(Controller, TheLifelineReportsTheAgentsEndBeforeTheTargets) {
  Session s = LaunchAndLoad("lifeline", {"signals"});
  ASSERT_NE(s.ctl, nullptr);
  core::ptrace::Process& proc = *s.proc;
  // The stub closes its read end, as an agent's process that ended or exec'd would.
  auto trap = core::ptrace::MapRemoteTrap(proc, proc.pid(), 4096);
  ASSERT_TRUE(trap.ok());
  auto maps = proc.Maps();
  ASSERT_TRUE(maps.ok());
  auto symbols = core::symbols::Symbols::ForFile(StubAgent());
  ASSERT_TRUE(symbols.ok());
  auto close_fn = (*symbols)->FindFunction("stub_close_lifeline");
  ASSERT_TRUE(close_fn.has_value());
  auto bias = LoadBias(proc, *maps, std::filesystem::canonical(StubAgent()).string());
  ASSERT_TRUE(bias.ok()) << bias.status();
  auto r = core::ptrace::RemoteCall(proc, proc.pid(), close_fn->start + *bias, {},
                                    core::ptrace::RemoteCallOptions{.return_trap = *trap});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->value, 0u);
  auto live = s.ctl->Wait(absl::ZeroDuration());
  ASSERT_TRUE(live.ok());
  EXPECT_TRUE(live->agent_gone);
  EXPECT_FALSE(live->target_exited);
  ASSERT_TRUE(proc.Kill().ok());
  std::remove(s.out.c_str());
}

}  // namespace
}  // namespace kwatch::watch::agent
