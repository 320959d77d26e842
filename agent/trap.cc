// The INT3 path (docs/agent.md "The hit paths"): a SIGTRAP whose 0xCC is a probe's runs the
// probes on registers copied from the ucontext, then resumes the thread as KwProbe::resume
// says: out of line, or by emulating the branch on the ucontext's registers. No libc call.

#include <array>
#include <csignal>
#include <cstdint>

#include "agent/agent.h"
#include "agent/sys.h"

namespace kwatch::agent {

namespace {

constexpr uint64_t kCf = 1ULL << 0;
constexpr uint64_t kPf = 1ULL << 2;
constexpr uint64_t kZf = 1ULL << 6;
constexpr uint64_t kSf = 1ULL << 7;
constexpr uint64_t kOf = 1ULL << 11;

// The ucontext's greg index of each KwReg up to gs (-1: not in the gregs).
constexpr std::array<int, kKwRegCount> kGreg = {
    REG_R15, REG_R14, REG_R13, REG_R12, REG_RBP, REG_RBX, REG_R11, REG_R10, REG_R9,
    REG_R8,  REG_RAX, REG_RCX, REG_RDX, REG_RSI, REG_RDI, -1,      REG_RIP, -1,
    REG_EFL, REG_RSP, -1,      -1,      -1,      -1,      -1,      -1,      -1};

void FillRegs(const ucontext_t* uc, KwRegs& regs) {
  const greg_t* g = uc->uc_mcontext.gregs;
  auto* words = reinterpret_cast<uint64_t*>(&regs);
  for (int i = 0; i < kKwRegCount; ++i) {
    words[i] = kGreg[i] >= 0 ? static_cast<uint64_t>(g[kGreg[i]]) : 0;
  }
  regs.orig_rax = ~uint64_t{0};
  // REG_CSGSFS: cs, gs, fs, ss (16 bits each).
  const auto csgsfs = static_cast<uint64_t>(g[REG_CSGSFS]);
  regs.cs = csgsfs & 0xffff;
  regs.gs = (csgsfs >> 16) & 0xffff;
  regs.fs = (csgsfs >> 32) & 0xffff;
  regs.ss = (csgsfs >> 48) & 0xffff;
}

uint64_t RegAt(const KwRegs& regs, uint32_t kwreg) {
  return reinterpret_cast<const uint64_t*>(&regs)[kwreg];
}

// Whether a KwCond holds; loop* update *rcx.
bool CondHolds(uint32_t cond, uint64_t eflags, uint64_t* rcx) {
  const uint32_t c = cond & 0xff;
  if (c < 16) {
    bool r = false;
    switch (c >> 1) {
      case 0:
        r = (eflags & kOf) != 0;
        break;
      case 1:
        r = (eflags & kCf) != 0;
        break;
      case 2:
        r = (eflags & kZf) != 0;
        break;
      case 3:
        r = (eflags & (kCf | kZf)) != 0;
        break;
      case 4:
        r = (eflags & kSf) != 0;
        break;
      case 5:
        r = (eflags & kPf) != 0;
        break;
      case 6:
        r = ((eflags & kSf) != 0) != ((eflags & kOf) != 0);
        break;
      default:
        r = (eflags & kZf) != 0 || ((eflags & kSf) != 0) != ((eflags & kOf) != 0);
        break;
    }
    return (c & 1) != 0 ? !r : r;
  }
  switch (c) {
    case kKwCondJrcxz:
      return *rcx == 0;
    case kKwCondJecxz:
      return (*rcx & 0xffffffffULL) == 0;
    case kKwCondLoop:
    case kKwCondLoope:
    case kKwCondLoopne: {
      const uint64_t v = (cond & kKwCondAddr32) != 0 ? (*rcx - 1) & 0xffffffffULL : *rcx - 1;
      *rcx = v;
      if (v == 0) {
        return false;
      }
      if (c == kKwCondLoope) {
        return (eflags & kZf) != 0;
      }
      if (c == kKwCondLoopne) {
        return (eflags & kZf) == 0;
      }
      return true;
    }
    default:
      return false;
  }
}

// The CPU would have faulted on `fault_addr` executing the probed instruction at `addr`:
// deliver that SIGSEGV as the kernel would (the program's handler, or death).
void FaultAsAt(ucontext_t* uc, uint64_t addr, uint64_t fault_addr) {
  uc->uc_mcontext.gregs[REG_RIP] = static_cast<greg_t>(addr);
  siginfo_t si{};
  si.si_signo = SIGSEGV;
  si.si_code = SEGV_MAPERR;
  si.si_addr = reinterpret_cast<void*>(fault_addr);
  ChainSignal(SIGSEGV, &si, uc);
}

// Sets the ucontext to go on after the probed instruction at `addr` (regs: before it).
void Resume(const KwProbe& p, uint64_t addr, const KwRegs& regs, ucontext_t* uc) {
  greg_t* g = uc->uc_mcontext.gregs;
  const uint64_t next = addr + p.insn_len;
  const uint32_t flags = p.flags.load(std::memory_order_relaxed);
  uint64_t rip = 0;
  if ((flags & (kKwProbeJump | kKwProbeRemoving)) != 0 || p.resume == kKwResumeXol) {
    rip = p.xol_addr;
  } else {
    switch (p.resume) {
      case kKwResumeJmp:
        rip = p.target;
        break;
      case kKwResumeJcc: {
        uint64_t rcx = regs.rcx;
        rip = CondHolds(p.cond, regs.eflags, &rcx) ? p.target : next;
        g[REG_RCX] = static_cast<greg_t>(rcx);
        break;
      }
      case kKwResumeCall:
        if (!SafeWrite8(regs.rsp - 8, next)) {
          FaultAsAt(uc, addr, regs.rsp - 8);
          return;
        }
        g[REG_RSP] = static_cast<greg_t>(regs.rsp - 8);
        rip = p.target;
        break;
      case kKwResumeRet: {
        uint64_t to = 0;
        if (!SafeRead8(regs.rsp, &to)) {
          FaultAsAt(uc, addr, regs.rsp);
          return;
        }
        const uint64_t rsp = regs.rsp + 8 + p.ret_imm;
        g[REG_RSP] = static_cast<greg_t>(rsp);
        rip = to;
        break;
      }
      case kKwResumeIndirect: {
        const uint32_t f = p.ind_flags;
        if ((f & kKwIndMemory) == 0) {
          rip = p.ind_base != 0 && p.ind_base <= kKwRegCount ? RegAt(regs, p.ind_base - 1) : 0;
        } else {
          auto ea = static_cast<uint64_t>(p.ind_disp);
          if (p.ind_base != 0 && p.ind_base <= kKwRegCount) {
            ea += RegAt(regs, p.ind_base - 1);
          }
          if (p.ind_index != 0 && p.ind_index <= kKwRegCount) {
            ea += RegAt(regs, p.ind_index - 1) * p.ind_scale;
          }
          if ((f & kKwIndAddr32) != 0) {
            ea &= 0xffffffffULL;
          }
          if ((f & kKwIndFs) != 0) {
            ea += FsBase();
          } else if ((f & kKwIndGs) != 0) {
            ea += GsBaseExact();
          }
          if (!SafeRead8(ea, &rip)) {
            FaultAsAt(uc, addr, ea);
            return;
          }
        }
        if ((f & kKwIndCall) != 0) {
          if (!SafeWrite8(regs.rsp - 8, next)) {
            FaultAsAt(uc, addr, regs.rsp - 8);
            return;
          }
          g[REG_RSP] = static_cast<greg_t>(regs.rsp - 8);
        }
        break;
      }
      default:
        break;
    }
  }
  if (rip == 0) {
    // kwatch gave no way on (no out-of-line copy): the thread cannot run past the 0xCC.
    DieOfSignal(SIGTRAP);
  }
  g[REG_RIP] = static_cast<greg_t>(rip);
}

}  // namespace

uint64_t GsBaseExact() {
  if (g_fsgsbase != 0) {
    return GsBaseCheap();
  }
  uint64_t v = 0;
  constexpr int kArchGetGs = 0x1004;  // ARCH_GET_GS
  if (Sys(SYS_arch_prctl, kArchGetGs, Arg(&v)) != 0) {
    return 0;
  }
  return v;
}

int64_t LookupProbe(const Session& s, uint64_t addr) {
  const KwControl& c = *s.ctl;
  const uint32_t mask = s.hash_capacity - 1;
  for (;;) {
    const uint32_t g1 = c.generation.load(std::memory_order_acquire);
    if ((g1 & 1) != 0 && c.state.load(std::memory_order_acquire) < kKwStateRestoring) {
      asm volatile("pause");
      continue;  // kwatch is changing the table
    }
    int64_t found = -1;
    const uint64_t h = s.hash_shift >= 64 ? 0 : (addr * 0x9E3779B97F4A7C15ULL) >> s.hash_shift;
    for (uint32_t n = 0; n < s.hash_capacity; ++n) {
      const KwProbeSlot& slot = s.slots[(h + n) & mask];
      const uint64_t a = slot.addr.load(std::memory_order_acquire);
      if (a == 0) {
        break;
      }
      if (a == addr) {
        if (slot.probe_index < s.probe_capacity) {
          found = slot.probe_index;
        }
        break;
      }
    }
    std::atomic_thread_fence(std::memory_order_acquire);
    const uint32_t g2 = c.generation.load(std::memory_order_relaxed);
    if (g1 == g2 || (g1 & 1) != 0) {
      return found;
    }
  }
}

bool KnownPatchAddress(const Session& s, uint64_t addr) {
  for (uint32_t i = 0; i < s.hash_capacity; ++i) {
    if (s.slots[i].addr.load(std::memory_order_acquire) == addr) {
      return true;
    }
  }
  for (uint32_t i = 0; i < s.patch_capacity; ++i) {
    const KwPatch& p = s.patches[i];
    if (p.state.load(std::memory_order_acquire) != kKwPatchFree && p.addr == addr) {
      return true;
    }
  }
  return false;
}

bool HandleTrap(const siginfo_t* info, ucontext_t* uc) {
  if (info->si_code != SI_KERNEL && info->si_code != TRAP_BRKPT) {
    return false;  // not an int3: raise/kill, single-step, a hardware breakpoint
  }
  if (RedirectHookTrap(uc)) {
    return true;
  }
  Session* s = CurrentSession();
  if (s == nullptr) {
    return false;
  }
  greg_t* g = uc->uc_mcontext.gregs;
  const uint64_t addr = static_cast<uint64_t>(g[REG_RIP]) - 1;
  // Safe reads below must be able to fault into the agent's SIGSEGV handler: a thread that
  // blocked SIGSEGV/SIGBUS by a raw system call has them unblocked for the handler's time
  // (sigreturn puts its mask back).
  if ((uc->uc_sigmask.__val[0] & (SigBit(SIGSEGV) | SigBit(SIGBUS))) != 0) {
    const uint64_t unblock = SigBit(SIGSEGV) | SigBit(SIGBUS);
    SysRtSigprocmask(SIG_UNBLOCK, &unblock, nullptr);
  }
  uint8_t byte = 0;
  const bool readable = SafeRead(addr, &byte, 1);
  const int64_t index = LookupProbe(*s, addr);
  if (index < 0) {
    if (readable && byte == 0xCC) {
      return false;  // a 0xCC kwatch does not know: the program's own
    }
    if (!KnownPatchAddress(*s, addr)) {
      return false;
    }
  }
  if (!readable || byte != 0xCC) {
    // The probe was taken out between the trap and now: run the original instruction.
    g[REG_RIP] = static_cast<greg_t>(addr);
    s->ctl->retried_traps.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  KwProbe& head = s->probes[index];
  KwRegs regs{};
  FillRegs(uc, regs);
  regs.rip = addr;
  static constexpr std::array<uint8_t, 256> kNoXmm{};
  const uint8_t* xmm = uc->uc_mcontext.fpregs != nullptr
                           ? reinterpret_cast<const uint8_t*>(uc->uc_mcontext.fpregs->_xmm)
                           : kNoXmm.data();
  RunProbes(*s, static_cast<uint32_t>(index), regs, xmm);  // changes only the base fields
  Resume(head, addr, regs, uc);
  return true;
}

}  // namespace kwatch::agent
