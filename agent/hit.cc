// What every hit does, by either path (jump: kwatch_agent_jump_hit from a trampoline; INT3:
// the SIGTRAP handler): the thread's slot and ring, records, return instances, counters.
// No system call except a thread's first hit (gettid) and no libc call.

#include <cerrno>
#include <csignal>
#include <cstdint>

#include "agent/agent.h"
#include "agent/sys.h"

namespace kwatch::agent {

__thread ThreadState t_state __attribute__((tls_model("initial-exec")));

namespace {

constexpr uint32_t kClaimBackoff = 1024;  // hits without a slot before trying again

inline void Bump(std::atomic<uint64_t>& counter) {
  counter.fetch_add(1, std::memory_order_relaxed);
}

inline void CompilerBarrier() {
  std::atomic_signal_fence(std::memory_order_seq_cst);
}

}  // namespace

bool EnsureSlot(Session& s, ThreadState& t) {
  if (t.thread != nullptr && t.session == &s) {
    return true;
  }
  if (t.claim_backoff > 0) {
    --t.claim_backoff;
    Bump(s.ctl->no_thread_slot);
    return false;
  }
  if (t.tid == 0) {
    t.tid = static_cast<int32_t>(SysGettid());
  }
  KwThread* previous = t.thread;  // a slot of an earlier session, maybe with live instances
  const uint32_t cap = s.thread_capacity;
  const uint32_t start = (static_cast<uint32_t>(t.tid) * 2654435761U) % cap;
  for (uint32_t n = 0; n < cap; ++n) {
    const uint32_t j = (start + n) % cap;
    KwThread& th = s.threads[j];
    int32_t expected = 0;
    if (th.tid.load(std::memory_order_relaxed) != 0 ||
        !th.tid.compare_exchange_strong(expected, t.tid, std::memory_order_acq_rel)) {
      continue;
    }
    th.pid = g_pid;
    th.depth.store(0, std::memory_order_relaxed);
    th.instances = 0;
    for (KwCallSlot& cs : th.call_slot) {
      cs = KwCallSlot{};  // a dead thread's breakpoints are kwatch's to close (it saw them)
    }
    if (previous != nullptr) {
      // Calls tracked in the earlier session still return through the trampoline.
      for (uint32_t k = 0; k < previous->instances; ++k) {
        th.instance[k] = previous->instance[k];
        th.instance[k].flags = kInstanceUncounted;
        th.instance[k].call = 0;  // the earlier session's per-call watches ended with it
      }
      th.instances = previous->instances;
    }
    KwRing* ring = s.Ring(j);
    ring->pid = g_pid;
    ring->tid.store(t.tid, std::memory_order_release);
    t.session = &s;
    t.thread = &th;
    t.ring = ring;
    t.ring_data = s.RingData(j);
    return true;
  }
  if (previous == nullptr || previous->instances == 0) {
    t.session = &s;
    t.thread = nullptr;
  }  // else the earlier slot stays this thread's until its calls returned
  t.claim_backoff = kClaimBackoff;
  Bump(s.ctl->no_thread_slot);
  return false;
}

KwRecord* ReserveRecord(Session& s, ThreadState& t, uint64_t need, uint64_t* at_head) {
  if (!EnsureSlot(s, t)) {
    return nullptr;
  }
  KwRing& ring = *t.ring;
  const uint64_t size = s.ring_bytes;
  const uint64_t head = ring.head.load(std::memory_order_relaxed);
  const uint64_t tail = ring.tail.load(std::memory_order_acquire);
  const uint64_t offset = head & (size - 1);
  const uint64_t to_end = size - offset;
  const uint64_t pad = to_end < need ? to_end : 0;
  if (need > size || head + pad + need - tail > size) {
    Bump(ring.lost);
    return nullptr;
  }
  uint8_t* data = t.ring_data;
  uint64_t at = offset;
  if (pad != 0) {
    // Only the first 8 bytes of a pad: fewer than sizeof(KwRecord) may remain.
    *reinterpret_cast<uint64_t*>(data + at) = uint64_t{kKwRecordPad} | (pad << 32);
    at = 0;
  }
  *at_head = head + pad;
  return reinterpret_cast<KwRecord*>(data + at);
}

void CommitRecord(ThreadState& t, uint64_t new_head) {
  t.ring->head.store(new_head, std::memory_order_release);
}

namespace {

// Appends one record of `probe` to the thread's ring, or counts it lost.
void Record(Session& s, ThreadState& t, KwProbe& probe, uint32_t index, uint16_t type,
            const KwRegs& regs, const uint8_t* xmm, uint64_t tsc, uint64_t ip,
            uint64_t return_address) {
  const uint64_t payload = (uint64_t{probe.record_bytes} + 7) & ~uint64_t{7};
  uint64_t head = 0;
  KwRecord* rec = ReserveRecord(s, t, sizeof(KwRecord) + payload, &head);
  if (rec == nullptr) {
    Bump(probe.lost);  // no thread slot, or the ring is full (KwRing::lost counts that too)
    Bump(probe.hits);
    return;
  }
  uint16_t flags = 0;
  const uint32_t used = RunFetch(s, probe, regs, xmm, reinterpret_cast<uint8_t*>(rec + 1),
                                 static_cast<uint32_t>(payload), &flags);
  rec->type = type;
  rec->flags = flags;
  rec->size = static_cast<uint32_t>(sizeof(KwRecord) + used);
  rec->probe_index = index;
  rec->tid = t.tid;
  rec->tsc = tsc;
  rec->ip = ip;
  rec->return_address = return_address;
  CommitRecord(t, head + rec->size);
  Bump(probe.hits);
}

// The thread's id, learnt once (a system call; tests/agent allows it here).
__attribute__((noinline)) void LearnTid(ThreadState& t) {
  t.tid = static_cast<int32_t>(SysGettid());
}

// The probe's filter program (none: every hit is taken).
inline bool Filter(const Session& s, ThreadState& t, KwProbe& probe, const KwRegs& regs) {
  if (probe.filter_len == 0) {
    return true;
  }
  if (t.tid == 0) {
    LearnTid(t);
  }
  return RunFilter(s, probe, regs, t.tid);
}

// The probe's aggregations, for a hit it took.
inline void Aggregate(const Session& s, ThreadState& t, const KwProbe& probe, const KwRegs& regs) {
  if (probe.agg == 0) {
    return;
  }
  if (t.tid == 0) {
    LearnTid(t);
  }
  RunAggregates(s, probe, regs, t.tid);
}

void Abandon(Session* s, ThreadState& t, KwInstance& inst) {
  if (s != nullptr && inst.call != 0) {
    CallEnded(*s, t, inst, kKwCallAbandoned, Rdtsc());
  }
  if ((inst.flags & kInstanceUncounted) != 0 || s == nullptr ||
      inst.probe_index >= s->probe_capacity) {
    return;
  }
  KwProbe& p = s->probes[inst.probe_index];
  p.active.fetch_sub(1, std::memory_order_relaxed);
  Bump(p.abandoned);
}

// What the return probes of one entry hit share: instances at one stack slot.
struct ArmState {
  bool pruned = false;
  bool replaced = false;  // [rsp] holds the trampoline now
  uint64_t real = 0;      // the real return address
};

// An entry hit of a return probe: track the call (an instance) and divert its return.
void ArmReturn(Session& s, ThreadState& t, KwProbe& probe, uint32_t index, const KwRegs& regs,
               ArmState& arm) {
  if (!EnsureSlot(s, t)) {
    Bump(probe.nmissed);
    return;
  }
  KwThread& th = *t.thread;
  const uint64_t slot = regs.rsp;
  if (!arm.pruned) {
    // Calls left by longjmp: their frames are at or below this call's return slot.
    while (th.instances > 0 && th.instance[th.instances - 1].stack_slot <= slot) {
      Abandon(&s, t, th.instance[th.instances - 1]);
      --th.instances;
    }
    arm.pruned = true;
  }
  const uint32_t max = probe.maxactive == 0 ? kKwDefaultMaxActive : probe.maxactive;
  if (probe.active.fetch_add(1, std::memory_order_relaxed) >= max ||
      th.instances >= kKwMaxInstances) {
    probe.active.fetch_sub(1, std::memory_order_relaxed);
    Bump(probe.nmissed);
    return;
  }
  if (!arm.replaced && !SafeRead8(slot, &arm.real)) {
    probe.active.fetch_sub(1, std::memory_order_relaxed);
    Bump(probe.nmissed);
    return;
  }
  KwInstance& inst = th.instance[th.instances];
  inst.return_address = arm.real;
  inst.stack_slot = slot;
  inst.function = probe.addr;
  inst.probe_index = index;
  inst.flags = 0;
  inst.call = NumberCall(s, probe);
  inst.looked = 0;
  CompilerBarrier();
  ++th.instances;
  CompilerBarrier();
  if (!arm.replaced) {
    if (!SafeWrite8(slot, reinterpret_cast<uint64_t>(&kw_return_trampoline))) {
      --th.instances;
      probe.active.fetch_sub(1, std::memory_order_relaxed);
      Bump(probe.nmissed);
      return;
    }
    arm.replaced = true;
  }
}

}  // namespace

OrphanInstances g_orphans;

void RunProbes(Session& s, uint32_t index, KwRegs& regs, const uint8_t* xmm) {
  if (g_detached.load(std::memory_order_relaxed)) {
    return;  // a fork child that took its probes out: nothing of the session is its own
  }
  ThreadState& t = t_state;
  KwControl& c = *s.ctl;
  if (t.in_agent != 0) {
    Bump(c.recursion_miss);
    return;
  }
  t.in_agent = 1;
  CompilerBarrier();
  if (t.thread != nullptr) {
    t.thread->depth.store(1, std::memory_order_relaxed);
  }
  const uint32_t state = c.state.load(std::memory_order_acquire);
  regs.fs_base = FsBase();
  regs.gs_base = GsBaseCheap();
  const uint64_t tsc = Rdtsc();
  ArmState arm;
  uint32_t i = index;
  for (uint32_t n = 0; n < s.probe_capacity && i < s.probe_capacity; ++n) {
    KwProbe& p = s.probes[i];
    const uint32_t flags = p.flags.load(std::memory_order_acquire);
    if ((flags & kKwProbeUsed) != 0) {
      if (state != kKwStateActive || (flags & kKwProbeEnabled) == 0) {
        Bump(p.missed);
      } else if ((flags & kKwProbeReturn) != 0) {
        ArmReturn(s, t, p, i, regs, arm);
      } else if ((flags & kKwProbeCallArm) != 0) {
        CallArm(s, t, p, regs, tsc);
      } else if ((flags & kKwProbeCallEnd) != 0) {
        CallUntil(s, t, p, tsc);
      } else if (Filter(s, t, p, regs)) {
        Aggregate(s, t, p, regs);
        Record(s, t, p, i, kKwRecordHit, regs, xmm, tsc, p.addr, 0);
      }
    }
    if (p.next == 0) {
      break;
    }
    i = p.next - 1;
  }
  if (t.thread != nullptr) {
    t.thread->depth.store(0, std::memory_order_relaxed);
  }
  CompilerBarrier();
  t.in_agent = 0;
}

namespace {

// Pops the instances of the call returning at `slot` from `stack`; true and the real address
// when found. Instances deeper than `slot` (calls left by longjmp) are abandoned first.
bool PopReturn(Session* s, ThreadState& t, KwInstance* stack, uint32_t* count, uint64_t slot,
               KwRegs& regs, bool record) {
  uint32_t n = *count;
  while (n > 0 && stack[n - 1].stack_slot < slot) {
    Abandon(s, t, stack[n - 1]);
    --n;
  }
  if (n == 0 || stack[n - 1].stack_slot != slot) {
    *count = n;
    return false;
  }
  uint32_t k = n;
  while (k > 0 && stack[k - 1].stack_slot == slot) {
    --k;
  }
  const uint64_t real = stack[n - 1].return_address;
  regs.rip = real;
  const uint64_t tsc = Rdtsc();
  for (uint32_t j = n; s != nullptr && j-- > k;) {
    CallEnded(*s, t, stack[j], kKwCallReturned, tsc);  // per-call watches end, innermost first
  }
  for (uint32_t j = k; j < n; ++j) {
    const KwInstance inst = stack[j];
    if ((inst.flags & kInstanceUncounted) != 0 || s == nullptr ||
        inst.probe_index >= s->probe_capacity) {
      continue;
    }
    KwProbe& p = s->probes[inst.probe_index];
    p.active.fetch_sub(1, std::memory_order_relaxed);
    const uint32_t flags = p.flags.load(std::memory_order_acquire);
    if (record && (flags & kKwProbeEnabled) != 0) {
      if (!Filter(*s, t, p, regs)) {
        continue;
      }
      Aggregate(*s, t, p, regs);
      Record(*s, t, p, inst.probe_index, kKwRecordReturn, regs, nullptr, tsc, inst.function, real);
    } else {
      Bump(p.missed);
    }
  }
  CompilerBarrier();
  *count = k;
  return true;
}

}  // namespace

extern "C" uint64_t kw_return_hit(KwRegs* regs) {
  ThreadState& t = t_state;
  const uint64_t slot = regs->rsp - 8;  // where the `ret` took its address from
  regs->fs_base = FsBase();
  regs->gs_base = GsBaseCheap();
  Session* s = t.session;
  const bool nested = t.in_agent != 0;
  bool record = !nested && s != nullptr && !g_detached.load(std::memory_order_relaxed) &&
                s->ctl->state.load(std::memory_order_acquire) == kKwStateActive;
  if (nested && s != nullptr) {
    Bump(s->ctl->recursion_miss);
  }
  t.in_agent = 1;
  CompilerBarrier();
  bool found = false;
  if (t.thread != nullptr) {
    found = PopReturn(s, t, t.thread->instance.data(), &t.thread->instances, slot, *regs, record);
  }
  if (!found && g_orphans.count > 0) {
    found = PopReturn(nullptr, t, g_orphans.instance.data(), &g_orphans.count, slot, *regs, false);
  }
  CompilerBarrier();
  t.in_agent = nested ? 1 : 0;
  if (!found) {
    // No tracked call returns here: the real address is lost (a stack switched under a
    // tracked call). The thread cannot go on; the process dies as of an abort.
    DieOfSignal(SIGABRT);
  }
  return regs->rip;
}

extern "C" KW_EXPORT void kwatch_agent_jump_hit(uint32_t probe_index, KwRegs* regs) {
  Session* s = CurrentSession();
  if (s == nullptr || probe_index >= s->probe_capacity) {
    return;
  }
  RunProbes(*s, probe_index, *regs, nullptr);
}

}  // namespace kwatch::agent
