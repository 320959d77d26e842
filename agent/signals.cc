// Signals (docs/agent.md "Signals and odd programs"): the agent's SIGTRAP/SIGSEGV/SIGBUS
// handler stays first in line, the program's own is kept as the next and called as the kernel
// would have called it, and the default action kills the process exactly as without kwatch.
//
// The program cannot displace the agent's handler: libc's sigaction and pthread_sigmask are
// hooked (their first bytes replaced by a jmp to the agent's versions, INT3 first). For the
// three signals, sigaction records the program's action and answers with it; for every
// signal, the three are taken out of the kernel's sa_mask and out of pthread_sigmask's sets
// (the program is told what it asked for), so an int3 or a safe read never meets a blocked
// SIGTRAP/SIGSEGV/SIGBUS, which the kernel would turn into death.

#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <csignal>
#include <cstdint>

#include "agent/agent.h"
#include "agent/sys.h"

namespace kwatch::agent {

namespace {

// An action as the kernel holds it (the program's, for the three signals).
struct Action {
  uint64_t handler = 0;
  uint64_t flags = 0;
  uint64_t restorer = 0;
  uint64_t mask = 0;
};

// The program's action for SIGTRAP, SIGSEGV, SIGBUS, read under a seqlock by any handler;
// written with g_lock held.
struct ChainSlot {
  std::atomic<uint32_t> seq;
  std::atomic<uint64_t> handler;
  std::atomic<uint64_t> flags;
  std::atomic<uint64_t> restorer;
  std::atomic<uint64_t> mask;
};
std::array<ChainSlot, 3> g_chain;

int ChainIndex(int sig) {
  if (sig == SIGTRAP) {
    return 0;
  }
  return sig == SIGSEGV ? 1 : 2;
}

Action ReadChain(int sig) {
  const ChainSlot& c = g_chain[ChainIndex(sig)];
  Action a;
  for (;;) {
    const uint32_t s1 = c.seq.load(std::memory_order_acquire);
    if ((s1 & 1) != 0) {
      asm volatile("pause");
      continue;
    }
    a.handler = c.handler.load(std::memory_order_relaxed);
    a.flags = c.flags.load(std::memory_order_relaxed);
    a.restorer = c.restorer.load(std::memory_order_relaxed);
    a.mask = c.mask.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (c.seq.load(std::memory_order_relaxed) == s1) {
      return a;
    }
  }
}

void WriteChain(int sig, const Action& a) {
  ChainSlot& c = g_chain[ChainIndex(sig)];
  const uint32_t s = c.seq.load(std::memory_order_relaxed);
  c.seq.store(s + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  c.handler.store(a.handler, std::memory_order_relaxed);
  c.flags.store(a.flags, std::memory_order_relaxed);
  c.restorer.store(a.restorer, std::memory_order_relaxed);
  c.mask.store(a.mask, std::memory_order_relaxed);
  c.seq.store(s + 2, std::memory_order_release);
}

// Other signals: the agent's signals the program put in sa_mask (taken out of the kernel's).
std::array<uint64_t, 65> g_extra_mask;
// The writers' lock: the holder's (pid << 32 | tid), reentrant for the holder (a fork's
// prepare handlers run while the agent's holds it), and taken over by a process that
// inherited it held over fork (other child handlers may run before the agent's releases it).
std::atomic<uint64_t> g_lock;
uint32_t g_lock_depth;
uint64_t g_restorer;  // libc's __restore_rt, as libc's sigaction sets it
bool g_handlers_installed;

struct Hook {
  std::atomic<uint64_t> addr{0};
  uint64_t target = 0;
};
std::array<Hook, 2> g_hooks;

constexpr uint64_t kSaRestorer = 0x04000000;

void AgentHandler(int sig, siginfo_t* info, void* ucv);

uint64_t AgentFlags(uint64_t program_flags) {
  return SA_SIGINFO | SA_ONSTACK | SA_NODEFER | kSaRestorer | (program_flags & SA_RESTART);
}

long InstallKernel(int sig, const Action& program) {
  const KSigaction k{reinterpret_cast<uint64_t>(&AgentHandler), AgentFlags(program.flags),
                     g_restorer, program.mask & ~kAgentSignals};
  return SysRtSigaction(sig, &k, nullptr);
}

// A fault inside a safe routine goes on at its fixup.
bool FixupFault(ucontext_t* uc) {
  const auto rip = static_cast<uint64_t>(uc->uc_mcontext.gregs[REG_RIP]);
  for (const int32_t* e = kw_extable; e < kw_extable_end; e += 2) {
    const uint64_t insn = reinterpret_cast<uint64_t>(&e[0]) + static_cast<int64_t>(e[0]);
    if (rip == insn) {
      const uint64_t fixup = reinterpret_cast<uint64_t>(&e[1]) + static_cast<int64_t>(e[1]);
      uc->uc_mcontext.gregs[REG_RIP] = static_cast<greg_t>(fixup);
      return true;
    }
  }
  return false;
}

void AgentHandler(int sig, siginfo_t* info, void* ucv) {
  auto* uc = static_cast<ucontext_t*>(ucv);
  if (sig == SIGTRAP) {
    if (HandleTrap(info, uc)) {
      return;
    }
  } else if (FixupFault(uc)) {
    return;
  }
  ChainSignal(sig, info, uc);
}

// The default action of the three signals (terminate with a core): the same signal, with the
// same siginfo, is queued to this thread and delivered once the handler returns, on the
// program's own registers, with the default action in place.
void DefaultAction(int sig, const siginfo_t* info, ucontext_t* uc) {
  const KSigaction dfl{reinterpret_cast<uint64_t>(SIG_DFL), 0, 0, 0};
  SysRtSigaction(sig, &dfl, nullptr);
  const uint64_t bit = SigBit(sig);
  SysRtSigprocmask(SIG_BLOCK, &bit, nullptr);
  uc->uc_sigmask.__val[0] &= ~bit;
  Sys(SYS_rt_tgsigqueueinfo, SysGetpid(), SysGettid(), sig, Arg(info));
}

// A hook's replacement function: the jmp written over libc's.
int PatchHook(int i, uint64_t addr, uint64_t replacement) {
  std::array<uint8_t, 14> code{};
  size_t n = 0;
  const auto rel = static_cast<int64_t>(replacement - (addr + 5));
  if (rel == static_cast<int32_t>(rel)) {
    code[0] = 0xE9;  // jmp rel32
    for (int k = 0; k < 4; ++k) {
      code[1 + k] = static_cast<uint8_t>(static_cast<uint64_t>(rel) >> (8 * k));
    }
    n = 5;
  } else {
    code[0] = 0xFF;  // jmp *0(%rip); .quad replacement
    code[1] = 0x25;
    for (int k = 2; k < 6; ++k) {
      code[k] = 0;
    }
    for (int k = 0; k < 8; ++k) {
      code[6 + k] = static_cast<uint8_t>(replacement >> (8 * k));
    }
    n = 14;
  }
  uint8_t first = 0;
  if (ReadCode(addr, &first, 1) != 0 || first == 0xCC) {
    return -EBUSY;  // a debugger's breakpoint there: leave it alone
  }
  g_hooks[i].target = replacement;
  g_hooks[i].addr.store(addr, std::memory_order_release);
  return PatchCode(addr, code.data(), n);
}

}  // namespace

void LockSignals(uint64_t* saved_mask) {
  const uint64_t all = ~uint64_t{0};
  SysRtSigprocmask(SIG_BLOCK, &all, saved_mask);
  const auto pid = static_cast<uint64_t>(SysGetpid());
  const uint64_t me = (pid << 32) | static_cast<uint32_t>(SysGettid());
  for (;;) {
    uint64_t held = g_lock.load(std::memory_order_acquire);
    if (held == me) {
      ++g_lock_depth;
      return;
    }
    if ((held == 0 || (held >> 32) != pid) &&
        g_lock.compare_exchange_strong(held, me, std::memory_order_acquire)) {
      g_lock_depth = 1;
      return;
    }
    asm volatile("pause");
  }
}

void UnlockSignals(const uint64_t* saved_mask) {
  if (--g_lock_depth == 0) {
    g_lock.store(0, std::memory_order_release);
  }
  SysRtSigprocmask(SIG_SETMASK, saved_mask, nullptr);
}

void ReleaseSignalLockInChild(const uint64_t* saved_mask) {
  g_lock_depth = 0;
  g_lock.store(0, std::memory_order_release);
  SysRtSigprocmask(SIG_SETMASK, saved_mask, nullptr);
}

void DieOfSignal(int sig) {
  const KSigaction dfl{reinterpret_cast<uint64_t>(SIG_DFL), 0, 0, 0};
  SysRtSigaction(sig, &dfl, nullptr);
  const uint64_t bit = SigBit(sig);
  SysRtSigprocmask(SIG_UNBLOCK, &bit, nullptr);
  Sys(SYS_tgkill, SysGetpid(), SysGettid(), sig);
  Sys(SYS_kill, SysGetpid(), SIGKILL);
  for (;;) {
    asm volatile("hlt");
  }
}

void ChainSignal(int sig, siginfo_t* info, ucontext_t* uc) {
  if (sig == SIGTRAP) {
    if (Session* s = CurrentSession(); s != nullptr) {
      s->ctl->stray_traps.fetch_add(1, std::memory_order_relaxed);
    }
  }
  Action a = ReadChain(sig);
  const bool forced = info->si_code > 0;  // a fault or trap the kernel raised
  const auto ign = reinterpret_cast<uint64_t>(SIG_IGN);
  const auto dfl = reinterpret_cast<uint64_t>(SIG_DFL);
  if (a.handler == ign && !forced) {
    return;
  }
  if (a.handler == dfl || a.handler == ign) {
    // A forced signal that is ignored kills as the default action does (the kernel's
    // force_sig_info resets it).
    DefaultAction(sig, info, uc);
    return;
  }
  if ((a.flags & SA_RESETHAND) != 0) {
    uint64_t saved = 0;
    LockSignals(&saved);
    Action now = ReadChain(sig);
    if (now.handler == a.handler) {
      now.handler = dfl;
      now.flags &= ~static_cast<uint64_t>(SA_SIGINFO | SA_RESETHAND);
      WriteChain(sig, now);
    }
    UnlockSignals(&saved);
  }
  // The kernel already applied the program's sa_mask (less the three signals) on the way in.
  auto* fn = reinterpret_cast<void (*)(int, siginfo_t*, void*)>(a.handler);
  fn(sig, info, uc);
}

bool RedirectHookTrap(ucontext_t* uc) {
  greg_t* g = uc->uc_mcontext.gregs;
  const uint64_t at = static_cast<uint64_t>(g[REG_RIP]) - 1;
  const auto* hook = std::ranges::find_if(g_hooks, [at](const Hook& h) {
    return at != 0 && h.addr.load(std::memory_order_acquire) == at;
  });
  if (hook == g_hooks.end()) {
    return false;
  }
  g[REG_RIP] = static_cast<greg_t>(hook->target);
  return true;
}

int InstallSignalHandlers() {
  if (g_handlers_installed) {
    return 0;
  }
  constexpr std::array<int, 3> kSignals = {SIGTRAP, SIGSEGV, SIGBUS};
  // The program's actions first, so that a signal arriving meanwhile finds its next.
  for (const int sig : kSignals) {
    KSigaction old{};
    const long r = SysRtSigaction(sig, nullptr, &old);
    if (r < 0) {
      return static_cast<int>(r);
    }
    WriteChain(sig, Action{old.handler, old.flags, old.restorer, old.mask});
  }
  // SIGTRAP through libc's sigaction, to learn libc's restorer (__restore_rt), which
  // debuggers and unwinders recognise by its bytes; the others with it, raw.
  const Action trap = ReadChain(SIGTRAP);
  struct sigaction sa {};
  sa.sa_sigaction = &AgentHandler;
  sa.sa_flags = static_cast<int>(AgentFlags(trap.flags) & ~kSaRestorer);
  sa.sa_mask.__val[0] = trap.mask & ~kAgentSignals;
  if (sigaction(SIGTRAP, &sa, nullptr) != 0) {
    return -errno;
  }
  KSigaction now{};
  if (const long r = SysRtSigaction(SIGTRAP, nullptr, &now); r < 0) {
    return static_cast<int>(r);
  }
  g_restorer = now.restorer;
  for (const int sig : {SIGSEGV, SIGBUS}) {
    if (const long r = InstallKernel(sig, ReadChain(sig)); r < 0) {
      return static_cast<int>(r);
    }
  }
  // Handlers of other signals must not block the three while they run.
  for (int sig = 1; sig <= 64; ++sig) {
    if ((SigBit(sig) & kAgentSignals) != 0 || sig == SIGKILL || sig == SIGSTOP || sig == 32 ||
        sig == 33) {
      continue;
    }
    KSigaction k{};
    if (SysRtSigaction(sig, nullptr, &k) < 0 || k.handler <= 1 || (k.mask & kAgentSignals) == 0) {
      continue;
    }
    g_extra_mask[sig] = k.mask & kAgentSignals;
    k.mask &= ~kAgentSignals;
    SysRtSigaction(sig, &k, nullptr);
  }
  g_handlers_installed = true;
  return 0;
}

// ---------------------------------------------------------------------------------------
// The hooks: libc's sigaction and pthread_sigmask jump here.

int HookSigaction(int sig, const struct sigaction* act, struct sigaction* oact) {
  if (sig <= 0 || sig >= 65 || sig == 32 || sig == 33) {
    errno = EINVAL;
    return -1;
  }
  // Read the program's struct before any lock (a bad pointer faults here, as in libc).
  Action want;
  const bool set = act != nullptr;
  if (set) {
    want.handler = reinterpret_cast<uint64_t>(act->sa_handler);
    want.flags = static_cast<uint64_t>(static_cast<int64_t>(act->sa_flags)) | kSaRestorer;
    want.restorer = g_restorer;
    want.mask = act->sa_mask.__val[0];
  }
  Action old;
  long r = 0;
  uint64_t saved = 0;
  LockSignals(&saved);
  if ((SigBit(sig) & kAgentSignals) != 0) {
    old = ReadChain(sig);
    if (set) {
      r = InstallKernel(sig, want);
      if (r == 0) {
        WriteChain(sig, want);
      }
    }
  } else {
    const KSigaction k{want.handler, want.flags, want.restorer, want.mask & ~kAgentSignals};
    KSigaction ko{};
    r = SysRtSigaction(sig, set ? &k : nullptr, &ko);
    if (r == 0) {
      old = Action{ko.handler, ko.flags, ko.restorer, ko.mask | g_extra_mask[sig]};
      if (set) {
        g_extra_mask[sig] = want.mask & kAgentSignals;
      }
    }
  }
  UnlockSignals(&saved);
  if (r < 0) {
    errno = static_cast<int>(-r);
    return -1;
  }
  if (oact != nullptr) {
    oact->sa_handler = reinterpret_cast<__sighandler_t>(old.handler);
    for (uint64_t& w : oact->sa_mask.__val) {
      w = 0;
    }
    oact->sa_mask.__val[0] = old.mask;
    oact->sa_flags = static_cast<int>(old.flags);
    oact->sa_restorer = reinterpret_cast<void (*)()>(old.restorer);
  }
  return 0;
}

int HookPthreadSigmask(int how, const sigset_t* set, sigset_t* oset) {
  constexpr uint64_t kInternal = SigBit(32) | SigBit(33);  // glibc's SIGCANCEL, SIGSETXID
  const uint64_t want = set != nullptr ? set->__val[0] & ~kInternal : 0;
  const uint64_t kernel_set = want & ~kAgentSignals;
  uint64_t kernel_old = 0;
  const long r = SysRtSigprocmask(how, set != nullptr ? &kernel_set : nullptr,
                                  oset != nullptr ? &kernel_old : nullptr);
  if (r < 0) {
    return static_cast<int>(-r);
  }
  ThreadState& t = t_state;
  const uint64_t view = t.blocked_view;
  if (set != nullptr) {
    if (how == SIG_BLOCK) {
      t.blocked_view |= want & kAgentSignals;
    } else if (how == SIG_UNBLOCK) {
      t.blocked_view &= ~want;
    } else {
      t.blocked_view = want & kAgentSignals;
    }
  }
  if (oset != nullptr) {
    oset->__val[0] = kernel_old | view;
  }
  return 0;
}

int InstallSignalHooks() {
  if (g_hooks[0].addr.load(std::memory_order_acquire) != 0) {
    return 0;
  }
  void* libc = dlopen("libc.so.6", RTLD_NOLOAD | RTLD_LAZY);
  if (libc == nullptr) {
    return -ENOENT;
  }
  void* sigaction_fn = dlsym(libc, "sigaction");
  void* sigmask_fn = dlsym(libc, "pthread_sigmask");
  dlclose(libc);
  if (sigaction_fn == nullptr || sigmask_fn == nullptr) {
    return -ENOENT;
  }
  if (const int r = PatchHook(0, reinterpret_cast<uint64_t>(sigaction_fn),
                              reinterpret_cast<uint64_t>(&HookSigaction));
      r != 0) {
    return r;
  }
  return PatchHook(1, reinterpret_cast<uint64_t>(sigmask_fn),
                   reinterpret_cast<uint64_t>(&HookPthreadSigmask));
}

}  // namespace kwatch::agent
