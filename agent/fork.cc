// Fork children (docs/agent.md "Signals and odd programs", -f): pthread_atfork handlers.
// Before the fork the signal lock is taken (no hook writer is caught half-way) and the
// forking thread's return instances are copied aside: its calls return in the child too.
// In the child: the TLS is reset (a new tid, no slot). With kKwFollowForks the child claims
// an entry of the process table (kwatch learns of it there) and keeps its probes (new slots
// tagged with its pid, its own watchdog); else, or when the table is full or kwatch is
// ending, it restores its own copy of the code, closes its copy of the lifeline and records
// nothing.

#include <pthread.h>

#include <cstdint>

#include "agent/agent.h"
#include "agent/sys.h"

namespace kwatch::agent {

namespace {

uint64_t g_fork_mask;             // the forking thread's mask, under the signal lock
OrphanInstances g_fork_snapshot;  // its return instances at the fork

void Prepare() {
  LockSignals(&g_fork_mask);
  const ThreadState& t = t_state;
  g_fork_snapshot.count = 0;
  if (t.thread != nullptr) {
    for (uint32_t i = 0; i < t.thread->instances && i < kKwMaxInstances; ++i) {
      g_fork_snapshot.instance[i] = t.thread->instance[i];
    }
    g_fork_snapshot.count = t.thread->instances;
  }
  // Orphans of an earlier fork still pending in this thread go along.
  for (uint32_t i = 0; i < g_orphans.count && g_fork_snapshot.count < kKwMaxInstances; ++i) {
    g_fork_snapshot.instance[g_fork_snapshot.count++] = g_orphans.instance[i];
  }
}

void Parent() {
  UnlockSignals(&g_fork_mask);
}

// Stack slots must stay in push order (deepest last): a shallower slot first.
void SortBySlot(OrphanInstances& o) {
  for (uint32_t i = 1; i < o.count; ++i) {
    const KwInstance x = o.instance[i];
    uint32_t j = i;
    while (j > 0 && o.instance[j - 1].stack_slot < x.stack_slot) {
      o.instance[j] = o.instance[j - 1];
      --j;
    }
    o.instance[j] = x;
  }
}

// -f: an entry in the process table for this child (forked from `parent`), or null when the
// table is full or absent. Sequentially consistent: kwatch sets Stopping, then reads the
// table (agent/abi.h "Followed processes").
KwProcess* ClaimProcess(const Session& s, int parent) {
  for (uint32_t i = 0; i < s.process_capacity; ++i) {
    KwProcess& p = s.processes[i];
    int32_t expected = 0;
    if (p.pid.load(std::memory_order_relaxed) == 0 &&
        p.pid.compare_exchange_strong(expected, g_pid, std::memory_order_seq_cst)) {
      p.parent = parent;
      return &p;
    }
  }
  return nullptr;
}

// The followed child keeps its probes: the calls in flight get a slot, and a watchdog of its
// own watches the inherited lifeline. False when it cannot (no watchdog): then it leaves.
bool Follow(Session& s, ThreadState& t) {
  if (s.lifeline_fd.load(std::memory_order_acquire) < 0) {
    return false;  // the lifeline is gone: kwatch is, or is ending
  }
  RegisterSyncCore();  // per process: the child's watchdog serializes with it
  if (StartWatchdog(s, /*publish_tid=*/false) != 0) {
    return false;
  }
  if (g_orphans.count > 0 && EnsureSlot(s, t)) {
    // The calls in flight return in the child too: tracked there, counted again.
    for (uint32_t i = 0; i < g_orphans.count; ++i) {
      KwInstance inst = g_orphans.instance[i];
      if (inst.flags == 0 && inst.probe_index < s.probe_capacity) {
        s.probes[inst.probe_index].active.fetch_add(1, std::memory_order_relaxed);
      } else {
        inst.flags = kInstanceUncounted;
      }
      t.thread->instance[t.thread->instances++] = inst;
    }
    g_orphans.count = 0;
  }
  return true;
}

void Child() {
  const int parent = g_pid;
  g_pid = static_cast<int>(SysGetpid());
  ThreadState& t = t_state;
  const uint64_t blocked_view = t.blocked_view;
  t = ThreadState{};
  t.blocked_view = blocked_view;
  g_orphans = g_fork_snapshot;
  SortBySlot(g_orphans);
  Session* s = CurrentSession();
  if (s != nullptr && !g_detached.load(std::memory_order_relaxed)) {
    KwControl& c = *s->ctl;
    c.forks_seen.fetch_add(1, std::memory_order_relaxed);
    // Claimed before the state is read: kwatch, ending, either sees the entry or is seen.
    KwProcess* entry = (c.flags & kKwFollowForks) != 0 ? ClaimProcess(*s, parent) : nullptr;
    const uint32_t state = c.state.load(std::memory_order_seq_cst);
    if (entry != nullptr && state < kKwStateStopping && Follow(*s, t)) {
      entry->state.store(kKwProcessFollowed, std::memory_order_release);
      c.forks_followed.fetch_add(1, std::memory_order_relaxed);
    } else {
      g_detached.store(true, std::memory_order_relaxed);
      RegisterSyncCore();
      RestoreJournal(*s);
      CloseLifeline(*s);  // kwatch waits for the agent's processes only
      if (entry != nullptr) {
        entry->state.store(kKwProcessLeft, std::memory_order_release);
      }
    }
  }
  for (uint32_t i = 0; i < g_orphans.count; ++i) {
    g_orphans.instance[i].flags = kInstanceUncounted;  // the parent's, not the child's
  }
  ReleaseSignalLockInChild(&g_fork_mask);
}

}  // namespace

int InstallAtfork() {
  return -pthread_atfork(&Prepare, &Parent, &Child);
}

}  // namespace kwatch::agent
