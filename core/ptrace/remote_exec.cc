// Code run inside a stopped thread: Process::RemoteSyscall and the typed mmap family
// (remote_exec.h).
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

namespace kwatch::core::ptrace {

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
  // A fault the thread raised before it stopped may be reported at this step: it belongs to the
  // thread's own instruction, not to the `syscall` patched over it, so SingleStep drops it
  // (the instruction faults again when the thread runs it) instead of handing it over.
  const bool was_listed = !faulting_steps_.insert(tid).second;
  absl::Cleanup unlist = [this, tid, was_listed] {
    if (!was_listed) {
      faulting_steps_.erase(tid);
    }
  };
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

}  // namespace kwatch::core::ptrace
