#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "drmgr/allocator_types.h"
#include "drmgr/debug_regs.h"
#include "drmgr/slot_registry.h"

// The view `kwatch slots` shows: who holds which debug register of a thread (kwatch sessions,
// from what they published, and slots held outside kwatch, from the kernel's count) or of a
// CPU (kernel sessions). Pure composition of published snapshots; reading /proc and counting
// free slots through perf is the caller's (watch/slots_view.h).
namespace kwatch::drmgr {

// One debug register of a thread or CPU.
struct SlotRow {
  int dr = 0;  // kwatch's index, 0-3 (the kernel picks the real register); -1: beyond four
  SlotState state = SlotState::kFree;
  pid_t kwatch_pid = 0;              // the session holding it (kwatch's slots)
  std::vector<RequestId> requests;   // its holders in that session; empty: not kwatch's
  std::vector<std::string> labels;   // ... named
  std::vector<std::string> waiting;  // labels of displaced requests (preempted slots)
  Chunk chunk;
  DrKind kind = DrKind::kWrite;
  double coverage = 1.0;  // multiplexed: the share of time it is armed
};

// The debug registers of one thread of a process.
struct ThreadSlots {
  pid_t tid = 0;
  std::string comm;  // the caller's to fill
  int free = 0;      // from the kernel
  int kwatch = 0;    // published by kwatch sessions
  int external = 0;  // in use and not kwatch's
  std::vector<SlotRow> rows;
};

// A request of a session, on a process, that holds no register now.
struct WaitingRequest {
  pid_t kwatch_pid = 0;
  RequestView view;
};

// A kernel session's registers on one CPU, as its allocator knows them (registers held by
// other tools are learned when the kernel refuses one: ENOSPC).
struct CpuSlots {
  int cpu = 0;
  int kwatch = 0;
  int external = 0;
  int free = 0;
  std::vector<SlotRow> rows;  // DR0-DR3
};

// Request `id` of a snapshot by its label, else "request N".
std::string RequestLabel(const AllocatorSnapshot& snapshot, RequestId id);

// The rows of thread `tid` of process `pid`, of which the kernel says `free` slots are free:
// kwatch's armed, multiplexed and preempted slots (process-wide scopes first, then the
// thread's) at the index their allocator gave them when that index is not taken yet, else at
// the first free one (dr -1 beyond four: an out-of-date publication); then the slots held
// outside kwatch from DR3 down, the rest free; ordered by dr (-1 last). When the sessions
// published more slots than the kernel shows in use, a sentence is added to `notes`.
ThreadSlots ComposeThreadSlots(pid_t pid, pid_t tid, int free,
                               const std::vector<PublishedSlots>& sessions,
                               std::vector<std::string>& notes);

// The requests of `sessions` on process `pid` (process or thread scope) that are not armed.
std::vector<WaitingRequest> NotInHardware(pid_t pid, const std::vector<PublishedSlots>& sessions);

// A kernel session's CPU scopes, in its snapshot's order, each with its four rows.
std::vector<CpuSlots> KernelCpuSlots(const PublishedSlots& session);

}  // namespace kwatch::drmgr
