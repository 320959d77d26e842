// Process: system-call stops (PTRACE_SYSCALL), and system calls run at them.
#include <fcntl.h>
#include <sched.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <csignal>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"
#include "core/base/syscall_status.h"
#include "core/ptrace/process.h"
#include "core/ptrace/process_internal.h"

namespace kwatch::core::ptrace {

namespace {

using process_internal::IsStopSignal;
using process_internal::kSyscallTrap;

// The kernel's internal "restart this call" results (include/linux/errno.h), seen by
// tracers at syscall-exit stops and never by programs.
constexpr int64_t kErestartSys = 512;
constexpr int64_t kErestartNoIntr = 513;
constexpr int64_t kErestartNoHand = 514;
constexpr int64_t kErestartRestartBlock = 516;

// Which kind of syscall stop `tid` is at: PTRACE_SYSCALL_INFO_ENTRY / _EXIT, or 0.
int SyscallStopKind(pid_t tid) {
  __ptrace_syscall_info info{};
  if (::ptrace(PTRACE_GET_SYSCALL_INFO, tid, sizeof(info), &info) <= 0) {
    return 0;
  }
  return info.op;
}

// Whether the two bytes before `ip` are `syscall` (0f 05), the only entry kwatch re-runs.
absl::Status CheckSyscallInsn(const Process& proc, uint64_t ip) {
  std::array<uint8_t, 2> insn{};
  KW_RETURN_IF_ERROR(proc.ReadMemory(RemoteAddr{ip - 2}, insn));
  if (insn[0] != 0x0f || insn[1] != 0x05) {
    return absl::UnimplementedError(absl::StrFormat(
        "the system call at 0x%x of pid %d was not made with `syscall` (int 0x80 or sysenter): "
        "kwatch cannot re-run it",
        ip - 2, proc.pid()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Process::HandleSyscallStop(pid_t tid) {
  ++syscall_stop_count_;
  Thread& t = threads_[tid];
  t.state = ThreadState::kStopped;
  const int kind = SyscallStopKind(tid);
  t.at_syscall = kind == PTRACE_SYSCALL_INFO_ENTRY  ? SyscallAt::kEntry
                 : kind == PTRACE_SYSCALL_INFO_EXIT ? SyscallAt::kExit
                                                    : SyscallAt::kNone;
  if (interceptor_ == nullptr || t.at_syscall == SyscallAt::kNone) {
    if (stopping_all_ || handling_claimed_) {
      return absl::OkStatus();
    }
    return Cont(tid, 0);
  }
  if (stopping_all_ || handling_claimed_) {
    t.syscall_unseen = true;  // passed on when the world resumes
    return absl::OkStatus();
  }
  return DeliverSyscallStop(tid, /*world_stopped=*/false);
}

absl::StatusOr<SyscallStop> Process::ReadSyscallStop(pid_t tid) const {
  auto it = threads_.find(tid);
  if (it == threads_.end() || it->second.at_syscall == SyscallAt::kNone) {
    return absl::FailedPreconditionError(absl::StrCat("thread ", tid, " is not at a syscall stop"));
  }
  KW_ASSIGN_OR_RETURN(const user_regs_struct regs, GetRegs(tid));
  SyscallStop st;
  st.entry = it->second.at_syscall == SyscallAt::kEntry;
  st.nr = regs.orig_rax;
  st.args = {regs.rdi, regs.rsi, regs.rdx, regs.r10, regs.r8, regs.r9};
  st.ret = static_cast<int64_t>(regs.rax);
  st.ip = regs.rip;
  return st;
}

absl::Status Process::DeliverSyscallStop(pid_t tid, bool world_stopped) {
  auto it = threads_.find(tid);
  if (it == threads_.end() || it->second.state != ThreadState::kStopped) {
    return absl::OkStatus();
  }
  it->second.syscall_unseen = false;
  auto st = ReadSyscallStop(tid);
  if (!st.ok()) {
    // The thread vanished (SIGKILL) between its stop and now: its exit status follows.
    return absl::IsNotFound(st.status()) ? absl::OkStatus() : st.status();
  }
  if (interceptor_ != nullptr) {
    KW_RETURN_IF_ERROR(interceptor_->OnSyscallStop(tid, *st, world_stopped));
  }
  if (world_stopped) {
    return absl::OkStatus();
  }
  it = threads_.find(tid);
  if (it != threads_.end() && it->second.state == ThreadState::kStopped) {
    return Cont(tid, std::exchange(it->second.pending_signal, 0));
  }
  return absl::OkStatus();
}

absl::Status Process::SettleSyscallStops() {
  for (int guard = 0; guard < 1 << 16; ++guard) {
    pid_t next = 0;
    for (auto& [tid, thread] : threads_) {
      if (thread.syscall_unseen && thread.state == ThreadState::kStopped) {
        next = tid;
        break;
      }
    }
    if (next == 0) {
      return absl::OkStatus();
    }
    if (interceptor_ == nullptr) {
      threads_[next].syscall_unseen = false;
      continue;
    }
    KW_RETURN_IF_ERROR(DeliverSyscallStop(next, /*world_stopped=*/true));
  }
  return absl::InternalError("syscall stops keep coming while the world is stopped");
}

absl::Status Process::AwaitSyscallStop(pid_t tid, bool entry) {
  const auto resume = [tid]() -> absl::Status {
    if (::ptrace(PTRACE_SYSCALL, tid, nullptr, 0) != 0) {
      const int err = errno;
      return SyscallError(err, absl::StrCat("ptrace(PTRACE_SYSCALL, ", tid, ")"));
    }
    return absl::OkStatus();
  };
  KW_RETURN_IF_ERROR(resume());
  threads_[tid].state = ThreadState::kRunning;
  threads_[tid].at_syscall = SyscallAt::kNone;
  for (;;) {
    int status = 0;
    const pid_t r = ::waitpid(tid, &status, __WALL);
    if (r < 0) {
      const int err = errno;
      if (err == EINTR) {
        continue;
      }
      return SyscallError(err, absl::StrCat("waitpid(", tid, ")"));
    }
    if (WIFEXITED(status) || WIFSIGNALED(status)) {
      KW_RETURN_IF_ERROR(HandleStatus(tid, status, pending_events_));
      return absl::AbortedError(absl::StrCat("thread ", tid, " of pid ", pid_,
                                             " ended during a system call kwatch ran in it"));
    }
    const int event = status >> 16;
    const int sig = WSTOPSIG(status);
    Thread& t = threads_[tid];
    if (event == 0 && sig == kSyscallTrap) {
      ++syscall_stop_count_;
      t.state = ThreadState::kStopped;
      t.in_syscall = false;
      const int kind = SyscallStopKind(tid);
      t.at_syscall = kind == PTRACE_SYSCALL_INFO_ENTRY ? SyscallAt::kEntry : SyscallAt::kExit;
      if ((kind == PTRACE_SYSCALL_INFO_ENTRY) != entry) {
        return absl::InternalError(absl::StrCat("thread ", tid, ": expected a syscall-",
                                                entry ? "entry" : "exit", " stop"));
      }
      return absl::OkStatus();
    }
    if (event == 0) {
      // A signal on the way back to user mode, before the syscall instruction ran again:
      // set aside, delivered when the thread resumes (a standard signal is not lost; its
      // siginfo then comes from the kernel).
      if (t.pending_signal == 0) {
        t.pending_signal = sig;
      }
    } else if (event == PTRACE_EVENT_STOP && !IsStopSignal(sig)) {
      t.interrupt_pending = false;  // kwatch's own interrupt: the thread goes on
    } else if (event != PTRACE_EVENT_STOP) {
      // A ptrace event (cannot come from the calls kwatch runs here): recorded as usual.
      const bool was = stopping_all_;
      stopping_all_ = true;
      const absl::Status s = HandleStatus(tid, status, pending_events_);
      stopping_all_ = was;
      KW_RETURN_IF_ERROR(s);
    }
    // A job-control stop met here is passed through: the thread finishes kwatch's call.
    KW_RETURN_IF_ERROR(resume());
    threads_[tid].state = ThreadState::kRunning;
  }
}

absl::StatusOr<int64_t> Process::SyscallAtStop(pid_t tid, long nr, std::span<const uint64_t> args) {
  const SyscallAt at = threads_[tid].at_syscall;
  KW_ASSIGN_OR_RETURN(const user_regs_struct saved, GetRegs(tid));
  KW_RETURN_IF_ERROR(CheckSyscallInsn(*this, saved.rip));
  std::array<uint64_t, 6> a{};
  KW_CHECK(args.size() <= a.size());
  std::copy(args.begin(), args.end(), a.begin());
  user_regs_struct regs = saved;
  regs.rdi = a[0];
  regs.rsi = a[1];
  regs.rdx = a[2];
  regs.r10 = a[3];
  regs.r8 = a[4];
  regs.r9 = a[5];
  int64_t result = 0;
  if (at == SyscallAt::kEntry) {
    // Run `nr` in place of the thread's call, then go back to the entry of its own call.
    regs.orig_rax = static_cast<uint64_t>(nr);
    KW_RETURN_IF_ERROR(SetRegs(tid, regs));
    KW_RETURN_IF_ERROR(AwaitSyscallStop(tid, /*entry=*/false));
    KW_ASSIGN_OR_RETURN(const user_regs_struct after, GetRegs(tid));
    result = static_cast<int64_t>(after.rax);
    regs = saved;
    regs.rip -= 2;
    regs.rax = saved.orig_rax;
    KW_RETURN_IF_ERROR(SetRegs(tid, regs));
    KW_RETURN_IF_ERROR(AwaitSyscallStop(tid, /*entry=*/true));
  } else {
    // After the thread's call: execute its syscall instruction once more, as `nr`.
    regs.rip -= 2;
    regs.rax = static_cast<uint64_t>(nr);
    regs.orig_rax = static_cast<uint64_t>(-1);  // no restart logic on the way out
    KW_RETURN_IF_ERROR(SetRegs(tid, regs));
    KW_RETURN_IF_ERROR(AwaitSyscallStop(tid, /*entry=*/true));
    KW_RETURN_IF_ERROR(AwaitSyscallStop(tid, /*entry=*/false));
    KW_ASSIGN_OR_RETURN(const user_regs_struct after, GetRegs(tid));
    result = static_cast<int64_t>(after.rax);
  }
  user_regs_struct back = saved;
  if (at == SyscallAt::kExit) {
    // The thread's own call was interrupted (a signal, kwatch's PTRACE_INTERRUPT) and is due
    // to restart: the kernel does that on the way out of the exit stop, but the pending work
    // that triggers it was used up by the call kwatch ran. Restart it here, or the program
    // sees -ERESTARTSYS as its result (glibc aborts on such a futex result).
    switch (static_cast<int64_t>(saved.rax)) {
      case -kErestartSys:
      case -kErestartNoIntr:
      case -kErestartNoHand:
        back.rip -= 2;
        back.rax = saved.orig_rax;
        break;
      case -kErestartRestartBlock:
        back.rip -= 2;
        back.rax = SYS_restart_syscall;
        break;
      default:
        break;
    }
  }
  KW_RETURN_IF_ERROR(SetRegs(tid, back));
  return result;
}

absl::Status Process::RestartSyscall(pid_t tid) {
  auto it = threads_.find(tid);
  if (it == threads_.end() || it->second.at_syscall != SyscallAt::kExit) {
    return absl::FailedPreconditionError(
        absl::StrCat("thread ", tid, " is not at a syscall-exit stop"));
  }
  KW_ASSIGN_OR_RETURN(user_regs_struct regs, GetRegs(tid));
  KW_RETURN_IF_ERROR(CheckSyscallInsn(*this, regs.rip));
  regs.rip -= 2;
  regs.rax = regs.orig_rax;
  KW_RETURN_IF_ERROR(SetRegs(tid, regs));
  return AwaitSyscallStop(tid, /*entry=*/true);
}

absl::StatusOr<SyscallOutcome> Process::FinishSyscall(pid_t tid, absl::Duration max_wait) {
  auto it = threads_.find(tid);
  if (it == threads_.end() || it->second.at_syscall != SyscallAt::kEntry) {
    return absl::FailedPreconditionError(
        absl::StrCat("thread ", tid, " is not at a syscall-entry stop"));
  }
  SyscallOutcome out;
  const auto resume = [&]() -> absl::Status {
    if (::ptrace(PTRACE_SYSCALL, tid, nullptr, 0) != 0) {
      const int err = errno;
      return SyscallError(err, absl::StrCat("ptrace(PTRACE_SYSCALL, ", tid, ")"));
    }
    Thread& t = threads_[tid];
    t.state = ThreadState::kRunning;
    t.in_syscall = true;
    t.at_syscall = SyscallAt::kNone;
    t.syscall_unseen = false;
    return absl::OkStatus();
  };
  KW_RETURN_IF_ERROR(resume());
  const absl::Time deadline = absl::Now() + max_wait;
  for (int spins = 0;; ++spins) {
    int status = 0;
    const pid_t r = ::waitpid(tid, &status, __WALL | WNOHANG);
    if (r < 0) {
      const int err = errno;
      if (err == EINTR) {
        continue;
      }
      return SyscallError(err, absl::StrCat("waitpid(", tid, ")"));
    }
    if (r == tid) {
      if (WIFEXITED(status) || WIFSIGNALED(status)) {
        KW_RETURN_IF_ERROR(HandleStatus(tid, status, pending_events_));
        return out;  // kGone
      }
      if ((status >> 16) == 0 && WSTOPSIG(status) == kSyscallTrap) {
        ++syscall_stop_count_;
        Thread& t = threads_[tid];
        t.state = ThreadState::kStopped;
        t.in_syscall = false;
        t.at_syscall = SyscallAt::kExit;
        KW_ASSIGN_OR_RETURN(out.exit, ReadSyscallStop(tid));
        out.kind = SyscallOutcome::Kind::kReturned;
        return out;
      }
      // A ptrace event inside the call (fork, clone, exec): recorded as usual.
      const bool was = stopping_all_;
      stopping_all_ = true;
      const absl::Status s = HandleStatus(tid, status, pending_events_);
      stopping_all_ = was;
      KW_RETURN_IF_ERROR(s);
      auto again = threads_.find(tid);
      if ((status >> 16) == PTRACE_EVENT_EXEC || again == threads_.end() ||
          again->second.state != ThreadState::kStopped) {
        return out;  // kGone: a new image, or the thread stays stopped (job control)
      }
      KW_RETURN_IF_ERROR(resume());
      continue;
    }
    // Still in the kernel: sleeping there means the call blocks.
    if (spins > 0) {
      const char state = TaskStateLetter(pid_, tid);
      if (state == 'S' || state == 'D' || state == 'I') {
        out.kind = SyscallOutcome::Kind::kBlocked;
        return out;
      }
    }
    if (absl::Now() >= deadline) {
      out.kind = SyscallOutcome::Kind::kBlocked;
      return out;
    }
    if (spins < 200) {
      ::sched_yield();
    } else {
      ::usleep(50);
    }
  }
}

}  // namespace kwatch::core::ptrace
