#include "watch/stop_backend.h"

#include <errno.h>
#include <signal.h>
#include <sys/ptrace.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "core/expr.h"
#include "core/process.h"
#include "core/symbolizer.h"
#include "core/symbols.h"
#include "core/unique_fd.h"
#include "drmgr/dr7.h"
#include "drmgr/slot_allocator.h"
#include "tests/test_util.h"
#include "tests/watch/debug_traps.h"

namespace kwatch::watch {
namespace {

using ::kwatch::testing::HoldBreakpointSlot;

void* DrOffset(int n) {
  return reinterpret_cast<void*>(offsetof(struct user, u_debugreg) + n * sizeof(long));
}

uint64_t PeekDr(pid_t tid, int n) {
  errno = 0;
  const long v = ::ptrace(PTRACE_PEEKUSER, tid, DrOffset(n), nullptr);
  EXPECT_EQ(errno, 0) << "PEEKUSER DR" << n << " of " << tid << ": " << std::strerror(errno);
  return static_cast<uint64_t>(v);
}

ThreadDebugRegs Peek(pid_t tid) {
  ThreadDebugRegs r;
  for (int p = 0; p < 4; ++p) {
    r.addr[p] = PeekDr(tid, p);
  }
  r.dr7 = PeekDr(tid, 7);
  return r;
}

// (address, kind, length) of every enabled slot, whatever register holds it.
using SlotSet = std::multiset<std::tuple<uint64_t, int, uint64_t>>;
SlotSet Enabled(const ThreadDebugRegs& r) {
  SlotSet out;
  auto dr7 = drmgr::DecodeDr7(r.dr7);
  EXPECT_TRUE(dr7.ok()) << dr7.status();
  if (!dr7.ok()) {
    return out;
  }
  for (int p = 0; p < 4; ++p) {
    const drmgr::Dr7Slot& s = dr7->slots[p];
    if (s.enabled()) {
      out.emplace(r.addr[p], static_cast<int>(s.kind), drmgr::DrLenBytes(s.len));
    }
  }
  return out;
}

// A launched stop_target, its symbols and the drmgr allocator of the test.
class Target {
 public:
  explicit Target(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {kwatch::testing::TargetPath("stop_target")};
    argv.insert(argv.end(), args.begin(), args.end());
    auto p = core::Process::Launch(argv);
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) {
      return;
    }
    proc = *std::move(p);
    EXPECT_TRUE(proc->RunToEntry().ok());  // leaves it stopped at its entry point
    auto s = core::Symbols::ForProcess(proc->pid());
    EXPECT_TRUE(s.ok()) << s.status();
    if (s.ok()) {
      symbols = *std::move(s);
      symbolizer = std::make_unique<core::Symbolizer>(*symbols);
    }
    client = alloc.AddClient(drmgr::ClientKind::kWatchpoint, "test");
    EXPECT_TRUE(proc->ResumeAll().ok());
  }
  ~Target() {
    if (proc != nullptr && proc->alive()) {
      (void)proc->Kill();
    }
  }
  bool ok() const { return proc != nullptr && symbolizer != nullptr; }

  core::ResolvedExpr Resolve(const std::string& text) {
    auto e = core::ParseExpr(text);
    EXPECT_TRUE(e.ok()) << e.status();
    auto r = symbols->Resolve(*e, [this](core::RemoteAddr a, std::span<uint8_t> out) {
      return proc->ReadMemory(a, out);
    });
    EXPECT_TRUE(r.ok()) << text << ": " << r.status();
    return r.ok() ? *r : core::ResolvedExpr{};
  }

  // Adds watch `expr` (next id) and asks drmgr for it in `scope`; returns the grant.
  drmgr::Grant AddWatch(const std::string& expr, drmgr::DrKind kind, drmgr::Scope scope) {
    Watch w;
    w.id = static_cast<uint32_t>(watches.size());
    w.request.expr = expr;
    w.request.kind = kind;
    w.target = Resolve(expr);
    drmgr::SlotRequest req;
    req.addr = w.target.addr;
    req.len = w.target.length;
    req.kind = kind;
    req.scope = scope;
    req.label = expr;
    auto g = alloc.Request(client, req);
    EXPECT_TRUE(g.ok()) << g.status();
    owners[g->id] = w.id;
    watches.push_back(w);
    return *g;
  }

  // Runs the target until it raises its next SIGUSR1 milestone.
  void WaitMilestone() {
    for (;;) {
      auto ev = proc->Poll(true);
      ASSERT_TRUE(ev.ok()) << ev.status();
      for (const core::ProcessEvent& e : *ev) {
        ASSERT_NE(e.kind, core::ProcessEvent::Kind::kExited) << "target ended early";
        if (e.kind == core::ProcessEvent::Kind::kSignal && e.signal == SIGUSR1) {
          return;
        }
      }
    }
  }
  void Go(uint64_t step) {
    const uint64_t addr = Resolve("g_go").addr.value;
    ASSERT_TRUE(proc->WriteMemory(core::RemoteAddr{addr},
                                  std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(&step),
                                                           sizeof(step)))
                    .ok());
  }
  void RunToExit() {
    while (proc->alive()) {
      auto ev = proc->Poll(true);
      ASSERT_TRUE(ev.ok()) << ev.status();
    }
  }

  std::unique_ptr<core::Process> proc;
  std::unique_ptr<core::Symbols> symbols;
  std::unique_ptr<core::Symbolizer> symbolizer;
  drmgr::SlotAllocator alloc;
  drmgr::ClientId client;
  std::vector<Watch> watches;
  std::map<drmgr::RequestId, uint32_t> owners;
};

// The slots drmgr placed for thread `tid` (its process scope and its own), as a SlotSet.
SlotSet Expected(const drmgr::SlotAllocator& alloc, pid_t pid, pid_t tid) {
  SlotSet out;
  for (const drmgr::ScopeView& sv : alloc.Snapshot().scopes) {
    if (sv.scope != drmgr::Scope::Process(pid) && sv.scope != drmgr::Scope::Thread(pid, tid)) {
      continue;
    }
    for (const drmgr::SlotView& s : sv.slots) {
      if (s.state == drmgr::SlotState::kArmed) {
        out.emplace(s.chunk.addr.value, static_cast<int>(s.kind), s.chunk.len);
      }
    }
  }
  return out;
}

// Process-scope slot i sits in DRi, with drmgr's DR7 encoding.
void ExpectProcessSlotsInPlace(const drmgr::SlotAllocator& alloc, pid_t pid,
                               const ThreadDebugRegs& regs, pid_t tid) {
  auto dr7 = drmgr::DecodeDr7(regs.dr7);
  ASSERT_TRUE(dr7.ok()) << dr7.status();
  for (const drmgr::ScopeView& sv : alloc.Snapshot().scopes) {
    if (sv.scope != drmgr::Scope::Process(pid)) {
      continue;
    }
    for (int i = 0; i < 4; ++i) {
      const drmgr::SlotView& s = sv.slots[i];
      if (s.state != drmgr::SlotState::kArmed) {
        continue;
      }
      EXPECT_EQ(regs.addr[i], s.chunk.addr.value) << "thread " << tid << " DR" << i;
      EXPECT_EQ(dr7->slots[i], drmgr::LocalSlot(s.kind, s.chunk.len))
          << "thread " << tid << " DR7 slot " << i;
    }
  }
}

TEST(StopBackend, WritesDrmgrSlotsIntoEveryThreadOldAndNew) {
  Target t({"threads", "3", "2"});
  ASSERT_TRUE(t.ok());
  t.WaitMilestone();  // main + 3 threads
  const pid_t pid = t.proc->pid();
  const auto proc_scope = drmgr::Scope::Process(pid);
  std::vector<drmgr::Grant> grants;
  grants.push_back(t.AddWatch("g_rec.a", drmgr::DrKind::kWrite, proc_scope));
  grants.push_back(t.AddWatch("g_rec.b", drmgr::DrKind::kReadWrite, proc_scope));
  grants.push_back(t.AddWatch("g_rec.c", drmgr::DrKind::kWrite, proc_scope));
  // The main thread also carries a slot of its own: four registers there, three elsewhere.
  grants.push_back(t.AddWatch("g_rec.d", drmgr::DrKind::kWrite, drmgr::Scope::Thread(pid, pid)));
  StopBackend backend(*t.proc, t.watches, *t.symbolizer, t.owners);
  ASSERT_TRUE(backend.Arm().ok());
  for (const drmgr::Grant& g : grants) {
    ASSERT_EQ(g.state, drmgr::RequestState::kHardware) << g.reason;
    ASSERT_TRUE(backend.Apply(g.changes).ok());
  }

  const auto check_all = [&](size_t want_threads) {
    ASSERT_TRUE(t.proc->StopAll().ok());
    const std::vector<pid_t> tids = t.proc->TracedThreads();
    EXPECT_EQ(tids.size(), want_threads);
    for (pid_t tid : tids) {
      const ThreadDebugRegs regs = Peek(tid);
      EXPECT_EQ(regs, backend.RegistersOf(tid)) << "thread " << tid;
      const SlotSet want = Expected(t.alloc, pid, tid);
      EXPECT_EQ(Enabled(regs), want) << "thread " << tid;
      EXPECT_EQ(want.size(), tid == pid ? 4u : 3u);
      ExpectProcessSlotsInPlace(t.alloc, pid, regs, tid);
    }
    ASSERT_TRUE(t.proc->ResumeAll().ok());
  };
  check_all(4);
  t.Go(1);
  t.WaitMilestone();  // 2 more threads, created after arming
  check_all(6);

  backend.Disarm();
  ASSERT_TRUE(t.proc->StopAll().ok());
  for (pid_t tid : t.proc->TracedThreads()) {
    const ThreadDebugRegs regs = Peek(tid);
    EXPECT_EQ(regs, ThreadDebugRegs{}) << "thread " << tid;
  }
  ASSERT_TRUE(t.proc->ResumeAll().ok());
  t.Go(2);
  t.RunToExit();
  EXPECT_EQ(t.proc->exit_info()->code, 0);
}

TEST(StopBackend, SlotHeldOutsideKwatchIsRefusedAllOrNothing) {
  Target t({"threads", "2", "0"});
  ASSERT_TRUE(t.ok());
  t.WaitMilestone();  // main + 2 threads
  const pid_t pid = t.proc->pid();
  std::vector<pid_t> tids = t.proc->TracedThreads();
  ASSERT_EQ(tids.size(), 3u);
  // The last thread kwatch will write holds two slots outside kwatch (a debugger would).
  const pid_t busy = tids.back();
  const uint64_t go = t.Resolve("g_go").addr.value;
  core::UniqueFd held[2] = {HoldBreakpointSlot(busy, go), HoldBreakpointSlot(busy, go)};

  const auto proc_scope = drmgr::Scope::Process(pid);
  const drmgr::Grant g1 = t.AddWatch("g_rec.a", drmgr::DrKind::kWrite, proc_scope);
  const drmgr::Grant g2 = t.AddWatch("g_rec.b", drmgr::DrKind::kWrite, proc_scope);
  const drmgr::Grant g3 = t.AddWatch("g_rec.c", drmgr::DrKind::kWrite, proc_scope);
  StopBackend backend(*t.proc, t.watches, *t.symbolizer, t.owners);
  ASSERT_TRUE(backend.Arm().ok());
  ASSERT_TRUE(backend.Apply(g1.changes).ok());
  ASSERT_TRUE(backend.Apply(g2.changes).ok());  // 2 + 2 = 4 slots in `busy`

  ASSERT_TRUE(t.proc->StopAll().ok());
  std::map<pid_t, ThreadDebugRegs> before;
  for (pid_t tid : t.proc->TracedThreads()) {
    before[tid] = Peek(tid);
    EXPECT_EQ(Enabled(before[tid]).size(), 2u);
  }
  ASSERT_TRUE(t.proc->ResumeAll().ok());

  const absl::Status s = backend.Apply(g3.changes);  // a fifth slot in `busy`
  EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
  ASSERT_TRUE(backend.refused_scope().has_value());
  EXPECT_EQ(*backend.refused_scope(), proc_scope);

  ASSERT_TRUE(t.proc->StopAll().ok());
  for (pid_t tid : t.proc->TracedThreads()) {
    EXPECT_EQ(Peek(tid), before[tid]) << "thread " << tid << " (busy " << busy << ")";
    EXPECT_EQ(backend.RegistersOf(tid), before[tid]) << "thread " << tid;
  }
  ASSERT_TRUE(t.proc->ResumeAll().ok());
  t.Go(2);
  t.RunToExit();
  EXPECT_EQ(t.proc->exit_info()->code, 0);
}

// The physical register holding the slot at `addr` in thread `tid`.
int RegisterOf(const StopBackend& backend, pid_t tid, core::RemoteAddr addr) {
  const ThreadDebugRegs r = backend.RegistersOf(tid);
  for (int p = 0; p < 4; ++p) {
    if (r.addr[p] == addr.value && (r.dr7 & (uint64_t{3} << (2 * p))) != 0) {
      return p;
    }
  }
  return -1;
}

// Clears DR7 of `tid` behind the backend's back: the registers stay as the backend wrote them
// (addresses, its own model), but the processor no longer traps, so that on a machine that
// delivers debug traps only the forged trap arrives.
void QuietHardware(pid_t tid) {
  ASSERT_EQ(::ptrace(PTRACE_POKEUSER, tid, DrOffset(7), nullptr), 0) << std::strerror(errno);
}

// The decision logic on a crafted trap, the same on every machine: the target forges the stop
// a write breakpoint makes (SIGTRAP TRAP_HWBKPT right after its store, see
// tests/targets/stop_target.c), with the registers quiet (QuietHardware), and the test sets
// the DR6 bit the processor would have set, through the kernel's ptrace DR6.
TEST(StopBackend, ForgedWriteTrapGivesExactOldAndNewValues) {
  Target t({"forge", "0x5a5a5a5a12345678"});
  ASSERT_TRUE(t.ok());
  t.WaitMilestone();
  const pid_t pid = t.proc->pid();
  const drmgr::Grant g = t.AddWatch("g_rec.a", drmgr::DrKind::kWrite, drmgr::Scope::Process(pid));
  StopBackend backend(*t.proc, t.watches, *t.symbolizer, t.owners);
  ASSERT_TRUE(backend.Arm().ok());
  ASSERT_TRUE(backend.Apply(g.changes).ok());
  const core::RemoteAddr a = t.watches[0].target.addr;
  const int reg = RegisterOf(backend, pid, a);
  ASSERT_GE(reg, 0);

  ASSERT_TRUE(t.proc->StopAll().ok());
  QuietHardware(pid);
  ASSERT_EQ(::ptrace(PTRACE_POKEUSER, pid, DrOffset(6), reinterpret_cast<void*>(1UL << reg)), 0)
      << std::strerror(errno);
  ASSERT_TRUE(t.proc->ResumeAll().ok());
  t.Go(1);
  t.RunToExit();
  // Unclaimed, the SIGTRAP would have killed it (no handler).
  EXPECT_FALSE(t.proc->exit_info()->signaled) << t.proc->exit_info()->signal;
  EXPECT_EQ(t.proc->exit_info()->code, 0);

  std::vector<core::AccessEvent> events;
  backend.Collect(events);
  ASSERT_EQ(events.size(), 1u);
  const core::AccessEvent& ev = events[0];
  const auto forge = t.symbols->FindFunction("kw_forge");
  ASSERT_TRUE(forge.has_value());
  EXPECT_EQ(ev.pid, pid);
  EXPECT_EQ(ev.tid, pid);
  EXPECT_EQ(ev.watch_id, 0u);
  EXPECT_EQ(ev.kind, core::AccessKind::kWrite);
  EXPECT_EQ(ev.trap_ip, forge->start + 7);  // after `movq %rdi, g_rec(%rip)`
  EXPECT_EQ(ev.ip, forge->start);
  EXPECT_EQ(ev.addr, a);
  EXPECT_EQ(ev.len, 8u);
  EXPECT_EQ(ev.access_addr, a);
  EXPECT_EQ(ev.access_size, 8u);
  EXPECT_TRUE(ev.value_exact);
  EXPECT_EQ(ev.old_value, std::optional<uint64_t>(0x1111111111111111ULL));
  EXPECT_EQ(ev.value, std::optional<uint64_t>(0x5a5a5a5a12345678ULL));
  EXPECT_EQ(backend.unrelated(), 0u);
  EXPECT_EQ(backend.stray_traps(), 0u);
}

// A read-write slot shared by a write watch and a read-write watch of the same bytes, and a
// wide cover whose watched bytes the store misses.
TEST(StopBackend, ForgedTrapReachesEveryHolderAndDropsUntouchedBytes) {
  Target t({"forge", "0x77"});
  ASSERT_TRUE(t.ok());
  t.WaitMilestone();
  const pid_t pid = t.proc->pid();
  const core::ResolvedExpr a = t.Resolve("g_rec.a");
  const core::ResolvedExpr b = t.Resolve("g_rec.b");
  for (const auto& [expr, kind] : {std::pair{"g_rec.a", drmgr::DrKind::kWrite},
                                   std::pair{"g_rec.a", drmgr::DrKind::kReadWrite},
                                   std::pair{"g_rec.b", drmgr::DrKind::kWrite}}) {
    Watch w;
    w.id = static_cast<uint32_t>(t.watches.size());
    w.request.expr = expr;
    w.request.kind = kind;
    w.target = t.Resolve(expr);
    t.watches.push_back(w);
  }
  const std::map<drmgr::RequestId, uint32_t> owners = {
      {drmgr::RequestId{10}, 0}, {drmgr::RequestId{11}, 1}, {drmgr::RequestId{12}, 2}};
  // Slot 0: g_rec.a, read-write, both watches of it. Slot 1: 16 bytes would not fit one
  // register, so g_rec.b's wide cover is the 8 bytes at g_rec.a + 8 (b, c, d), fired with slot 0.
  drmgr::Changes ch;
  drmgr::SlotChange s0;
  s0.op = drmgr::SlotChange::Op::kArm;
  s0.scope = drmgr::Scope::Process(pid);
  s0.slot = 0;
  s0.chunk = drmgr::Chunk{a.addr, 8};
  s0.kind = drmgr::DrKind::kReadWrite;
  s0.holders = {{drmgr::RequestId{10}, a.addr, 8, drmgr::DrKind::kWrite},
                {drmgr::RequestId{11}, a.addr, 8, drmgr::DrKind::kReadWrite}};
  drmgr::SlotChange s1 = s0;
  s1.slot = 1;
  s1.chunk = drmgr::Chunk{a.addr + 8, 8};
  s1.kind = drmgr::DrKind::kWrite;
  s1.holders = {{drmgr::RequestId{12}, b.addr, 4, drmgr::DrKind::kWrite}};
  ch.slots = {s0, s1};
  StopBackend backend(*t.proc, t.watches, *t.symbolizer, owners);
  ASSERT_TRUE(backend.Arm().ok());
  ASSERT_TRUE(backend.Apply(ch).ok());
  const int r0 = RegisterOf(backend, pid, a.addr);
  const int r1 = RegisterOf(backend, pid, a.addr + 8);
  ASSERT_GE(r0, 0);
  ASSERT_GE(r1, 0);

  ASSERT_TRUE(t.proc->StopAll().ok());
  QuietHardware(pid);
  // Both registers "fired": the store touched slot 0 only, so g_rec.b's holder sees nothing.
  const unsigned long dr6 = (1UL << r0) | (1UL << r1);
  ASSERT_EQ(::ptrace(PTRACE_POKEUSER, pid, DrOffset(6), reinterpret_cast<void*>(dr6)), 0);
  ASSERT_TRUE(t.proc->ResumeAll().ok());
  t.Go(1);
  t.RunToExit();
  EXPECT_EQ(t.proc->exit_info()->code, 0);

  std::vector<core::AccessEvent> events;
  backend.Collect(events);
  ASSERT_EQ(events.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(events[i].watch_id, i);
    EXPECT_EQ(events[i].kind, core::AccessKind::kWrite);
    EXPECT_EQ(events[i].access_addr, a.addr);
    EXPECT_EQ(events[i].access_size, 8u);
    EXPECT_EQ(events[i].old_value, std::optional<uint64_t>(0x1111111111111111ULL));
    EXPECT_EQ(events[i].value, std::optional<uint64_t>(0x77));
  }
  EXPECT_EQ(backend.unrelated(), 1u);
}

TEST(StopBackend, ForkedChildKeepsNoDebugRegisters) {
  Target t({"fork"});
  ASSERT_TRUE(t.ok());
  t.WaitMilestone();
  const pid_t pid = t.proc->pid();
  const drmgr::Grant g = t.AddWatch("g_rec.a", drmgr::DrKind::kWrite, drmgr::Scope::Process(pid));
  StopBackend backend(*t.proc, t.watches, *t.symbolizer, t.owners);
  ASSERT_TRUE(backend.Arm().ok());
  ASSERT_TRUE(backend.Apply(g.changes).ok());
  t.Go(1);
  t.WaitMilestone();  // forked; kwatch cleaned the child up and let it go
  EXPECT_EQ(t.proc->forks(), 1u);
  std::ifstream children("/proc/" + std::to_string(pid) + "/task/" + std::to_string(pid) +
                         "/children");
  pid_t child = 0;
  ASSERT_TRUE(children >> child);
  ASSERT_EQ(::ptrace(PTRACE_SEIZE, child, nullptr, 0), 0) << std::strerror(errno);
  ASSERT_EQ(::ptrace(PTRACE_INTERRUPT, child, nullptr, 0), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, __WALL), child);
  const ThreadDebugRegs regs = Peek(child);
  EXPECT_EQ(regs, ThreadDebugRegs{});
  EXPECT_EQ(PeekDr(child, 6), 0u);
  ASSERT_EQ(::ptrace(PTRACE_DETACH, child, nullptr, 0), 0);
  t.Go(2);
  t.RunToExit();
  EXPECT_EQ(t.proc->exit_info()->code, 0);
}

// End to end where the hardware delivers debug traps: every store and load of g_rec.a.
TEST(StopBackend, CountsEveryAccessWhereTrapsAreDelivered) {
  constexpr uint64_t kN = 50;
  Target t({"count", std::to_string(kN)});
  ASSERT_TRUE(t.ok());
  t.WaitMilestone();
  const pid_t pid = t.proc->pid();
  const drmgr::Grant g =
      t.AddWatch("g_rec.a", drmgr::DrKind::kReadWrite, drmgr::Scope::Process(pid));
  StopBackend backend(*t.proc, t.watches, *t.symbolizer, t.owners);
  ASSERT_TRUE(backend.Arm().ok());
  ASSERT_TRUE(backend.Apply(g.changes).ok());
  KW_REQUIRE_DEBUG_TRAPS();
  t.Go(1);
  t.RunToExit();
  EXPECT_EQ(t.proc->exit_info()->code, 0);
  std::vector<core::AccessEvent> events;
  backend.Collect(events);
  uint64_t writes = 0;
  uint64_t reads = 0;
  for (const core::AccessEvent& ev : events) {
    if (ev.kind == core::AccessKind::kWrite) {
      ++writes;
      EXPECT_EQ(ev.value, std::optional<uint64_t>(writes));
      EXPECT_EQ(ev.old_value,
                std::optional<uint64_t>(writes == 1 ? 0x1111111111111111ULL : writes - 1));
    } else {
      ++reads;
      EXPECT_EQ(ev.value, std::optional<uint64_t>(writes));
    }
  }
  EXPECT_EQ(writes, kN);
  EXPECT_EQ(reads, kN);
}

}  // namespace
}  // namespace kwatch::watch
