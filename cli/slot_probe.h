#pragma once

#include <sys/types.h>

#include "absl/status/statusor.h"

namespace kwatch::cli {

// How many of thread `tid`'s four debug-register slots the kernel would grant now: opens
// disabled PERF_TYPE_BREAKPOINT events on the thread (user space only, no inheritance) on
// distinct addresses of a private buffer until the kernel says ENOSPC, then closes them all.
// The kernel counts every breakpoint that applies to the thread: perf events of any tool,
// ptrace debug registers (gdb's hardware watchpoints), and CPU-wide breakpoints of the CPUs it
// may run on. For that instant the probe itself holds the free slots: a watch armed on the
// thread at the same moment may be refused with ENOSPC.
//
// Errors: NotFound when the thread exited; PermissionDenied (with what to do: root,
// CAP_PERFMON, kernel.perf_event_paranoid) when perf refuses; other errno as syscall errors.
absl::StatusOr<int> CountFreeSlots(pid_t tid);

}  // namespace kwatch::cli
