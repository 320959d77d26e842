#pragma once

// Private to core/ptrace/: what the files implementing Process share (process.cc,
// process_launch.cc, syscall_stops.cc, remote_exec.cc).

#include <sys/types.h>

#include <csignal>
#include <cstdint>

#include "absl/status/statusor.h"
#include "core/ptrace/process_event.h"

namespace kwatch::core::ptrace::process_internal {

// A syscall stop's signal (PTRACE_O_TRACESYSGOOD).
inline constexpr int kSyscallTrap = SIGTRAP | 0x80;

inline bool IsStopSignal(int sig) {
  return sig == SIGSTOP || sig == SIGTSTP || sig == SIGTTIN || sig == SIGTTOU;
}

// The ExitInfo of an exit or kill wait status.
ExitInfo ExitFromStatus(int status);

// Entry `type` (AT_ENTRY...) of /proc/PID/auxv. NotFound when the vector has none.
absl::StatusOr<uint64_t> ReadAuxvEntry(pid_t pid, uint64_t type);

}  // namespace kwatch::core::ptrace::process_internal
