#include "watch/stop_backend.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/hw_breakpoint.h>
#include <linux/perf_event.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
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

#include "core/base/unique_fd.h"
#include "core/ptrace/process.h"
#include "core/ptrace/trap_origin.h"
#include "core/symbols/expr.h"
#include "core/symbols/symbolizer.h"
#include "core/symbols/symbols.h"
#include "drmgr/dr7.h"
#include "drmgr/slot_allocator.h"
#include "tests/test_util.h"
#include "tests/watch/debug_traps.h"
#include "watch/trap_breakpoints.h"

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

// DR0-DR3 and DR7 as ptrace shows them: kwatch writes none of them.
ThreadDebugRegs Peek(pid_t tid) {
  ThreadDebugRegs r;
  for (int p = 0; p < 4; ++p) {
    r.addr[p] = PeekDr(tid, p);
  }
  r.dr7 = PeekDr(tid, 7);
  return r;
}

// FreeDebugRegisters, asked again while it is below `want`: a kernel watch of a test running in
// parallel takes a register of every thread for a moment.
int FreeRegistersSettled(pid_t tid, uint64_t addr, int want) {
  int free = ::kwatch::testing::FreeDebugRegisters(tid, addr);
  for (int attempt = 0; attempt < 50 && free < want; ++attempt) {
    ::usleep(100 * 1000);
    free = ::kwatch::testing::FreeDebugRegisters(tid, addr);
  }
  return free;
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

// The perf events of the backend's breakpoints in thread `tid` as (address, kind, length),
// each checked: an open close-on-exec descriptor, kwatch's sig_data naming the register the
// backend's model puts the slot in.
SlotSet EventsOf(const StopBackend& backend, pid_t tid) {
  SlotSet out;
  const ThreadDebugRegs model = backend.RegistersOf(tid);
  for (const TrapBreakpoints::Event& e : backend.breakpoints().Events()) {
    if (e.tid != tid) {
      continue;
    }
    EXPECT_EQ(::fcntl(e.fd, F_GETFD), FD_CLOEXEC) << "thread " << tid << " DR" << e.reg;
    EXPECT_TRUE(core::ptrace::IsKwatchSigData(e.sig_data));
    EXPECT_EQ(TrapSigDataRegister(e.sig_data), e.reg);
    EXPECT_EQ(model.addr[e.reg], e.slot.addr.value) << "thread " << tid << " DR" << e.reg;
    EXPECT_NE(model.dr7 & (uint64_t{3} << (2 * e.reg)), 0u) << "thread " << tid << " DR" << e.reg;
    out.emplace(e.slot.addr.value, static_cast<int>(e.slot.kind), e.slot.len);
  }
  return out;
}

// The breakpoint in register `reg` of thread `tid`.
TrapBreakpoints::Event EventAt(const StopBackend& backend, pid_t tid, int reg) {
  for (const TrapBreakpoints::Event& e : backend.breakpoints().Events()) {
    if (e.tid == tid && e.reg == reg) {
      return e;
    }
  }
  ADD_FAILURE() << "no breakpoint in DR" << reg << " of thread " << tid;
  return {};
}

// A launched stop_target, its symbols and the drmgr allocator of the test.
class Target {
 public:
  explicit Target(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {kwatch::testing::TargetPath("stop_target")};
    argv.insert(argv.end(), args.begin(), args.end());
    auto p = core::ptrace::Process::Launch(argv);
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) {
      return;
    }
    proc = *std::move(p);
    EXPECT_TRUE(proc->RunToEntry().ok());  // leaves it stopped at its entry point
    auto s = core::symbols::Symbols::ForProcess(proc->pid());
    EXPECT_TRUE(s.ok()) << s.status();
    if (s.ok()) {
      symbols = *std::move(s);
      symbolizer = std::make_unique<core::symbols::Symbolizer>(*symbols);
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

  core::symbols::ResolvedExpr Resolve(const std::string& text) {
    auto e = core::symbols::ParseExpr(text);
    EXPECT_TRUE(e.ok()) << e.status();
    auto r = symbols->Resolve(*e, [this](core::RemoteAddr a, std::span<uint8_t> out) {
      return proc->ReadMemory(a, out);
    });
    EXPECT_TRUE(r.ok()) << text << ": " << r.status();
    return r.ok() ? *r : core::symbols::ResolvedExpr{};
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
      for (const core::ptrace::ProcessEvent& e : *ev) {
        ASSERT_NE(e.kind, core::ptrace::ProcessEvent::Kind::kExited) << "target ended early";
        if (e.kind == core::ptrace::ProcessEvent::Kind::kSignal && e.signal == SIGUSR1) {
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
  void Set(const std::string& sym, uint64_t value) {
    const uint64_t addr = Resolve(sym).addr.value;
    ASSERT_TRUE(proc->WriteMemory(core::RemoteAddr{addr},
                                  std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(&value),
                                                           sizeof(value)))
                    .ok());
  }
  // Runs to the end; returns the SIGTRAPs passed on to the program.
  int RunToExit() {
    int traps = 0;
    while (proc->alive()) {
      auto ev = proc->Poll(true);
      EXPECT_TRUE(ev.ok()) << ev.status();
      if (!ev.ok()) {
        break;
      }
      for (const core::ptrace::ProcessEvent& e : *ev) {
        traps += e.kind == core::ptrace::ProcessEvent::Kind::kSignal && e.signal == SIGTRAP ? 1 : 0;
      }
    }
    return traps;
  }

  std::unique_ptr<core::ptrace::Process> proc;
  std::unique_ptr<core::symbols::Symbols> symbols;
  std::unique_ptr<core::symbols::Symbolizer> symbolizer;
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
    const uint64_t any = t.Resolve("g_go").addr.value;
    for (pid_t tid : tids) {
      const ThreadDebugRegs regs = backend.RegistersOf(tid);
      const SlotSet want = Expected(t.alloc, pid, tid);
      EXPECT_EQ(Enabled(regs), want) << "thread " << tid;
      EXPECT_EQ(EventsOf(backend, tid), want) << "thread " << tid;
      EXPECT_EQ(want.size(), tid == pid ? 4u : 3u);
      ExpectProcessSlotsInPlace(t.alloc, pid, regs, tid);
      // The kernel counts them against the thread's four registers; ptrace shows none.
      EXPECT_EQ(FreeRegistersSettled(tid, any, 4 - static_cast<int>(want.size())),
                4 - static_cast<int>(want.size()))
          << "thread " << tid;
      EXPECT_EQ(Peek(tid), ThreadDebugRegs{}) << "thread " << tid;
    }
    EXPECT_EQ(backend.breakpoints().open_events(), 3 * tids.size() + 1);
    ASSERT_TRUE(t.proc->ResumeAll().ok());
  };
  check_all(4);
  t.Go(1);
  t.WaitMilestone();  // 2 more threads, created after arming
  check_all(6);

  // Disarm closes every event: each thread has its four registers free again.
  backend.Disarm();
  EXPECT_EQ(backend.breakpoints().open_events(), 0u);
  for (pid_t tid : t.proc->TracedThreads()) {
    EXPECT_EQ(backend.RegistersOf(tid), ThreadDebugRegs{}) << "thread " << tid;
    EXPECT_EQ(FreeRegistersSettled(tid, t.Resolve("g_go").addr.value, 4), 4) << "thread " << tid;
  }
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

  std::map<pid_t, ThreadDebugRegs> before;
  std::map<pid_t, SlotSet> events;
  for (pid_t tid : t.proc->TracedThreads()) {
    before[tid] = backend.RegistersOf(tid);
    events[tid] = EventsOf(backend, tid);
    EXPECT_EQ(Enabled(before[tid]).size(), 2u);
    EXPECT_EQ(events[tid], Enabled(before[tid]));
    EXPECT_EQ(FreeRegistersSettled(tid, go, tid == busy ? 0 : 2), tid == busy ? 0 : 2)
        << "thread " << tid;
  }

  const absl::Status s = backend.Apply(g3.changes);  // a fifth slot in `busy`
  EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
  ASSERT_TRUE(backend.refused_scope().has_value());
  EXPECT_EQ(*backend.refused_scope(), proc_scope);

  for (pid_t tid : t.proc->TracedThreads()) {
    EXPECT_EQ(EventsOf(backend, tid), events[tid]) << "thread " << tid << " (busy " << busy << ")";
    EXPECT_EQ(backend.RegistersOf(tid), before[tid]) << "thread " << tid;
    EXPECT_EQ(FreeRegistersSettled(tid, go, tid == busy ? 0 : 2), tid == busy ? 0 : 2)
        << "thread " << tid;
  }
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

// Disables every breakpoint event behind the backend's back (PERF_EVENT_IOC_DISABLE: the test
// is the tracer and holds the descriptors): they stay open, counted and known to the backend,
// but the processor no longer traps, so that on a machine that delivers debug traps only the
// forged trap arrives.
void QuietHardware(const StopBackend& backend) {
  for (const TrapBreakpoints::Event& e : backend.breakpoints().Events()) {
    ASSERT_EQ(::ioctl(e.fd, PERF_EVENT_IOC_DISABLE, 0), 0) << std::strerror(errno);
  }
}

// The decision logic on a crafted trap, the same on every machine: the target forges the stop
// a write breakpoint makes (SIGTRAP TRAP_PERF right after its store, see
// tests/targets/stop_target.c) with the perf data of the breakpoint the test names, the
// hardware quiet (QuietHardware).
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

  QuietHardware(backend);
  t.Set("g_sig_data", EventAt(backend, pid, reg).sig_data);
  t.Go(1);
  EXPECT_EQ(t.RunToExit(), 0);  // claimed: the program never sees it
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
  const core::symbols::ResolvedExpr a = t.Resolve("g_rec.a");
  const core::symbols::ResolvedExpr b = t.Resolve("g_rec.b");
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

  QuietHardware(backend);
  // The trap names slot 1 (one access sends one SIGTRAP, with one register's data), whose
  // bytes the store missed: the decoded store gives the hit to slot 0 (read-write, touched),
  // and g_rec.b's holder sees nothing.
  t.Set("g_sig_data", EventAt(backend, pid, r1).sig_data);
  t.Go(1);
  EXPECT_EQ(t.RunToExit(), 0);
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
  // DR6 as in a thread that never trapped (its reserved bits read as ones, Linux 6.x).
  EXPECT_EQ(PeekDr(child, 6), 0xFFFF0FF0u);
  // No breakpoint event of the parent's came with the fork (none is inherited).
  EXPECT_EQ(FreeRegistersSettled(child, t.Resolve("g_go").addr.value, 4), 4);
  EXPECT_EQ(FreeRegistersSettled(pid, t.Resolve("g_go").addr.value, 3), 3);
  ASSERT_EQ(::ptrace(PTRACE_DETACH, child, nullptr, 0), 0);
  t.Go(2);
  t.RunToExit();
  EXPECT_EQ(t.proc->exit_info()->code, 0);
}

// A TRAP_PERF that is not kwatch's (the program's own perf event with sigtrap) reaches the
// program unchanged; one with kwatch's magic but of no breakpoint kwatch holds (closed or
// replaced before the trap was seen) is claimed and dropped as a stray trap.
TEST(StopBackend, ForgedPerfTrapsOfOthersAreDeliveredAndStaleOnesDropped) {
  for (const bool own : {false, true}) {
    Target t({"forge", "0x42"});
    ASSERT_TRUE(t.ok());
    t.WaitMilestone();
    const pid_t pid = t.proc->pid();
    const drmgr::Grant g = t.AddWatch("g_rec.a", drmgr::DrKind::kWrite, drmgr::Scope::Process(pid));
    StopBackend backend(*t.proc, t.watches, *t.symbolizer, t.owners);
    ASSERT_TRUE(backend.Arm().ok());
    ASSERT_TRUE(backend.Apply(g.changes).ok());
    const int reg = RegisterOf(backend, pid, t.watches[0].target.addr);
    ASSERT_GE(reg, 0);
    QuietHardware(backend);
    const uint64_t live = EventAt(backend, pid, reg).sig_data;
    // Another serial in the same register: kwatch's, but no open breakpoint's.
    const uint64_t data = own ? live ^ (uint64_t{1} << 10) : 0x1234;
    ASSERT_NE(TrapSigDataRegister(data), own ? -1 : 0);
    t.Set("g_sig_data", data);
    t.Go(1);
    EXPECT_EQ(t.RunToExit(), own ? 0 : 1) << (own ? "stale" : "the program's own");
    EXPECT_FALSE(t.proc->exit_info()->signaled);
    EXPECT_EQ(t.proc->exit_info()->code, 0);
    std::vector<core::AccessEvent> events;
    backend.Collect(events);
    EXPECT_TRUE(events.empty());
    EXPECT_EQ(backend.stray_traps(), own ? 1u : 0u);
  }
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

// One access that hits two registers sends one SIGTRAP naming one of them: both watches get
// the access (g_rec.a as two 4-byte read-write slots; each 8-byte store and load touches both).
TEST(StopBackend, OneAccessHittingTwoRegistersCountsForBoth) {
  constexpr uint64_t kN = 50;
  Target t({"count", std::to_string(kN)});
  ASSERT_TRUE(t.ok());
  t.WaitMilestone();
  const pid_t pid = t.proc->pid();
  const core::symbols::ResolvedExpr a = t.Resolve("g_rec.a");
  for (uint32_t half = 0; half < 2; ++half) {
    Watch w;
    w.id = half;
    w.request.expr = "g_rec.a";
    w.request.kind = drmgr::DrKind::kReadWrite;
    w.target = a;
    w.target.addr = a.addr + 4 * half;
    w.target.length = 4;
    t.watches.push_back(w);
  }
  const std::map<drmgr::RequestId, uint32_t> owners = {{drmgr::RequestId{20}, 0},
                                                       {drmgr::RequestId{21}, 1}};
  drmgr::Changes ch;
  for (int half = 0; half < 2; ++half) {
    drmgr::SlotChange c;
    c.op = drmgr::SlotChange::Op::kArm;
    c.scope = drmgr::Scope::Process(pid);
    c.slot = half;
    c.chunk = drmgr::Chunk{a.addr + 4 * half, 4};
    c.kind = drmgr::DrKind::kReadWrite;
    c.holders = {{drmgr::RequestId{static_cast<uint64_t>(20 + half)}, a.addr + 4 * half, 4,
                  drmgr::DrKind::kReadWrite}};
    ch.slots.push_back(c);
  }
  StopBackend backend(*t.proc, t.watches, *t.symbolizer, owners);
  ASSERT_TRUE(backend.Arm().ok());
  ASSERT_TRUE(backend.Apply(ch).ok());
  EXPECT_EQ(EventsOf(backend, pid).size(), 2u);
  KW_REQUIRE_DEBUG_TRAPS();
  t.Go(1);
  EXPECT_EQ(t.RunToExit(), 0);
  EXPECT_EQ(t.proc->exit_info()->code, 0);
  std::vector<core::AccessEvent> events;
  backend.Collect(events);
  std::array<uint64_t, 2> writes{};
  std::array<uint64_t, 2> reads{};
  for (const core::AccessEvent& ev : events) {
    ASSERT_LT(ev.watch_id, 2u);
    const bool low = ev.watch_id == 0;
    EXPECT_EQ(ev.access_addr, a.addr + (low ? 0 : 4));
    EXPECT_EQ(ev.access_size, 4u);
    if (ev.kind == core::AccessKind::kWrite) {
      ++writes[ev.watch_id];
      if (low) {
        EXPECT_EQ(ev.value, std::optional<uint64_t>(writes[0]));
        EXPECT_EQ(ev.old_value,
                  std::optional<uint64_t>(writes[0] == 1 ? 0x11111111 : writes[0] - 1));
      } else {
        EXPECT_EQ(ev.value, std::optional<uint64_t>(0));
      }
    } else {
      ++reads[ev.watch_id];
    }
  }
  EXPECT_EQ(writes, (std::array<uint64_t, 2>{kN, kN}));
  EXPECT_EQ(reads, (std::array<uint64_t, 2>{kN, kN}));
  EXPECT_EQ(backend.stray_traps(), 0u);
}

}  // namespace
}  // namespace kwatch::watch
