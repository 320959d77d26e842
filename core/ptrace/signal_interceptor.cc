#include "core/ptrace/signal_interceptor.h"

#include <algorithm>

#include "core/base/status_macros.h"

namespace kwatch::core::ptrace {

bool InterceptorFanOut::Claims(pid_t tid, const siginfo_t& si) {
  for (SignalInterceptor* i : all_) {
    if (i->Claims(tid, si)) {
      claimers_[tid] = i;
      return true;
    }
  }
  claimers_.erase(tid);
  return false;
}

SignalInterceptor* InterceptorFanOut::ClaimerOf(pid_t tid, const siginfo_t& si) {
  auto it = claimers_.find(tid);
  if (it != claimers_.end() && std::find(all_.begin(), all_.end(), it->second) != all_.end()) {
    return it->second;
  }
  return Claims(tid, si) ? claimers_.at(tid) : nullptr;
}

absl::Status InterceptorFanOut::Handle(pid_t tid, const siginfo_t& si) {
  SignalInterceptor* claimer = ClaimerOf(tid, si);
  if (claimer == nullptr) {
    return absl::InternalError("a claimed signal has no interceptor");
  }
  claimers_.erase(tid);
  return claimer->Handle(tid, si);
}

void InterceptorFanOut::Drop(pid_t tid, const siginfo_t& si) {
  if (SignalInterceptor* claimer = ClaimerOf(tid, si); claimer != nullptr) {
    claimers_.erase(tid);
    claimer->Drop(tid, si);
  }
}

absl::StatusOr<bool> InterceptorFanOut::HandleInPlace(pid_t tid, const siginfo_t& si) {
  SignalInterceptor* claimer = ClaimerOf(tid, si);
  if (claimer == nullptr) {
    return false;
  }
  absl::StatusOr<bool> done = claimer->HandleInPlace(tid, si);
  if (done.ok() && *done) {
    claimers_.erase(tid);
  }
  return done;
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
