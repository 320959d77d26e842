#pragma once

// Remote function calls: a function of a traced process run in one of its stopped threads,
// as a debugger's `call` does, to load code into it (dlopen) and to run its entry points.
//
// The call follows the SysV x86-64 ABI: up to six integer arguments in rdi, rsi, rdx, rcx,
// r8, r9; al = 0 (no vector arguments); a stack below the thread's 128-byte red zone, aligned
// so that rsp + 8 is a multiple of 16 at the function's first instruction; the return address
// is an INT3 that kwatch placed (MapRemoteTrap), where the thread stops when the function
// returns. rax is the result. The thread's registers (general, segment bases, and the whole
// FPU/SSE/AVX state) are put back exactly afterwards, whatever happened, while it lives.
//
// Signals that arrive in the thread during the call are held back and sent to it again
// afterwards (pending when it next runs): rt_tgsigqueueinfo keeps a sigqueue()'s sender and
// value, others arrive from kwatch (SI_TKILL). A synchronous fault of the called code
// (SIGSEGV, SIGBUS, SIGILL, SIGFPE, a stray SIGTRAP, SIGSYS) ends the call with the signal and
// the address, and is not delivered. A thread stopped inside an interruptible system call
// restarts it after the call as it would have (its registers say how).
//
// Not thread-safe: from the thread that traces the process, like every Process call.

#include <sys/types.h>

#include <cstdint>
#include <span>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/base/remote_addr.h"

namespace kwatch::core::ptrace {

class Process;

struct RemoteCallOptions {
  // Where the function returns: an INT3 (0xCC) in the target that stays there during the
  // call, in code no other thread runs (MapRemoteTrap).
  RemoteAddr return_trap{};
  // Other threads during the call: kept stopped (false), or resumed for its duration and
  // stopped again before RemoteCall returns (true: locks they hold are released, as a call
  // that may block on one needs, docs/agent.md "Attach safely"). Resuming them needs a
  // process without signal interceptors and without system-call stops (nothing armed yet).
  bool resume_others = false;
  // The call is abandoned after this long: the thread is interrupted and its registers
  // restored (locks the called code took stay taken: say so to the user).
  absl::Duration timeout = absl::Seconds(5);
};

struct RemoteCallResult {
  uint64_t value = 0;        // rax when the function returned
  int deferred_signals = 0;  // signals held back during the call and sent again
  int killed_forks = 0;      // children the called code forked (see below)
  absl::Duration elapsed{};  // from resuming the thread to its stop at the trap
};

// Calls the function at `function` (absolute) with `args` (at most 6) in thread `tid` of
// `proc`, stopped by kwatch outside a system-call stop, and returns when it has returned.
// Errors (the thread's registers restored in each case but the first):
//  - Aborted: the process (or the thread) ended, or exec'd, during the call;
//  - Internal: the called code faulted: names the signal, its code, the faulting address
//    and rip;
//  - DeadlineExceeded: no return within options.timeout;
//  - FailedPrecondition: `tid` is not stopped by kwatch, or sits at a system-call stop, or
//    resume_others was asked of a process with interceptors or system-call stops;
//  - InvalidArgument: more than 6 arguments, no return trap;
//  - errors of ptrace/waitpid, naming the call.
// A child forked by the called code would return into kwatch's trap with no tracer: it is
// killed (counted in killed_forks). New threads the code starts are traced as usual.
absl::StatusOr<RemoteCallResult> RemoteCall(Process& proc, pid_t tid, RemoteAddr function,
                                            std::span<const uint64_t> args,
                                            const RemoteCallOptions& options);

// Runs system call `nr` with up to 6 arguments in stopped thread `tid` (every other thread
// stopped, outside a system-call stop) and returns its raw result (-errno on failure), as
// Process::RemoteSyscall does but without single-stepping: `syscall; int3` goes over the code
// at the thread's rip, the thread runs to the INT3, and the code and registers are put back.
// Signals that arrive meanwhile are held back and sent again, as in RemoteCall (a single step
// keeps only one, and only its number). A thread stopped inside an interruptible call restarts
// it afterwards as it would have. Errors as RemoteCall's.
absl::StatusOr<int64_t> RemoteSyscallByTrap(Process& proc, pid_t tid, long nr,
                                            std::span<const uint64_t> args,
                                            absl::Duration timeout = absl::Seconds(5));

// Maps `bytes` (rounded up to pages) of anonymous, private, read+execute memory in the
// target by a remote mmap (RemoteSyscallByTrap) in stopped thread `tid` (every other thread
// stopped), filled with
// INT3: its first byte serves as RemoteCallOptions::return_trap, and kwatch may write data
// the called code only reads (a path for dlopen) after it. Unmap it with UnmapRemote.
absl::StatusOr<RemoteAddr> MapRemoteTrap(Process& proc, pid_t tid, uint64_t bytes);

// munmap(addr, bytes) in stopped thread `tid` (every other thread stopped), through
// RemoteSyscallByTrap.
absl::Status UnmapRemote(Process& proc, pid_t tid, RemoteAddr addr, uint64_t bytes);

}  // namespace kwatch::core::ptrace
