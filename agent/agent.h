#pragma once

// Internal to libkwatch-agent.so: the state its parts share (docs/agent.md says what each part
// does). Nothing here is part of the ABI; kwatch sees only agent/abi.h.
//
// Threading: a Session is immutable once published (g_session, release) and never freed, so a
// handler on any thread may read the one it loaded. ThreadState is per thread (initial-exec
// TLS, no constructor: `__thread`). The rest is process-private and written only at init, in
// the atfork handlers, or under the signal lock (signals.cc).

#include <ucontext.h>

#include <array>
#include <atomic>
#include <csignal>
#include <cstddef>
#include <cstdint>

#include "agent/abi.h"

#define KW_EXPORT __attribute__((visibility("default")))

namespace kwatch::agent {

// A validated control block and process-private pointers into it.
struct Session {
  uint8_t* base = nullptr;
  uint64_t size = 0;
  KwControl* ctl = nullptr;
  KwProbe* probes = nullptr;
  KwProbeSlot* slots = nullptr;
  KwFetchOp* code = nullptr;
  KwThread* threads = nullptr;
  uint8_t* rings = nullptr;
  KwPatch* patches = nullptr;
  KwProcess* processes = nullptr;
  uint8_t* aggs = nullptr;  // the aggregations' area (aggs_bytes)
  uint64_t aggs_bytes = 0;
  KwCallWatch* call_watches = nullptr;  // per-call watches (call_watch_capacity)
  uint32_t call_watch_capacity = 0;
  uint32_t probe_capacity = 0;
  uint32_t hash_capacity = 0;
  uint32_t hash_shift = 0;
  uint32_t code_capacity = 0;
  uint32_t thread_capacity = 0;
  uint32_t ring_bytes = 0;
  uint32_t patch_capacity = 0;
  uint32_t process_capacity = 0;
  uint64_t ring_stride = 0;  // sizeof(KwRing) + ring_bytes
  // The lifeline's read end while the agent holds it (-1 once closed: the watchdog saw EOF,
  // or a fork child that restored its code).
  std::atomic<int> lifeline_fd{-1};
  uint64_t lifeline_dev = 0;  // the pipe's identity at init (the program may have closed the
  uint64_t lifeline_ino = 0;  // fd and reused its number since)

  KwRing* Ring(uint32_t i) const { return reinterpret_cast<KwRing*>(rings + i * ring_stride); }
  uint8_t* RingData(uint32_t i) const { return rings + i * ring_stride + sizeof(KwRing); }
};

// The agent's globals are declared here and defined, constant-initialized, in init.cc and
// hit.cc; clang-tidy 14 takes an extern declaration without an initializer for a dynamic one.
// NOLINTNEXTLINE(bugprone-dynamic-static-initializers)
extern std::atomic<Session*> g_session;
inline Session* CurrentSession() {
  return g_session.load(std::memory_order_acquire);
}

// Per-thread state (zero in a new thread; reset in a fork child).
struct ThreadState {
  Session* session;  // the session `thread` and `ring` belong to
  KwThread* thread;  // the claimed slot (null: none yet)
  KwRing* ring;
  uint8_t* ring_data;
  int32_t tid;
  uint32_t in_agent;       // recursion guard: nonzero while this thread is in a hit
  uint32_t claim_backoff;  // hits left before trying to claim a slot again
  uint32_t reserved;
  // SIGTRAP/SIGSEGV/SIGBUS bits the program asked to block (pthread_sigmask hook): what it
  // is told, while the kernel's mask never holds them.
  uint64_t blocked_view;
};
// NOLINTNEXTLINE(bugprone-dynamic-static-initializers): declared only (see g_session)
extern __thread ThreadState t_state __attribute__((tls_model("initial-exec")));

// Process-private state.
// NOLINTBEGIN(bugprone-dynamic-static-initializers): declared only (see g_session)
extern int g_pid;                     // getpid(), updated in a fork child
extern std::atomic<bool> g_detached;  // a fork child that restored its code: no hit recorded
extern uint64_t g_fsgsbase;           // nonzero: rdfsbase/rdgsbase usable (AT_HWCAP2)
// NOLINTEND(bugprone-dynamic-static-initializers)

// The signals the agent handles first.
inline constexpr uint64_t kAgentSignals =
    (uint64_t{1} << (SIGTRAP - 1)) | (uint64_t{1} << (SIGSEGV - 1)) | (uint64_t{1} << (SIGBUS - 1));

// ---- safe.S: memory access that never crashes the process, and the trampolines.
// The assembler's symbols keep C names (as the agent's ABI entry points below do).
// NOLINTBEGIN(readability-identifier-naming, bugprone-dynamic-static-initializers)
extern "C" {
// Copies n bytes; 0, or -1 when a byte could not be read or written.
long kw_safe_copy(void* dst, const void* src, size_t n);
// Copies up to max bytes before the first NUL; the count copied (max when no NUL was met),
// or on a fault ~(the count copied before it), which is negative.
long kw_safe_strcopy(void* dst, const void* src, size_t max);
long kw_safe_read8(const void* src, uint64_t* out);
long kw_safe_write8(void* dst, uint64_t value);
// {fault insn, fixup} pairs as 32-bit offsets from each field.
extern const int32_t kw_extable[];
extern const int32_t kw_extable_end[];
void kw_return_trampoline();
// A raw thread: clone(flags) onto stack_top with fs base `tls`, running fn(arg) then exit.
long kw_clone_thread(unsigned long flags, void* stack_top, void* tls, void (*fn)(void*), void* arg);
// munmap(base, len) then exit(0), touching no memory in between (a thread's own stack).
[[noreturn]] void kw_unmap_and_exit(void* base, size_t len);
}
// NOLINTEND(readability-identifier-naming, bugprone-dynamic-static-initializers)

// Whether [addr, addr + n) may be read at all: above the first page, canonical, no wrap.
inline bool PlausibleRange(uint64_t addr, uint64_t n) {
  return addr >= 4096 && addr + n >= addr && addr + n <= 0x0000800000000000ULL;
}
inline bool SafeRead(uint64_t addr, void* dst, uint64_t n) {
  return PlausibleRange(addr, n) && kw_safe_copy(dst, reinterpret_cast<const void*>(addr), n) == 0;
}
inline bool SafeRead8(uint64_t addr, uint64_t* out) {
  return PlausibleRange(addr, 8) && kw_safe_read8(reinterpret_cast<const void*>(addr), out) == 0;
}
inline bool SafeWrite8(uint64_t addr, uint64_t value) {
  return PlausibleRange(addr, 8) && kw_safe_write8(reinterpret_cast<void*>(addr), value) == 0;
}

// The fs base of the calling thread: glibc's TCB points to itself at %fs:0.
inline uint64_t FsBase() {
  uint64_t v = 0;
  if (g_fsgsbase != 0) {
    asm volatile("rdfsbase %0" : "=r"(v));
  } else {
    asm volatile("mov %%fs:0, %0" : "=r"(v));
  }
  return v;
}
// The gs base when it costs no system call (rdgsbase), else 0.
inline uint64_t GsBaseCheap() {
  uint64_t v = 0;
  if (g_fsgsbase != 0) {
    asm volatile("rdgsbase %0" : "=r"(v));
  }
  return v;
}
uint64_t GsBaseExact();

inline uint64_t Rdtsc() {
  uint32_t lo = 0;
  uint32_t hi = 0;
  asm volatile("rdtsc" : "=a"(lo), "=d"(hi));
  return (uint64_t{hi} << 32) | lo;
}

// The entry points (agent/abi.h): kwatch finds them by these names.
// NOLINTBEGIN(readability-identifier-naming)
extern "C" KW_EXPORT int kwatch_agent_init(uint64_t shm_addr, uint64_t shm_size);
extern "C" KW_EXPORT void kwatch_agent_jump_hit(uint32_t probe_index, KwRegs* regs);
// NOLINTEND(readability-identifier-naming)

// ---- hit.cc: what every hit does, whichever path it came by.
// Claims a KwThread and its ring for this thread in `s` (CAS on tid) unless it has one; a
// thread that found none tries again kClaimBackoff hits later. False: no slot (counted).
bool EnsureSlot(Session& s, ThreadState& t);
// Room for a record of `need` bytes (header included) in the thread's ring: where to write it,
// and in *at_head the ring position it starts at; null when the thread has no slot or the ring
// is full (KwRing::lost counted). CommitRecord publishes it.
KwRecord* ReserveRecord(Session& s, ThreadState& t, uint64_t need, uint64_t* at_head);
void CommitRecord(ThreadState& t, uint64_t new_head);
inline constexpr uint32_t kInstanceUncounted = 1;  // KwInstance::flags: in no KwProbe::active
// Runs the probes chained from `index` at a hit with `regs` (regs.rip: the probed address);
// `xmm`: the saved %xmm0-15 (16 bytes each) or null for the live registers. Records, return
// instances, counters; never fails.
void RunProbes(Session& s, uint32_t index, KwRegs& regs, const uint8_t* xmm);
// The real return address of a call returning through kw_return_trampoline (regs->rsp: just
// after the `ret`), with the return probes' records written.
extern "C" uint64_t kw_return_hit(KwRegs* regs);  // NOLINT(readability-identifier-naming): safe.S

// ---- calls.cc: per-call watches (abi.h "Per-call watches").
// The call number of a tracked call of a watched function (`return_probe.call_watch`), 0: none.
uint32_t NumberCall(Session& s, const KwProbe& return_probe);
// A kKwProbeCallArm probe's hit: the innermost tracked call of its function looks its object up
// and arms it.
void CallArm(Session& s, ThreadState& t, KwProbe& probe, const KwRegs& regs, uint64_t tsc);
// A kKwProbeCallEnd probe's hit (--until): the innermost tracked call's watches end.
void CallUntil(Session& s, ThreadState& t, KwProbe& probe, uint64_t tsc);
// Call `inst` ends (`how`: a KwCallEnd): its slots are disabled and its records written.
void CallEnded(Session& s, ThreadState& t, KwInstance& inst, uint32_t how, uint64_t tsc);
// The watchdog, kwatch gone: every breakpoint of this process's threads disabled.
void DisableCallSlots(Session& s);

// ---- fetch.cc: the fetch interpreter. Writes the payload of `probe` at `out` (at most
// `limit` bytes, 8-aligned), returns the bytes written; ORs KwRecord flags into *flags and
// counts faults.
uint32_t RunFetch(const Session& s, KwProbe& probe, const KwRegs& regs, const uint8_t* xmm,
                  uint8_t* out, uint32_t limit, uint16_t* flags);
// The accumulator ops fetch and filter programs share (kKwOpReg, Imm, Add, Deref, Tls) applied
// to `acc`; kNotAcc leaves it alone for the caller's own ops.
enum class AccStep : uint8_t { kDone, kFault, kInvalid, kNotAcc };
AccStep StepAcc(const KwFetchOp& op, const KwRegs& regs, uint64_t& acc);

// ---- filter.cc: filter programs (abi.h "Filter programs").
// Runs the program of `count` ops at `first` (ops from the code pool): the top of its stack at
// kKwFilterEnd (kValue), or why there is none.
enum class EvalResult : uint8_t { kValue, kNoValue, kDivZero };
EvalResult RunProgram(const Session& s, uint32_t first, uint32_t count, const KwRegs& regs,
                      int32_t tid, uint64_t& top);
// True when the hit is taken (no program, or it held); else counts the verdict in the probe's
// filter counters.
bool RunFilter(const Session& s, KwProbe& probe, const KwRegs& regs, int32_t tid);

// ---- aggregate.cc: the probe's aggregations (abi.h "Aggregations") updated for a hit it took.
void RunAggregates(const Session& s, const KwProbe& probe, const KwRegs& regs, int32_t tid);

// ---- trap.cc: the SIGTRAP path. True when the trap was the agent's (handled: rip set).
bool HandleTrap(const siginfo_t* info, ucontext_t* uc);
// The probe at `addr` by the hash (seqlock), or -1.
int64_t LookupProbe(const Session& s, uint64_t addr);
// Whether `addr` is in the hash (any probe) or the patch journal: evidence that a 0xCC there
// was kwatch's.
bool KnownPatchAddress(const Session& s, uint64_t addr);

// ---- signals.cc: handlers first in line, the program's kept as the next, and the hooks.
int InstallSignalHandlers();  // 0 or -errno
int InstallSignalHooks();     // 0 or -errno
// Delivers a signal the agent does not own as the kernel would have without the agent: the
// program's handler (its flags honoured as a chained call can) or the default action.
void ChainSignal(int sig, siginfo_t* info, ucontext_t* uc);
// A SIGTRAP at a hook being written (INT3 first): rip set to the hook's target.
bool RedirectHookTrap(ucontext_t* uc);
// Locks out the hooks' writers (and fork) / releases; the caller's signals are blocked.
void LockSignals(uint64_t* saved_mask);
void UnlockSignals(const uint64_t* saved_mask);
void ReleaseSignalLockInChild(const uint64_t* saved_mask);
[[noreturn]] void DieOfSignal(int sig);

// ---- code.cc: writing code, the patch journal's restore, the watchdog.
// Registers MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE for this process (0 or -errno).
int RegisterSyncCore();
void SyncCore();
// Writes bytes into code (through /proc/thread-self/mem; mprotect if /proc is missing).
int WriteCode(uint64_t addr, const uint8_t* bytes, size_t n);
int ReadCode(uint64_t addr, uint8_t* bytes, size_t n);
// Puts back every journaled patch still in this process's code, INT3 first (docs/agent.md
// "Dying"); returns how many it restored. Raw system calls only.
uint32_t RestoreJournal(const Session& s);
// Writes `patch` over `addr` as text_poke_bp does (0xCC first, then the tail, then the first
// byte), serializing with SyncCore between steps. Used for the agent's own hooks.
int PatchCode(uint64_t addr, const uint8_t* patch, size_t n);
// Starts the watchdog thread of this process for `s`: 0 or -errno. publish_tid: fill
// KwControl::watchdog_tid (the target's own; a fork child's watchdog is not published).
int StartWatchdog(Session& s, bool publish_tid);
// Records the lifeline's identity (at init); 0 or -errno.
int NoteLifeline(Session& s, int fd);
// Closes this process's copy of the lifeline, if the fd is still that pipe (never a file the
// program opened under the same number after closing ours).
void CloseLifeline(Session& s);

// ---- fork.cc
int InstallAtfork();  // 0 or -errno
// Return instances of the thread that forked, when the child has no KwThread for them.
struct OrphanInstances {
  uint32_t count;
  std::array<KwInstance, kKwMaxInstances> instance;
};
extern OrphanInstances g_orphans;  // NOLINT(bugprone-dynamic-static-initializers): see g_session

}  // namespace kwatch::agent
