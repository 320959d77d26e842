#pragma once

#include <sys/types.h>

#include <csignal>
#include <map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/ptrace/syscall_stop.h"

namespace kwatch::core::ptrace {

class Process;

// Lets a backend own some of the signals a target receives (a page-protection fault on a
// watched page, a breakpoint trap of kwatch's): the target never sees those.
class SignalInterceptor {
 public:
  virtual ~SignalInterceptor() = default;
  // Whether kwatch caused this signal. Must be cheap and must not touch the target.
  virtual bool Claims(pid_t tid, const siginfo_t& si) = 0;
  // Handles a claimed signal while every thread of the process is stopped (the backend may
  // single-step `tid` and inject syscalls into it). The thread then resumes without the
  // signal. An error ends the session.
  virtual absl::Status Handle(pid_t tid, const siginfo_t& si) = 0;
  // Tries first to handle a claimed signal in place, with only `tid` stopped (for example by
  // emulating the faulting instruction). True when handled; false passes it to Handle().
  virtual absl::StatusOr<bool> HandleInPlace(pid_t /*tid*/, const siginfo_t& /*si*/) {
    return false;
  }
  // A claimed signal of `tid` (stopped) is dropped unhandled as kwatch lets go of the process
  // (Process::Detach): undo what it left that the thread cannot run on from, e.g. a breakpoint
  // trap's address one past the int3 of a probe that is gone.
  virtual void Drop(pid_t /*tid*/, const siginfo_t& /*si*/) {}
  // The target forked: `child` (stopped, one thread) is a copy of the target, kwatch's
  // changes included. Undo them in it; kwatch then detaches from it (forks are not followed).
  virtual absl::Status OnFork(Process& /*child*/) { return absl::OkStatus(); }
  // The target forked and kwatch follows the child (core/process_group.h): `child` (stopped,
  // one thread, a copy of the target's thread `parent_tid`, kwatch's changes included) is
  // about to be handed to the group. Called while `parent_tid` is still stopped at its fork
  // event, so the parent's state is the child's: take a copy of it here.
  virtual void OnFollowedFork(Process& /*child*/, pid_t /*parent_tid*/) {}
  // A new thread of the process (PTRACE_O_TRACECLONE) is at its first stop, before it has run
  // any code. clone() copies no per-thread state kwatch set (debug registers) into it: set it
  // here. The thread is then resumed (or kept stopped by StopAll). An error ends the session.
  virtual absl::Status OnThreadStart(pid_t /*tid*/) { return absl::OkStatus(); }
  // A syscall stop of `tid` (stopped). With `world_stopped` every other thread is stopped by
  // kwatch (or inside a system call, see StopUserCode) and the caller resumes them: the
  // interceptor must not. Otherwise the others run, and the interceptor may stop them and
  // must then resume them. `tid` is resumed afterwards unless the interceptor did.
  virtual absl::Status OnSyscallStop(pid_t /*tid*/, const SyscallStop& /*stop*/,
                                     bool /*world_stopped*/) {
    return absl::OkStatus();
  }

 protected:
  // Copied and moved only as part of an implementation (no slicing through the interface).
  SignalInterceptor() = default;
  SignalInterceptor(const SignalInterceptor&) = default;
  SignalInterceptor& operator=(const SignalInterceptor&) = default;
  SignalInterceptor(SignalInterceptor&&) = default;
  SignalInterceptor& operator=(SignalInterceptor&&) = default;
};

// Several interceptors as one (Process uses it when more than one backend owns signals of a
// process): the first that claims a signal handles it; every one hears of forks, new threads
// and system-call stops. Borrows the list, which its owner may change between signals.
// Signals of several threads may be claimed before the first is handled (while the world
// stops): each is handled by the interceptor that claimed it, remembered per thread.
class InterceptorFanOut : public SignalInterceptor {
 public:
  explicit InterceptorFanOut(const std::vector<SignalInterceptor*>& all) : all_(all) {}
  bool Claims(pid_t tid, const siginfo_t& si) override;
  absl::Status Handle(pid_t tid, const siginfo_t& si) override;
  absl::StatusOr<bool> HandleInPlace(pid_t tid, const siginfo_t& si) override;
  void Drop(pid_t tid, const siginfo_t& si) override;
  absl::Status OnFork(Process& child) override;
  void OnFollowedFork(Process& child, pid_t parent_tid) override;
  absl::Status OnThreadStart(pid_t tid) override;
  absl::Status OnSyscallStop(pid_t tid, const SyscallStop& stop, bool world_stopped) override;

 private:
  // The interceptor that claimed the signal `tid` stopped with (Claims again if none did).
  SignalInterceptor* ClaimerOf(pid_t tid, const siginfo_t& si);

  const std::vector<SignalInterceptor*>& all_;
  std::map<pid_t, SignalInterceptor*> claimers_;  // of each thread's claimed signal
};

}  // namespace kwatch::core::ptrace
