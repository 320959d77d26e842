#pragma once

#include <array>
#include <cstdint>

namespace kwatch::core::ptrace {

// A system-call stop of a thread resumed with PTRACE_SYSCALL (see Process::SetSyscallStops).
struct SyscallStop {
  bool entry = false;              // syscall-entry stop; false: syscall-exit stop
  uint64_t nr = 0;                 // the call's number (orig_rax)
  std::array<uint64_t, 6> args{};  // its arguments (rdi, rsi, rdx, r10, r8, r9)
  int64_t ret = 0;                 // exit stops: the raw result, -errno on failure
  uint64_t ip = 0;                 // the address right after the syscall instruction
};

// How a system call that kwatch let run (Process::FinishSyscall) went on.
struct SyscallOutcome {
  enum class Kind : uint8_t {
    kReturned,  // the thread is at the call's exit stop: see `exit`
    kBlocked,   // the call sleeps (or runs long) in the kernel; its exit stop comes later
    kGone,      // the thread ended, or stopped for a ptrace event (exec) first
  };
  Kind kind = Kind::kGone;
  SyscallStop exit;
};

}  // namespace kwatch::core::ptrace
