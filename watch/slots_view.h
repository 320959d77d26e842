#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "drmgr/slot_registry.h"
#include "drmgr/slot_view.h"

// What `kwatch slots` shows, read from the machine: the sessions' publications
// (drmgr/slot_registry.h), the processes' threads (/proc) and their free debug registers
// (counted through perf), composed by drmgr/slot_view.h.
namespace kwatch::watch {

// How many of thread `tid`'s four debug-register slots the kernel would grant now: opens
// disabled PERF_TYPE_BREAKPOINT events on the thread (user space only, no inheritance) on
// distinct addresses of a private buffer until the kernel says ENOSPC, then closes them all.
// The kernel counts every breakpoint that applies to the thread: perf events of any tool,
// ptrace debug registers (gdb's hardware watchpoints), and CPU-wide breakpoints of the CPUs it
// may run on. For that instant the count itself holds the free slots: a watch armed on the
// thread at the same moment may be refused with ENOSPC.
//
// Errors: NotFound when the thread exited; PermissionDenied (with what to do: root,
// CAP_PERFMON, kernel.perf_event_paranoid) when perf refuses; other errno as syscall errors.
absl::StatusOr<int> CountFreeSlots(pid_t tid);

// The threads of process `pid`, ascending. NotFound naming the pid when it does not exist (or
// has exited); InvalidArgument when `pid` is a thread of another process ("give -p TGID").
absl::StatusOr<std::vector<pid_t>> ProcessThreads(pid_t pid);

// One process in `kwatch slots`.
struct ProcessSlots {
  pid_t pid = 0;
  std::string comm;
  std::vector<drmgr::PublishedSlots> sessions;  // those watching it
  std::vector<drmgr::ThreadSlots> threads;      // threads that exited meanwhile are left out
  std::vector<drmgr::WaitingRequest> not_in_hardware;
};

// Process `pid` with the sessions that watch it: each thread's registers (its comm, its free
// slots counted now). Sentences about out-of-date publications go to `notes`. Errors:
// ProcessThreads' and CountFreeSlots' (NotFound when every thread has exited).
absl::StatusOr<ProcessSlots> ReadProcessSlots(pid_t pid,
                                              std::vector<drmgr::PublishedSlots> sessions,
                                              std::vector<std::string>& notes);

// Everything `kwatch slots` shows.
struct SlotsView {
  std::vector<ProcessSlots> processes;        // by pid
  std::vector<drmgr::PublishedSlots> kernel;  // kernel sessions (CPU-wide registers)
  std::vector<std::string> notes;  // skipped publications, exited processes, stale counts
};

// `pid` > 0: that process (even when no session watches it; kernel sessions left out);
// 0: every process a running session watches (one that has exited is a note) and the
// kernel sessions. Errors: the registry's, ReadProcessSlots' (for `pid`, or other than
// NotFound for a watched process).
absl::StatusOr<SlotsView> ReadSlotsView(pid_t pid);

}  // namespace kwatch::watch
