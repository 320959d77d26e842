#pragma once

// The in-process agent's ABI: the memory kwatch (the controller) shares with
// libkwatch-agent.so (the agent) inside a target, and the entry points kwatch calls.
// Read docs/agent.md first: it says who writes what, when, and why.
//
// One memfd per target process, mapped MAP_SHARED by both sides at different addresses, so
// everything in it is addressed by offsets from its start, never by pointers. Every field is
// written by one side only (said per field); the other side reads it with acquire loads.
// Layout (offsets in KwControl, each 64-byte aligned):
//   KwControl | KwProbe[probe_capacity] | KwProbeSlot[hash_capacity] | fetch code pool |
//   KwPatch[patch_capacity] | KwProcess[process_capacity] | KwThread[thread_capacity] |
//   KwRing[ring_count] (each header + ring_bytes of records)
// (the order is kwatch's choice: the agent only follows the offsets)
//
// Compiled into both kwatch (C++20, libstdc++) and the agent (C++20, no exceptions, no RTTI,
// -mgeneral-regs-only, libc only): header-only, standard layout, lock-free atomics only.
// Change kKwAbiVersion with any change of layout or meaning.

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

namespace kwatch::agent {

inline constexpr uint64_t kKwMagic = 0x31544e4547414b57ULL;  // "WKAGENT1" little-endian
inline constexpr uint32_t kKwAbiVersion = 7;

static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(std::atomic<uint32_t>::is_always_lock_free);

// ---------------------------------------------------------------------------------------
// The control block (offset 0).

// KwControl::state: the session's life, written by kwatch, except kKwStateRestoring /
// kKwStateRestored which the agent's watchdog writes when kwatch is gone.
enum KwState : uint32_t {
  kKwStateInit = 0,       // tables being written; the agent takes no hit yet
  kKwStateActive = 1,     // probes live
  kKwStateStopping = 2,   // kwatch is taking the probes out; hits are dropped (counted)
  kKwStateRestoring = 3,  // kwatch is gone: the agent restores the code itself
  kKwStateRestored = 4,   // every patched byte is back (by kwatch or the agent)
};

// KwControl::flags (kwatch writes).
enum KwControlFlags : uint32_t {
  // A forked child keeps its probes if it gets a KwProcess entry (else it restores its
  // copy of the code).
  kKwFollowForks = 1U << 0,
};

// A perf breakpoint of a thread that is gone (per-call watches), for the agent to close: kwatch
// writes `ring`, then fd_plus1 (release) into a free entry and adds 1 to closes_pending; the
// agent takes it (exchanges fd_plus1 for 0) at its next lookup on any thread, closes the fd and
// unmaps the ring. A full queue: kwatch closes the rest itself at the session's end.
inline constexpr uint32_t kKwCloseQueue = 32;
struct KwCloseEntry {
  std::atomic<int32_t> fd_plus1;  // 0: free
  uint32_t reserved;
  uint64_t ring;  // its ring's mapping (call_ring_pages + 1 pages)
};
static_assert(sizeof(KwCloseEntry) == 16);

struct alignas(64) KwControl {
  uint64_t magic;        // kKwMagic (kwatch, before init)
  uint32_t abi_version;  // kKwAbiVersion
  uint32_t flags;        // KwControlFlags
  uint64_t total_size;   // bytes of the whole mapping
  int32_t controller_pid;
  int32_t target_pid;           // the process the agent was loaded into (a forked child differs)
  std::atomic<uint32_t> state;  // KwState
  // A seqlock over the probe table and the hash: kwatch makes it odd (release) before it
  // changes a KwProbe or a KwProbeSlot a thread may be reading, and even after. The agent
  // reads it before and after a lookup and retries on a change; while it is odd the agent
  // waits, unless state >= kKwStateRestoring (kwatch is gone: the table no longer moves).
  std::atomic<uint32_t> generation;

  // Table offsets and capacities (kwatch, before init; never change afterwards).
  uint64_t probes_offset;  // KwProbe[probe_capacity]
  uint32_t probe_capacity;
  uint32_t hash_capacity;  // power of two
  uint64_t hash_offset;    // KwProbeSlot[hash_capacity]: INT3 lookup by address
  uint64_t code_offset;    // fetch programs (KwFetchOp[]), KwProbe::fetch_offset is relative
  uint32_t code_capacity;  // ops
  uint32_t thread_capacity;
  uint64_t threads_offset;  // KwThread[thread_capacity]
  // KwRing[ring_count], each sizeof(KwRing) + ring_bytes; ring i belongs to KwThread i
  // (ring_count == thread_capacity).
  uint64_t rings_offset;
  uint32_t ring_count;
  uint32_t ring_bytes;  // power of two, multiple of 64

  // Filled by the agent at init (kwatch reads after kwatch_agent_init returned).
  uint64_t agent_base;         // load address of libkwatch-agent.so in the target
  uint64_t jump_entry;         // &kwatch_agent_jump_hit: trampolines call it (see below)
  uint64_t return_trampoline;  // where a tracked call returns to (return probes)
  int32_t watchdog_tid;        // the watchdog thread (0: none)
  uint32_t agent_features;     // KwFeature bits the agent has

  // Counters (the agent writes, relaxed).
  std::atomic<uint64_t> stray_traps;        // SIGTRAPs that were not the agent's (chained)
  std::atomic<uint64_t> retried_traps;      // INT3s of probes already removed (rip rewound)
  std::atomic<uint64_t> recursion_miss;     // hits inside a hit on the same thread (dropped)
  std::atomic<uint64_t> no_thread_slot;     // hits of threads beyond thread_capacity (dropped)
  std::atomic<uint64_t> no_ring;            // always 0: ring i belongs to KwThread i
  std::atomic<uint64_t> forks_seen;         // fork children the agent saw (atfork)
  std::atomic<uint64_t> restored_by_agent;  // patches the watchdog put back

  // The patches kwatch made (so the agent can restore them without kwatch). Offsets of
  // KwPatch[patch_capacity]; kwatch publishes an entry (state, release) before writing it
  // into the code and clears it after restoring it. The agent never clears an entry: forked
  // children that keep their probes share the journal, and each process restores its own
  // code from it (docs/agent.md "Dying").
  uint64_t patches_offset;
  uint32_t patch_capacity;
  uint32_t lifeline_fd;  // the agent's end of the lifeline pipe (EOF: kwatch is gone)

  // Why kwatch_agent_init failed (KwInitError, the agent writes; kKwInitOk on success).
  uint32_t init_error;
  uint32_t reserved0;

  // The processes that keep the probes besides the target (kKwFollowForks): each fork child
  // claims an entry (KwProcess) before it decides (docs/agent.md "fork"). 0 entries: no
  // child can be followed (each restores its copy of the code).
  uint64_t processes_offset;  // KwProcess[process_capacity]
  uint32_t process_capacity;
  uint32_t reserved1;
  std::atomic<uint64_t> forks_followed;  // fork children that kept their probes (the agent)

  // The aggregations' area ("Aggregations" below): KwAggregate headers and their rows, placed
  // by kwatch before it publishes their probes. 0 bytes: none.
  uint64_t aggs_offset;
  uint64_t aggs_bytes;

  // Watches armed per call ("Per-call watches" below): KwCallWatch[call_watch_capacity]
  // (kwatch, before init; 0 entries: none), and the perf breakpoints the agent opens for them.
  uint64_t call_watches_offset;
  uint32_t call_watch_capacity;
  uint32_t call_ring_pages;              // data pages of each breakpoint's ring (a power of two)
  uint64_t call_sample_regs;             // perf_event_attr.sample_regs_user of their samples
  uint64_t call_sample_type;             // perf_event_attr.sample_type of their samples
  std::atomic<uint32_t> closes_pending;  // entries of `closes` to take (kwatch adds, agent takes)
  uint32_t reserved3;
  std::array<KwCloseEntry, kKwCloseQueue> closes;
};

// KwControl::init_error: the step of kwatch_agent_init that failed (its return value is the
// errno, this says what it was doing).
enum KwInitError : uint32_t {
  kKwInitOk = 0,
  kKwInitBadMagic = 1,    // magic is not kKwMagic (-EINVAL)
  kKwInitBadVersion = 2,  // abi_version differs from the agent's kKwAbiVersion (-EPROTO)
  kKwInitBadLayout = 3,   // a size, offset or capacity is out of range (-EINVAL)
  kKwInitBusy = 4,        // an earlier session of this agent is not Restored yet (-EBUSY)
  kKwInitLifeline = 5,    // lifeline_fd is not an open pipe (-EBADF)
  kKwInitMembarrier = 6,  // membarrier SYNC_CORE cannot be registered (its errno)
  kKwInitSignals = 7,     // rt_sigaction failed (its errno)
  kKwInitHooks = 8,       // libc's sigaction/pthread_sigmask not found or not patchable
  kKwInitAtfork = 9,      // pthread_atfork failed (its errno)
  kKwInitWatchdog = 10,   // the watchdog thread could not be made (mmap/clone errno)
};

enum KwFeature : uint32_t {
  kKwFeatureInt3 = 1U << 0,      // the SIGTRAP handler is installed and first
  kKwFeatureJump = 1U << 1,      // kwatch_agent_jump_hit is usable
  kKwFeatureReturn = 1U << 2,    // return probes
  kKwFeatureWatchdog = 1U << 3,  // a watchdog thread restores the code if kwatch dies
  kKwFeatureAtfork = 1U << 4,    // fork children are handled (pthread_atfork)
  // libc's sigaction and pthread_sigmask go through the agent (docs/agent.md "Signals"): the
  // agent's handlers stay first and SIGTRAP/SIGSEGV/SIGBUS are never blocked.
  kKwFeatureSignalHooks = 1U << 5,
};

// The default of KwProbe::maxactive when kwatch leaves it 0 (as core's kDefaultMaxActive).
inline constexpr uint32_t kKwDefaultMaxActive = 256;

// ---------------------------------------------------------------------------------------
// Patches, for the restore without kwatch.

enum KwPatchState : uint32_t {
  kKwPatchFree = 0,
  kKwPatchInt3 = 1,  // one 0xCC at addr over original[0]
  kKwPatchJump = 2,  // a jmp rel32 over original[0..len): restore INT3-first (docs/agent.md)
};

struct alignas(64) KwPatch {
  std::atomic<uint32_t> state;  // KwPatchState (kwatch only)
  uint32_t len;                 // bytes patched at addr (1 for INT3, 5..16 for a jump)
  uint64_t addr;                // absolute address in the target
  std::array<uint8_t, 16> original;
  std::array<uint8_t, 16> patched;
  uint32_t probe_index;  // the KwProbe it belongs to
  uint32_t reserved;
};

// ---------------------------------------------------------------------------------------
// Followed processes (kKwFollowForks).
//
// A fork child claims a free entry (CAS on pid from 0, sequentially consistent) before it
// reads KwControl::state, and kwatch sets state Stopping before it reads the table for the
// last time: a child either sees Stopping (and restores its own copy of the code) or is seen
// by kwatch (which restores it), or both (the restore is idempotent). The entry stays until
// kwatch frees it (state 0 first, then pid 0, release) once it saw the process end.

enum KwProcessState : uint32_t {
  kKwProcessClaimed = 0,   // the child is deciding: kwatch treats it as followed
  kKwProcessFollowed = 1,  // the child keeps its probes, records and its own watchdog
  kKwProcessLeft = 2,      // the child restored its own copy of the code (state was Stopping)
};

struct KwProcess {
  std::atomic<int32_t> pid;     // 0: free (the agent claims with a CAS)
  int32_t parent;               // the process it forked from
  std::atomic<uint32_t> state;  // KwProcessState (the agent; kwatch zeroes it when freeing)
  uint32_t reserved;
};
static_assert(sizeof(KwProcess) == 16);

// ---------------------------------------------------------------------------------------
// Probes.

// KwProbe::flags (kwatch writes).
enum KwProbeFlags : uint32_t {
  kKwProbeUsed = 1U << 0,
  kKwProbeEnabled = 1U << 1,   // hits are taken (else counted in `missed` and passed over)
  kKwProbeReturn = 1U << 2,    // a return probe: the entry hit only arms the return
  kKwProbeJump = 1U << 3,      // reached through a trampoline (else through INT3)
  kKwProbeRemoving = 1U << 4,  // being taken out: an INT3 hit runs the displaced copy
  kKwProbeFpregs = 1U << 5,    // the fetch program reads %xmm registers
  // Per-call watches (call_watch names the KwCallWatch): at this probe the innermost tracked
  // call of the watch's function looks its object up (the fetch program: its address) and
  // arms it in a debug register of the calling thread...
  kKwProbeCallArm = 1U << 6,
  // ... or its watches end here (--until), before the call returns.
  kKwProbeCallEnd = 1U << 7,
};
// A jump probe is in the hash too (its address, like an INT3 probe's): while its first byte
// is 0xCC (patching, or restoring by kwatch or the watchdog) a thread that meets it traps,
// and the agent sends it to xol_addr, the relocated displaced instructions in the trampoline
// (after the register restore), which end with the jump back to addr + len.

// How an INT3 hit goes on after the probe's work (kwatch decides, from core/probe/insn_fixup).
enum KwResume : uint32_t {
  kKwResumeXol = 0,       // rip = xol_addr: a copy of the instruction and a jump back
  kKwResumeJmp = 1,       // rip = target (jmp rel)
  kKwResumeJcc = 2,       // rip = cond(eflags, rcx) ? target : next (cc, jrcxz, loop*)
  kKwResumeCall = 3,      // push next; rip = target (call rel32)
  kKwResumeRet = 4,       // rip = pop; rsp += imm16 (ret, ret imm16)
  kKwResumeIndirect = 5,  // call/jmp *reg or *mem: target from `operand` (below)
};

struct alignas(64) KwProbe {
  std::atomic<uint32_t> flags;  // KwProbeFlags
  uint32_t id;                  // kwatch's probe id (in records)
  uint64_t addr;                // the probed instruction (absolute)
  // INT3 resume, and a removing jump probe's hit: the displaced code's copy.
  uint64_t xol_addr;  // kKwResumeXol / removing jump probes: where to set rip
  uint32_t resume;    // KwResume
  uint32_t insn_len;  // bytes of the probed instruction
  uint64_t target;    // kKwResumeJmp/Jcc/Call: the branch target (absolute)
  uint32_t cond;      // kKwResumeJcc: a KwCond
  uint32_t ret_imm;   // kKwResumeRet: bytes popped after the return address
  // kKwResumeIndirect: the operand. Register form (ind_flags without kKwIndMemory): the
  // target is the 64-bit value of ind_base. Memory form: the target is the 8 bytes at
  // [ind_base + ind_index * ind_scale + ind_disp] (+ the fs or gs base), read safely.
  uint32_t ind_base;   // KwReg + 1 (0: none)
  uint32_t ind_index;  // KwReg + 1 (0: none)
  int64_t ind_disp;    // displacement (rip-relative already resolved to absolute)
  uint32_t ind_scale;  // 1, 2, 4, 8
  uint32_t ind_flags;  // KwIndFlags
  // The fetch program (KwFetchOp[], in the code pool) run at each hit.
  uint32_t fetch_offset;  // ops from code_offset
  uint32_t fetch_len;     // ops
  // The filter program (a probe's `if COND`, "Filter programs" below), right after the fetch
  // program in the pool (ops from code_offset); 0 ops: every hit is taken. Run before the
  // record is written: a hit it rejects writes nothing and counts in filtered/filter_*.
  uint32_t filter_offset;
  uint32_t filter_len;
  // The probe's first aggregation (KwAggregate): its byte offset in the aggregations' area + 1
  // (0: none). Each hit the filter takes is aggregated, before its record is written.
  uint32_t agg;
  uint32_t record_bytes;  // upper bound of the payload a hit writes (kwatch computes)
  // Return probes: calls tracked at once, all threads together (0: kKwDefaultMaxActive), as
  // core's Int3Engine; a thread also tracks at most kKwMaxInstances (the rest: nmissed).
  uint32_t maxactive;
  // The next probe at the same address: index + 1 (0: none). The hash and a trampoline name
  // the first; the agent runs each probe of the chain in order (one instruction, one resume:
  // the first probe's resume fields are used).
  uint32_t next;
  // Return probes: instances live now (the agent; kwatch subtracts a dead thread's instances
  // when it frees its KwThread, the only field both sides write, atomically).
  std::atomic<uint32_t> active;
  // Per-call watches: the KwCallWatch (index + 1, 0: none) of a kKwProbeCallArm/CallEnd
  // probe, or, on the return probe of a watched function, its first KwCallWatch (the entry
  // numbers the call: KwInstance::call).
  uint32_t call_watch;
  uint32_t reserved2;
  // Counters (the agent writes, relaxed; kwatch reads).
  std::atomic<uint64_t> hits;       // hits taken (records written or lost)
  std::atomic<uint64_t> missed;     // hits while disabled or stopping
  std::atomic<uint64_t> nmissed;    // return probes: calls not tracked (maxactive reached)
  std::atomic<uint64_t> lost;       // records dropped because the thread's ring was full
  std::atomic<uint64_t> faults;     // fetches that touched unreadable memory (value: fault)
  std::atomic<uint64_t> abandoned;  // return instances dropped (longjmp, exceptions)
  // The filter program's verdicts on hits it rejected (taken hits count in `hits`):
  std::atomic<uint64_t> filtered;         // the condition was false
  std::atomic<uint64_t> filter_no_value;  // a value it reads faulted (not matched)
  std::atomic<uint64_t> filter_div0;      // it divided by zero (not matched)
};
static_assert(sizeof(KwProbe) == 192);

// KwProbe::cond for kKwResumeJcc.
enum KwCond : uint32_t {
  // 0..15: the condition code of Jcc (its opcode's low nibble): O NO B AE E NE BE A S NS P NP
  // L GE LE G, read from eflags.
  kKwCondJrcxz = 16,   // rcx == 0
  kKwCondJecxz = 17,   // ecx == 0
  kKwCondLoop = 18,    // --rcx != 0
  kKwCondLoope = 19,   // --rcx != 0 && ZF
  kKwCondLoopne = 20,  // --rcx != 0 && !ZF
  // Or'ed into kKwCondLoop*: 32-bit address size (0x67 prefix): ecx is the counter, and the
  // decremented value is written zero-extended to rcx.
  kKwCondAddr32 = 0x100,
};

// KwProbe::ind_flags for kKwResumeIndirect.
enum KwIndFlags : uint32_t {
  kKwIndCall = 1U << 0,    // call (push addr + insn_len), else jmp
  kKwIndMemory = 1U << 1,  // memory operand, else the register ind_base
  kKwIndFs = 1U << 2,      // %fs: segment override (the thread's fs base is added)
  kKwIndGs = 1U << 3,      // %gs: segment override (gs base: rdgsbase or arch_prctl)
  kKwIndAddr32 = 1U << 4,  // 32-bit address size: the effective address is truncated
};

// Open addressing by address (linear probing, hash = (addr * 0x9E3779B97F4A7C15) >> shift).
// kwatch writes `probe_index` then `addr` (release); 0 = empty, ~0 = deleted.
struct KwProbeSlot {
  std::atomic<uint64_t> addr;
  uint32_t probe_index;
  uint32_t reserved;
};

// ---------------------------------------------------------------------------------------
// Fetch programs: a stack-free machine with one 64-bit accumulator `acc`, run by the agent
// at a hit against the saved registers (KwRegs) and the thread's memory. Faulting reads never
// crash the target (docs/agent.md "safe reads"); they end the argument with a fault marker.
// kwatch compiles core::CompiledArg into these (core/probe/agent_fetch.h): the places it can
// compute, the parts of DWARF values it finishes itself at drain time, and for the rest
// kKwOpRegsAll + kKwOpStack, evaluated by kwatch as the uprobe backend's samples are.
//
// Exact semantics (agent/fetch.cc, and kwatch's formatter relies on them):
//  - Each argument that captures anything starts with kKwOpBeginArg (a = its number); the
//    record gets a KwArgHeader, then the bytes its copy ops (Read, ReadStr, StoreAcc, Xmm,
//    RegsAll, Stack) append (`len`, the sum), then zero padding to 8. The argument ends at
//    the next kKwOpBeginArg or kKwOpEnd. Arguments that capture nothing (constants)
//    have no ops and no header: the headers are in program order, with gaps in `arg`.
//  - Safe reads: an address below 4096 or non-canonical, or any byte not readable by the
//    thread, is a fault (status kKwArgFault, record flag 1, KwProbe::faults); the rest of
//    the argument's ops are skipped. Deref and Read copy all their bytes or none. ReadStr
//    and Stack keep the bytes they copied before the fault (readability is per page: Stack
//    keeps the pages before the first unreadable one).
//  - kKwOpReadStr copies the bytes at acc before the first NUL (not the NUL), at most b
//    (kwatch asks for 257: one more than it shows, to know a longer string is cut). No NUL
//    within b bytes: status kKwArgCut, len b.
//  - A copy that would pass the probe's record_bytes is cut there (status kKwArgCut, record
//    flag 2) and the program ends.
//  - An op or operand the agent refuses (an unknown op, a register index >= kKwRegCount, a
//    width of 0 or > 8, an %xmm index >= 16): status kKwArgInvalid (a kwatch bug).

enum KwFetchOpcode : uint16_t {
  kKwOpEnd = 0,       // end of the program
  kKwOpBeginArg = 1,  // starts argument `a` (records a KwArgHeader)
  kKwOpReg = 2,       // acc = regs[a] (KwReg index), zero-extended from b bytes (1, 2, 4, 8)
  kKwOpImm = 3,       // acc = imm
  kKwOpAdd = 4,       // acc += imm
  kKwOpDeref = 5,     // acc = the b bytes at acc, zero-extended (b 1..8; 0 means 8) (safe)
  kKwOpRead = 6,      // copy b bytes at acc into the record (safe)
  kKwOpReadStr = 7,   // copy up to b bytes at acc, before the first NUL (safe); no NUL: cut
  kKwOpStoreAcc = 8,  // copy acc's low b bytes into the record (a register's value)
  kKwOpXmm = 9,       // copy the low b (<= 16) bytes of %xmm[a] (a < 16) into the record
  kKwOpRegsAll = 10,  // copy the whole KwRegs into the record (a fallback for the controller)
  kKwOpStack = 11,    // copy b bytes from regs.rsp up into the record (safe)
  kKwOpTls = 12,      // acc = the thread's fs base
  kKwOpComm = 13,     // copy the thread's name (prctl PR_GET_NAME), before its NUL, at most 15
};

// ---------------------------------------------------------------------------------------
// Filter programs: a probe's condition (`kwatch probe 'f x if x > 1'`), compiled by kwatch
// from watch::Condition's bytecode (watch/probe/agent_filter.h), run at each hit before the
// record is written. A stack machine of 64-bit words (at most kKwFilterStack deep) plus the
// fetch programs' accumulator: the acc ops (kKwOpReg, Imm, Add, Deref, Tls) compute a value's
// raw bytes, kKwFilterPushAcc pushes it as the argument's type reads it. Semantics are
// watch::Condition's: arithmetic wraps modulo 2^64, signed operators on two's complement, a
// shift by 64 or more gives 0 (or -1 for a negative value's arithmetic shift).
// Verdicts: the top of the stack at kKwFilterEnd is non-zero: the hit is taken. A faulting
// kKwOpDeref: no value (KwProbe::filter_no_value). A '/' or '%' by 0: KwProbe::filter_div0.
// An op or operand the agent refuses counts as no value (a kwatch bug).
inline constexpr uint32_t kKwFilterStack = 32;

enum KwFilterOpcode : uint16_t {
  kKwFilterEnd = 32,          // the verdict: top != 0
  kKwFilterPushAcc = 33,      // push acc as a value: see below
  kKwFilterPushImm = 34,      // push imm
  kKwFilterPushTid = 35,      // push the thread's id (the target's pid namespace)
  kKwFilterPushPid = 36,      // push the process's id (the target's pid namespace)
  kKwFilterUnary = 37,        // top = a(top), a: KwFilterOperator
  kKwFilterBinary = 38,       // x = pop; top = a(top, x)
  kKwFilterJumpZero = 39,     // top == 0: jump to op b (of this program), keeping it; else pop
  kKwFilterJumpNonZero = 40,  // top != 0: top = 1, jump to op b; else pop
  kKwFilterToBool = 41,       // top = (top != 0)
};
// kKwFilterPushAcc: acc holds the value's little-endian bytes zero-extended; the value is
// ((acc & raw_mask) >> shift) & mask(a bits), sign-extended from a bits when imm & 1, where
// b = raw_bits | shift << 8 (raw_bits 1..64: the bytes the record would hold, times 8).
// This is how kwatch shows the argument (core/probe/fetch_format's FormatFetchScalar).
enum KwFilterOperator : uint16_t {
  kKwFilterNeg = 0,
  kKwFilterNot,
  kKwFilterBitNot,
  kKwFilterMul,
  kKwFilterDivU,
  kKwFilterDivS,
  kKwFilterModU,
  kKwFilterModS,
  kKwFilterAdd,
  kKwFilterSub,
  kKwFilterShl,
  kKwFilterShrU,
  kKwFilterShrS,
  kKwFilterLtU,
  kKwFilterLtS,
  kKwFilterLeU,
  kKwFilterLeS,
  kKwFilterGtU,
  kKwFilterGtS,
  kKwFilterGeU,
  kKwFilterGeS,
  kKwFilterEq,
  kKwFilterNe,
  kKwFilterAnd,
  kKwFilterXor,
  kKwFilterOr,
  kKwFilterOperatorCount
};

// ---------------------------------------------------------------------------------------
// Aggregations in the target (`kwatch probe --agg 'hist(x) by tid'`, watch/probe/
// agent_aggregation.h): each hit a probe takes updates its aggregations' rows in the shared
// memory, so that they count every hit however fast the program runs (records may be lost,
// aggregations are not). Values and keys are filter programs (the same machine) whose top at
// kKwFilterEnd is the value or the key; a key program that ends without a value gives the
// row of the faulted key (KwAggRow::flags), a value program the no_value count.
//
// Rows: open addressing by key (hash = key * 0x9E3779B97F4A7C15 >> shift, linear probing). A
// thread claims a free row (state 0 -> 1, CAS), writes key, flags, min and max (its value),
// then state 2 (release); then every update is an atomic add (count, sum, the bucket) or a CAS
// loop (min, max). A row being claimed by another thread (state 1) is waited for a bounded
// time, then passed over: a key may then hold two rows, which kwatch adds together.

enum KwAggFunc : uint32_t {
  kKwAggCount = 0,  // count only (count())
  kKwAggStats = 1,  // count, sum, min, max of the value (sum, min, max, avg)
  kKwAggHist = 2,   // and power-of-two buckets: word 0 values < 0 (signed), 1 the value 0,
                    // k + 1 the values in [2^(k-1), 2^k) (k = 1..64)
  kKwAggLhist = 3,  // and linear buckets: word 0 below low, 1 + (v - low) / step up to high,
                    // then one for high and above (buckets = that count + 2)
};

enum KwAggFlags : uint32_t {
  kKwAggSigned = 1U << 0,  // min, max and buckets read the value as int64
};

struct alignas(64) KwAggregate {
  uint32_t func;          // KwAggFunc
  uint32_t flags;         // KwAggFlags
  uint32_t next;          // the probe's next aggregation: byte offset in the area + 1 (0: none)
  uint32_t buckets;       // bucket words per row (0 unless hist or lhist)
  uint32_t value_offset;  // ops from code_offset: the value's program (0 ops: count())
  uint32_t value_len;
  uint32_t key_offset;  // ops from code_offset: the key's program (0 ops: one row, key 0)
  uint32_t key_len;
  int64_t low;            // lhist
  int64_t high;           // lhist
  int64_t step;           // lhist (> 0)
  uint64_t rows;          // byte offset in the area of the rows
  uint32_t row_capacity;  // power of two
  uint32_t row_bytes;     // sizeof(KwAggRow) + 8 * buckets
  // The agent counts (relaxed):
  std::atomic<uint64_t> no_value;  // hits whose value could not be read: not aggregated
  std::atomic<uint64_t> no_row;    // hits of a new key with every row taken: not aggregated
};
static_assert(sizeof(KwAggregate) == 128);

struct KwAggRow {
  std::atomic<uint32_t> state;  // 0 free, 1 being claimed, 2 ready (the agent)
  uint32_t flags;               // 1: the key's program faulted (its value is 0)
  uint64_t key;
  std::atomic<uint64_t> count;
  std::atomic<uint64_t> sum;  // wraps modulo 2^64
  std::atomic<uint64_t> min;
  std::atomic<uint64_t> max;
  // then KwAggregate::buckets std::atomic<uint64_t> words
};
static_assert(sizeof(KwAggRow) == 48);

struct KwFetchOp {
  uint16_t op;  // KwFetchOpcode
  uint16_t a;
  uint32_t b;
  int64_t imm;
};
static_assert(sizeof(KwFetchOp) == 16);

// ---------------------------------------------------------------------------------------
// Per-call watches (`kwatch --write 'r->len' --in compute`, watch/agent_calls.h). The watched
// function's entry has a return probe whose `call_watch` names the function's first
// KwCallWatch: each tracked call gets a number (KwCallWatch::calls of that first entry) in its
// KwInstance. A kKwProbeCallArm probe (the lookup point) runs its fetch program, which leaves
// the object's address as argument 0 (8 bytes), in the innermost tracked call of the function
// on this thread, and arms it in a free KwCallSlot of the thread: the slot's perf breakpoint is
// opened (first time) or retargeted and enabled (PERF_EVENT_IOC_MODIFY_ATTRIBUTES). The call's
// end (its return, --until, or an entry or return that finds it left by longjmp) disables the
// slots it armed. Each lookup writes a kKwRecordCallArm record and each end of a looked-up or
// not looked-up call one kKwRecordCallEnd per KwCallWatch of the function, so kwatch sees
// every (watch, call) end exactly once. The breakpoint's samples go to its own perf ring;
// `head` (the ring's data_head, read while the breakpoint is disabled) tells kwatch which of
// them belong to which call: those between the arm's head and the end's. The agent consumes
// the ring itself (it is the only reader: data_tail is the agent's): at each end it copies the
// call's samples into kKwRecordCallSamples records of its own ring, so that they survive the
// process. kwatch reads the samples of calls still running at each drain through its own
// mapping of the ring (a copy of the fd; /proc/PID/mem cannot read a perf mapping), and skips
// them in the end's copies by ring position (KwCallRecord::ring of kKwRecordCallSamples).

struct alignas(64) KwCallWatch {
  uint32_t function;  // the return probe's index (its instances are the calls)
  uint32_t first;     // the function's first KwCallWatch (whose `calls` numbers the calls)
  uint32_t bp_type;   // HW_BREAKPOINT_W or HW_BREAKPOINT_RW
  uint32_t bp_len;    // 1, 2, 4 or 8 (the object's address must be aligned to it)
  std::atomic<uint32_t> calls;  // the first entry only: calls numbered so far (the agent)
  uint32_t reserved;
  // Counters (the agent, relaxed).
  std::atomic<uint64_t> missed;  // lookups in no tracked call (maxactive, no thread slot)
  std::atomic<uint64_t> lost;    // records of lookups and ends that did not fit the ring
};
static_assert(sizeof(KwCallWatch) == 64);

enum KwCallStatus : int32_t {
  kKwCallArmed = 0,
  kKwCallNull = 1,       // the address is 0 or a pointer on the way was (the fetch faulted)
  kKwCallNoSlot = 2,     // the thread's four KwCallSlots are taken, or ENOSPC (a register)
  kKwCallUnaligned = 3,  // the address is not aligned to bp_len
  kKwCallError = 4,      // perf_event_open, mmap or ioctl failed: `error` is its errno
};
enum KwCallEnd : uint32_t {
  kKwCallReturned = 0,   // its return
  kKwCallUntil = 1,      // a kKwProbeCallEnd probe
  kKwCallAbandoned = 2,  // left by longjmp (found at a later entry or return)
  kKwCallNotLooked = 3,  // it ended before its lookup point
};

// The payload of kKwRecordCallArm and kKwRecordCallEnd.
struct KwCallRecord {
  uint32_t watch;       // KwCallWatch index
  uint32_t call;        // the call's number
  uint64_t addr;        // arm: the object's address (0: none)
  int32_t status;       // arm: KwCallStatus; end: KwCallEnd
  int32_t error;        // kKwCallError: the errno
  int32_t new_fd;       // arm: the fd of a breakpoint opened now (kwatch takes a copy), else -1
  uint32_t slot;        // the KwCallSlot (kKwCallSlots: none)
  uint64_t head;        // the slot's ring data_head at the arm / at the end
  uint64_t ring;        // arm with new_fd: the ring's mapping in the target; samples: the ring
                        // position of their first byte
  uint64_t stack_slot;  // the call's return slot
};
static_assert(sizeof(KwCallRecord) == 56);

// ---------------------------------------------------------------------------------------
// Registers as the agent sees them at a hit: the layout of user_regs_struct (sys/user.h), so
// kwatch's register offsets (core::CompiledArg::reg_offset) index it directly. Trampolines
// build it on the stack; the SIGTRAP handler copies it from the ucontext.
struct KwRegs {
  uint64_t r15, r14, r13, r12, rbp, rbx, r11, r10, r9, r8, rax, rcx, rdx, rsi, rdi;
  uint64_t orig_rax, rip, cs, eflags, rsp, ss, fs_base, gs_base, ds, es, fs, gs;
};
static_assert(sizeof(KwRegs) == 27 * sizeof(uint64_t));
// KwReg: the index of a register in KwRegs (offsetof / 8).
enum KwReg : uint16_t {
  kKwR15 = 0,
  kKwR14,
  kKwR13,
  kKwR12,
  kKwRbp,
  kKwRbx,
  kKwR11,
  kKwR10,
  kKwR9,
  kKwR8,
  kKwRax,
  kKwRcx,
  kKwRdx,
  kKwRsi,
  kKwRdi,
  kKwOrigRax,
  kKwRip,
  kKwCs,
  kKwEflags,
  kKwRsp,
  kKwSs,
  kKwFsBase,
  kKwGsBase,
  kKwDs,
  kKwEs,
  kKwFs,
  kKwGs,
  kKwRegCount
};

// ---------------------------------------------------------------------------------------
// Threads and rings. A thread claims a KwThread (CAS on tid from 0) at its first hit, and a
// ring; the agent keeps a pointer to both in an initial-exec TLS slot. kwatch frees a slot
// (tid back to 0, after draining its ring) only once the thread is gone.

inline constexpr uint32_t kKwMaxInstances = 64;  // return-probe instances per thread

struct KwInstance {
  uint64_t return_address;  // the real one
  uint64_t stack_slot;      // where it was on the stack (for abandoning)
  uint64_t function;        // the function's entry (probe addr)
  uint32_t probe_index;
  uint32_t flags;  // 1: counted in no KwProbe::active (a call tracked by an earlier session)
  uint32_t call;   // a watched function's call number (KwCallWatch::calls), 0: none
  // Per-call watches: bit i: the call looked up the object of its function's KwCallWatch
  // first + i; kKwLookedEnded: its watches ended (--until) before it returned.
  uint32_t looked;
};
inline constexpr uint32_t kKwLookedEnded = 1U << 31;

// A debug register of a thread for per-call watches: a perf breakpoint the agent opened in the
// thread (perf_event_open, pid 0) at its first watched call, with its ring mapped in the target
// (kwatch maps the same ring through pidfd_getfd and drains it). Armed (retargeted with
// PERF_EVENT_IOC_MODIFY_ATTRIBUTES) at each call's lookup, disabled at its end; the fd and the
// ring stay for the thread's next calls.
inline constexpr uint32_t kKwCallSlots = 4;
struct KwCallSlot {
  int32_t fd_plus1;  // the breakpoint's fd + 1 (0: not opened yet)
  uint32_t watch;    // the KwCallWatch armed (index + 1, 0: free)
  uint32_t call;     // its call
  uint32_t reserved;
  uint64_t stack_slot;  // the call's return slot (its KwInstance::stack_slot)
  uint64_t ring;        // the ring's mapping in the target (0: none)
  uint64_t addr;        // the object armed
};
static_assert(sizeof(KwCallSlot) == 40);

struct alignas(64) KwThread {
  std::atomic<int32_t> tid;  // 0: free
  int32_t pid;               // the process (differs from target_pid in a forked child)
  uint32_t reserved0;
  std::atomic<uint32_t> depth;  // nesting guard: 1 while the thread is inside a hit
  uint32_t instances;           // live return instances
  uint32_t reserved;
  std::array<KwInstance, kKwMaxInstances> instance;
  std::array<KwCallSlot, kKwCallSlots> call_slot;  // per-call watches (the agent)
};

// A single-producer (the owning thread), single-consumer (kwatch) ring of records. `head`
// and `tail` count bytes since the start (never wrap); a record never straddles the end:
// the producer writes a KwRecord of type kKwRecordPad to fill the rest and starts over.
struct alignas(64) KwRing {
  std::atomic<uint64_t> head;  // the agent: bytes published (release after the record)
  std::array<uint8_t, 56> pad0;
  std::atomic<uint64_t> tail;  // kwatch: bytes consumed (release after reading)
  std::array<uint8_t, 56> pad1;
  std::atomic<uint64_t> lost;  // the agent: records that did not fit
  std::atomic<int32_t> tid;    // the owner (0: free)
  int32_t pid;
  std::array<uint8_t, 48> pad2;
  // then ring_bytes of data
};
static_assert(sizeof(KwRing) == 192);

enum KwRecordType : uint16_t {
  kKwRecordPad = 0,      // skip `size` bytes
  kKwRecordHit = 1,      // a probe hit (entry, or a probe anywhere)
  kKwRecordReturn = 2,   // a return probe's hit at the return
  kKwRecordCallArm = 3,  // a per-call watch's lookup (payload: KwCallRecord)
  kKwRecordCallEnd = 4,  // a per-call watch's end (payload: KwCallRecord)
  // A per-call watch's accesses: KwCallRecord (`head`: the bytes that follow), then that many
  // bytes of whole perf records copied from the breakpoint's ring (samples, lost records).
  kKwRecordCallSamples = 5,
};

// Every record starts 8-byte aligned with this header; `size` includes it and is a multiple
// of 8. The payload follows: one KwArgHeader + bytes (padded to 8) per argument of the
// probe's fetch program, in program order. A kKwRecordPad fills the ring's end when the next
// record does not fit there; only its first 8 bytes (type, flags, size) are written, since
// fewer than sizeof(KwRecord) bytes may remain.
struct KwRecord {
  uint16_t type;   // KwRecordType
  uint16_t flags;  // 1: some argument faulted, 2: payload cut at record_bytes
  uint32_t size;
  uint32_t probe_index;
  int32_t tid;
  uint64_t tsc;             // rdtsc at the hit (kwatch converts to CLOCK_MONOTONIC)
  uint64_t ip;              // the probed address (returns: the function's entry)
  uint64_t return_address;  // returns: where the function returned to (else 0)
};
static_assert(sizeof(KwRecord) == 40);

enum KwArgStatus : uint16_t {
  kKwArgOk = 0,
  kKwArgFault = 1,    // unreadable memory (see the fetch semantics above)
  kKwArgCut = 2,      // kKwOpReadStr found no NUL in b bytes, or the record's end
  kKwArgInvalid = 3,  // an op or operand the agent refuses (a kwatch bug)
};

struct KwArgHeader {
  uint16_t arg;     // the argument's number (kKwOpBeginArg's a)
  uint16_t status;  // KwArgStatus
  uint32_t len;     // bytes that follow (then padding to 8)
};
static_assert(sizeof(KwArgHeader) == 8);

// ---------------------------------------------------------------------------------------
// Entry points (extern "C" in libkwatch-agent.so), called by kwatch through remote calls or
// by trampolines.
//
//   int kwatch_agent_init(uint64_t shm_addr, uint64_t shm_size);
//     shm_addr: where the memfd is mapped in the target. Validates the control block, fills
//     the agent's fields, installs the SIGTRAP/SIGSEGV/SIGBUS handlers (first in line, the
//     program's own kept as the next) and libc's sigaction/pthread_sigmask hooks, registers
//     membarrier SYNC_CORE, the atfork handlers, and starts the watchdog. Returns 0 or -errno;
//     on failure KwControl::init_error says which step failed and agent_features is 0.
//     Called again (a new session, a new memfd) after the previous one is Restored: the
//     handlers and hooks stay, the tables and the watchdog are the new session's.
//
//   void kwatch_agent_jump_hit(uint32_t probe_index, KwRegs* regs);
//     Called by a jump probe's trampoline with the registers it saved (regs->rip == the
//     probed address, regs->rsp == the thread's rsp at the probe), on a 16-byte aligned stack
//     with DF clear (the trampoline's cld after pushfq). Does not change *regs (return probes
//     rewrite the return address on the stack). Uses no SSE/AVX register, so the trampoline
//     saves none; %xmm arguments are read from the live registers.

}  // namespace kwatch::agent
