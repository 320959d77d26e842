#include "core/ptrace/signal_interceptor.h"

#include "core/base/status_macros.h"

namespace kwatch::core::ptrace {

bool InterceptorFanOut::Claims(pid_t tid, const siginfo_t& si) {
  claimer_ = nullptr;
  for (SignalInterceptor* i : all_) {
    if (i->Claims(tid, si)) {
      claimer_ = i;
      return true;
    }
  }
  return false;
}

absl::Status InterceptorFanOut::Handle(pid_t tid, const siginfo_t& si) {
  if (claimer_ == nullptr && !Claims(tid, si)) {
    return absl::InternalError("a claimed signal has no interceptor");
  }
  return claimer_->Handle(tid, si);
}

absl::StatusOr<bool> InterceptorFanOut::HandleInPlace(pid_t tid, const siginfo_t& si) {
  if (claimer_ == nullptr && !Claims(tid, si)) {
    return false;
  }
  return claimer_->HandleInPlace(tid, si);
}

absl::Status InterceptorFanOut::OnFork(Process& child) {
  absl::Status first;
  for (SignalInterceptor* i : all_) {
    first.Update(i->OnFork(child));
  }
  return first;
}

void InterceptorFanOut::OnFollowedFork(Process& child, pid_t parent_tid) {
  for (SignalInterceptor* i : all_) {
    i->OnFollowedFork(child, parent_tid);
  }
}

absl::Status InterceptorFanOut::OnThreadStart(pid_t tid) {
  for (SignalInterceptor* i : all_) {
    KW_RETURN_IF_ERROR(i->OnThreadStart(tid));
  }
  return absl::OkStatus();
}

absl::Status InterceptorFanOut::OnSyscallStop(pid_t tid, const SyscallStop& stop,
                                              bool world_stopped) {
  for (SignalInterceptor* i : all_) {
    KW_RETURN_IF_ERROR(i->OnSyscallStop(tid, stop, world_stopped));
  }
  return absl::OkStatus();
}

}  // namespace kwatch::core::ptrace
