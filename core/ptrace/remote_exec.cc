// Code run inside a stopped thread: Process::RemoteSyscall, the typed mmap family, and
// RemoteCall (remote_exec.h).
#include "core/ptrace/remote_exec.h"

#include <elf.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <string>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"
#include "core/base/syscall_status.h"
#include "core/ptrace/process_internal.h"
#include "core/ptrace/thread_regs.h"

namespace kwatch::core {

absl::StatusOr<int64_t> Process::RemoteSyscall(pid_t tid, long nr, std::span<const uint64_t> args) {
  if (args.size() > 6) {
    return absl::InvalidArgumentError("a system call takes at most 6 arguments");
  }
  auto it = threads_.find(tid);
  if (it == threads_.end() || it->second.state != ThreadState::kStopped) {
    return absl::FailedPreconditionError(
        absl::StrCat("thread ", tid, " is not stopped by kwatch; cannot run a system call in it"));
  }
  if (it->second.at_syscall != SyscallAt::kNone) {
    return SyscallAtStop(tid, nr, args);  // its own syscall instruction: nothing to patch
  }
  KW_ASSIGN_OR_RETURN(const user_regs_struct saved, GetRegs(tid));
  // Patch a `syscall` instruction (0f 05) over the code at rip, run it, put everything back.
  const uint64_t at = saved.rip;
  errno = 0;
  const long word = ::ptrace(PTRACE_PEEKTEXT, tid, at, nullptr);
  if (errno != 0) {
    const int err = errno;
    return SyscallError(err, absl::StrCat("ptrace(PTRACE_PEEKTEXT, ", tid, ")"));
  }
  const long patched = (word & ~0xffffL) | 0x050f;
  if (::ptrace(PTRACE_POKETEXT, tid, at, patched) != 0) {
    const int err = errno;
    return SyscallError(err, absl::StrCat("ptrace(PTRACE_POKETEXT, ", tid, ")"));
  }
  bool restored = false;
  auto restore = [&]() -> absl::Status {
    if (restored || !alive()) {
      return absl::OkStatus();
    }
    restored = true;
    if (::ptrace(PTRACE_POKETEXT, tid, at, word) != 0) {
      const int err = errno;
      return SyscallError(err, "ptrace(PTRACE_POKETEXT, restore)");
    }
    return SetRegs(tid, saved);
  };
  absl::Cleanup always = [&] { (void)restore(); };

  user_regs_struct regs = saved;
  regs.rax = static_cast<uint64_t>(nr);
  regs.orig_rax = static_cast<uint64_t>(-1);  // no syscall restart logic for the injected call
  std::array<uint64_t, 6> a{};
  std::copy(args.begin(), args.end(), a.begin());
  regs.rdi = a[0];
  regs.rsi = a[1];
  regs.rdx = a[2];
  regs.r10 = a[3];
  regs.r8 = a[4];
  regs.r9 = a[5];
  KW_RETURN_IF_ERROR(SetRegs(tid, regs));
  const int pending = std::exchange(it->second.pending_signal, 0);
  const auto ended = [this] {
    return absl::AbortedError(
        absl::StrCat("process ", pid_, " ended during a system call kwatch ran in it"));
  };
  KW_ASSIGN_OR_RETURN(int stop, SingleStep(tid));
  if (stop == 0) {
    return ended();
  }
  KW_ASSIGN_OR_RETURN(user_regs_struct after, GetRegs(tid));
  if (after.rip == at) {
    // Nothing ran: the thread was stopped inside a system call of its own at a ptrace event
    // (the exec event: execve has not returned yet), and the step only ended that call,
    // writing its return value over rax (the single-step report at syscall exit, seen on
    // Linux 6.18). Run the injected call now.
    KW_RETURN_IF_ERROR(SetRegs(tid, regs));
    KW_ASSIGN_OR_RETURN(stop, SingleStep(tid));
    if (stop == 0) {
      return ended();
    }
    KW_ASSIGN_OR_RETURN(after, GetRegs(tid));
  }
  // The target's earlier signal first; one that arrived during the step otherwise.
  if (pending != 0) {
    threads_[tid].pending_signal = pending;
  }
  KW_RETURN_IF_ERROR(restore());
  return static_cast<int64_t>(after.rax);
}

namespace {

using process_internal::IsStopSignal;
using process_internal::ReadAuxvEntry;

constexpr uint64_t kRedZone = 128;  // bytes below rsp a leaf function may use (SysV ABI)

std::string ProtText(int prot) {
  return absl::StrCat((prot & PROT_READ) != 0 ? "r" : "-", (prot & PROT_WRITE) != 0 ? "w" : "-",
                      (prot & PROT_EXEC) != 0 ? "x" : "-");
}

// A raw system-call result as a Status: -errno becomes SyscallError(errno, what).
absl::Status SyscallResult(int64_t r, absl::string_view what) {
  if (r < 0 && r > -4096) {
    return SyscallError(static_cast<int>(-r), what);
  }
  return absl::OkStatus();
}

// A synchronous fault raised by the code itself (not sent by another process).
bool IsFault(const siginfo_t& si) {
  return (si.si_signo == SIGSEGV || si.si_signo == SIGBUS || si.si_signo == SIGILL ||
          si.si_signo == SIGFPE) &&
         si.si_code > 0;
}

}  // namespace

absl::StatusOr<RemoteAddr> RemoteMmap(Process& proc, pid_t tid, const RemoteMapping& mapping,
                                      absl::string_view what) {
  const std::array<uint64_t, 6> args = {
      mapping.addr,
      mapping.length,
      static_cast<uint64_t>(mapping.prot),
      static_cast<uint64_t>(mapping.flags | MAP_PRIVATE | MAP_ANONYMOUS),
      static_cast<uint64_t>(-1),
      0};
  KW_ASSIGN_OR_RETURN(const int64_t r, proc.RemoteSyscall(tid, SYS_mmap, args));
  std::string call(what);
  if (call.empty()) {
    call = absl::StrFormat("mmap(0x%x, %d, %s) in pid %d", mapping.addr, mapping.length,
                           ProtText(mapping.prot), proc.pid());
  }
  KW_RETURN_IF_ERROR(SyscallResult(r, call));
  return RemoteAddr{static_cast<uint64_t>(r)};
}

absl::Status RemoteMunmap(Process& proc, pid_t tid, RemoteAddr addr, uint64_t length,
                          absl::string_view what) {
  const std::array<uint64_t, 2> args = {addr.value, length};
  KW_ASSIGN_OR_RETURN(const int64_t r, proc.RemoteSyscall(tid, SYS_munmap, args));
  std::string call(what);
  if (call.empty()) {
    call = absl::StrFormat("munmap(0x%x, %d) in pid %d", addr.value, length, proc.pid());
  }
  return SyscallResult(r, call);
}

absl::Status RemoteMprotect(Process& proc, pid_t tid, RemoteAddr addr, uint64_t length, int prot,
                            absl::string_view what) {
  const std::array<uint64_t, 3> args = {addr.value, length, static_cast<uint64_t>(prot)};
  KW_ASSIGN_OR_RETURN(const int64_t r, proc.RemoteSyscall(tid, SYS_mprotect, args));
  std::string call(what);
  if (call.empty()) {
    call = absl::StrFormat("mprotect(0x%x, %d, %s) in pid %d", addr.value, length, ProtText(prot),
                           proc.pid());
  }
  return SyscallResult(r, call);
}

absl::StatusOr<uint64_t> RemoteCall(Process& proc, pid_t tid, RemoteAddr function,
                                    std::span<const uint64_t> args, const RemoteCallOptions& opts) {
  using ThreadState = Process::ThreadState;
  using SyscallAt = Process::SyscallAt;
  if (args.size() > 6) {
    return absl::InvalidArgumentError(
        "a remote call takes at most 6 integer arguments (the SysV ABI's argument registers)");
  }
  const auto it = proc.threads_.find(tid);
  if (it == proc.threads_.end() || it->second.state != ThreadState::kStopped) {
    return absl::FailedPreconditionError(
        absl::StrCat("thread ", tid, " is not stopped by kwatch; cannot call a function in it"));
  }
  if (it->second.at_syscall != SyscallAt::kNone) {
    return absl::FailedPreconditionError(absl::StrCat(
        "thread ", tid, " is at a system-call stop; call functions from another stop"));
  }
  KW_ASSIGN_OR_RETURN(const uint64_t entry, ReadAuxvEntry(proc.pid(), AT_ENTRY));
  KW_ASSIGN_OR_RETURN(const user_regs_struct saved, ReadGeneralRegs(tid));
  KW_ASSIGN_OR_RETURN(const ExtendedRegs saved_ext, ReadExtendedRegs(tid));
  uint8_t entry_byte = 0;
  KW_RETURN_IF_ERROR(proc.ReadMemory(RemoteAddr{entry}, std::span<uint8_t>(&entry_byte, 1)));

  // The call's frame: below the red zone, the return address at a 16-byte boundary minus 8
  // (as after a `call` from an aligned stack).
  const uint64_t sp = ((saved.rsp - kRedZone) & ~uint64_t{15}) - 8;
  const uint64_t ret = entry;
  KW_RETURN_IF_ERROR(proc.WriteMemory(
      RemoteAddr{sp}, std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(&ret), 8)));
  const uint8_t int3 = 0xcc;
  KW_RETURN_IF_ERROR(proc.WriteMemory(RemoteAddr{entry}, std::span<const uint8_t>(&int3, 1)));
  const int pending = std::exchange(it->second.pending_signal, 0);
  bool restored = false;
  const auto restore = [&]() -> absl::Status {
    if (restored || !proc.alive()) {
      return absl::OkStatus();
    }
    restored = true;
    absl::Status s = proc.WriteMemory(RemoteAddr{entry}, std::span<const uint8_t>(&entry_byte, 1));
    s.Update(WriteGeneralRegs(tid, saved));
    s.Update(WriteExtendedRegs(tid, saved_ext));
    if (auto t = proc.threads_.find(tid); t != proc.threads_.end()) {
      t->second.state = ThreadState::kStopped;
      if (pending != 0) {
        t->second.pending_signal = pending;  // the target's earlier signal first
      }
    }
    return s;
  };
  absl::Cleanup always = [&] { (void)restore(); };

  user_regs_struct regs = saved;
  regs.rip = function.value;
  regs.rsp = sp;
  std::array<uint64_t, 6> a{};
  std::copy(args.begin(), args.end(), a.begin());
  regs.rdi = a[0];
  regs.rsi = a[1];
  regs.rdx = a[2];
  regs.rcx = a[3];
  regs.r8 = a[4];
  regs.r9 = a[5];
  regs.rax = 0;                               // no vector registers for a variadic callee
  regs.orig_rax = static_cast<uint64_t>(-1);  // no syscall restart on the way to the callee
  KW_RETURN_IF_ERROR(WriteGeneralRegs(tid, regs));

  const auto cont = [&](int sig) -> absl::Status {
    if (::ptrace(PTRACE_CONT, tid, nullptr, sig) != 0) {
      const int err = errno;
      return SyscallError(err, absl::StrCat("ptrace(PTRACE_CONT, ", tid, ")"));
    }
    proc.threads_[tid].state = ThreadState::kRunning;
    return absl::OkStatus();
  };
  const auto ended = [&] {
    return absl::AbortedError(absl::StrFormat(
        "process %d ended during the call of the function at 0x%x", proc.pid(), function.value));
  };
  const auto record = [&](int status) -> absl::Status {  // a ptrace event: noted, not resumed
    const bool was = proc.stopping_all_;
    proc.stopping_all_ = true;
    absl::Status s = proc.HandleStatus(tid, status, proc.pending_events_);
    proc.stopping_all_ = was;
    return s;
  };
  KW_RETURN_IF_ERROR(cont(0));
  const absl::Time deadline = absl::Now() + opts.max_wait;
  bool interrupted = false;
  for (int spins = 0;; ++spins) {
    int status = 0;
    const pid_t r = ::waitpid(tid, &status, __WALL | (interrupted ? 0 : WNOHANG));
    if (r < 0) {
      const int err = errno;
      if (err == EINTR) {
        continue;
      }
      return SyscallError(err, absl::StrCat("waitpid(", tid, ")"));
    }
    if (r == 0) {
      if (absl::Now() >= deadline) {
        if (::ptrace(PTRACE_INTERRUPT, tid, nullptr, nullptr) != 0) {
          const int err = errno;
          return SyscallError(err, absl::StrCat("ptrace(PTRACE_INTERRUPT, ", tid, ")"));
        }
        interrupted = true;
      } else if (spins < 200) {
        ::sched_yield();
      } else {
        ::usleep(100);
      }
      continue;
    }
    if (WIFEXITED(status) || WIFSIGNALED(status)) {
      KW_RETURN_IF_ERROR(proc.HandleStatus(tid, status, proc.pending_events_));
      return ended();
    }
    const int sig = WSTOPSIG(status);
    const int event = status >> 16;
    proc.threads_[tid].state = ThreadState::kStopped;
    if (event == 0 && sig == SIGTRAP) {
      KW_ASSIGN_OR_RETURN(const user_regs_struct now, ReadGeneralRegs(tid));
      if (now.rip == entry + 1 && now.rsp == sp + 8) {  // returned to the INT3
        proc.threads_[tid].interrupt_pending = interrupted;
        KW_RETURN_IF_ERROR(restore());
        return now.rax;
      }
    }
    if (interrupted) {
      // Stopped at last, by the interrupt or by a signal first (the interrupt stop then comes
      // after the next resume, and Poll takes it).
      if (event == 0) {
        siginfo_t si{};
        if (::ptrace(PTRACE_GETSIGINFO, tid, nullptr, &si) == 0 && !IsFault(si) && sig != SIGTRAP) {
          proc.threads_[tid].pending_signal = sig;  // the target's own: after the restore
        }
      }
      proc.threads_[tid].interrupt_pending = event != PTRACE_EVENT_STOP;
      KW_RETURN_IF_ERROR(restore());
      return absl::DeadlineExceededError(absl::StrFormat(
          "the function at 0x%x did not return within %s in thread %d of pid %d: it was "
          "interrupted and the thread's registers restored",
          function.value, absl::FormatDuration(opts.max_wait), tid, proc.pid()));
    }
    if (event == 0) {
      siginfo_t si{};
      const bool have_info = ::ptrace(PTRACE_GETSIGINFO, tid, nullptr, &si) == 0;
      if (have_info && proc.interceptor_ != nullptr && proc.interceptor_->Claims(tid, si)) {
        KW_ASSIGN_OR_RETURN(const bool done, proc.interceptor_->HandleInPlace(tid, si));
        if (!done) {
          KW_RETURN_IF_ERROR(proc.interceptor_->Handle(tid, si));
        }
        KW_RETURN_IF_ERROR(cont(0));
        continue;
      }
      if (have_info && (IsFault(si) || (sig == SIGTRAP && si.si_code > 0))) {
        KW_RETURN_IF_ERROR(restore());
        const char* abbrev = sigabbrev_np(sig);
        return absl::AbortedError(absl::StrFormat(
            "the function at 0x%x faulted in thread %d of pid %d: %s at 0x%x (the signal was "
            "not delivered; the thread's registers are restored)",
            function.value, tid, proc.pid(),
            abbrev == nullptr ? absl::StrCat("signal ", sig) : absl::StrCat("SIG", abbrev),
            reinterpret_cast<uintptr_t>(si.si_addr)));
      }
      proc.threads_[tid].pending_signal = sig;  // the target's own: delivered after the call
      KW_RETURN_IF_ERROR(cont(0));
      continue;
    }
    if (event == PTRACE_EVENT_STOP && !IsStopSignal(sig)) {
      KW_RETURN_IF_ERROR(cont(0));  // an interrupt sent before the call
      continue;
    }
    // A ptrace event inside the call (clone, fork, exec) or a group stop: noted as Poll
    // would. After an exec the function is gone; otherwise the call goes on.
    KW_RETURN_IF_ERROR(record(status));
    if (event == PTRACE_EVENT_EXEC || !proc.alive()) {
      restored = true;  // a new image: nothing of the call to put back
      return absl::AbortedError(
          absl::StrFormat("pid %d executed a new program during the call of the function at 0x%x",
                          proc.pid(), function.value));
    }
    const auto t = proc.threads_.find(tid);
    if (t == proc.threads_.end()) {
      return ended();
    }
    if (t->second.state == ThreadState::kStopped) {
      KW_RETURN_IF_ERROR(cont(0));
    }
  }
}

}  // namespace kwatch::core
