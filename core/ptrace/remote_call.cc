#include "core/ptrace/remote_call.h"

#include <elf.h>
#include <sys/mman.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"
#include "core/base/syscall_status.h"
#include "core/ptrace/process.h"

namespace kwatch::core::ptrace {

namespace {

constexpr uint64_t kRedZone = 128;
constexpr uint64_t kTrapFlag = 1U << 8;
constexpr uint64_t kDirectionFlag = 1U << 10;
// Big enough for any XSAVE layout (AMX tiles included); the kernel says how much it used.
constexpr size_t kXstateMax = size_t{32} * 1024;

// A fault of the code that runs: the kernel raised it for an instruction of the thread.
bool Synchronous(int sig, const siginfo_t& si) {
  const bool fault_signal = sig == SIGSEGV || sig == SIGBUS || sig == SIGILL || sig == SIGFPE ||
                            sig == SIGTRAP || sig == SIGSYS;
  return fault_signal && si.si_code > 0;
}

std::string SignalText(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev != nullptr ? absl::StrCat("SIG", abbrev) : absl::StrCat("signal ", sig);
}

// The thread's FPU/SSE/AVX state, as PTRACE_GETREGSET(NT_X86_XSTATE) gives it (or the legacy
// FXSAVE area where the kernel has no XSTATE regset).
struct FpState {
  std::vector<uint8_t> bytes;
  bool xstate = false;
};

absl::StatusOr<FpState> SaveFp(pid_t tid) {
  FpState fp;
  fp.bytes.resize(kXstateMax);
  iovec iov{fp.bytes.data(), fp.bytes.size()};
  if (::ptrace(PTRACE_GETREGSET, tid, reinterpret_cast<void*>(NT_X86_XSTATE), &iov) == 0) {
    fp.bytes.resize(iov.iov_len);
    fp.xstate = true;
    return fp;
  }
  fp.bytes.resize(sizeof(user_fpregs_struct));
  if (::ptrace(PTRACE_GETFPREGS, tid, nullptr, fp.bytes.data()) != 0) {
    const int err = errno;
    return SyscallError(err, absl::StrCat("ptrace(PTRACE_GETFPREGS, ", tid, ")"));
  }
  return fp;
}

absl::Status RestoreFp(pid_t tid, FpState& fp) {
  if (fp.xstate) {
    iovec iov{fp.bytes.data(), fp.bytes.size()};
    if (::ptrace(PTRACE_SETREGSET, tid, reinterpret_cast<void*>(NT_X86_XSTATE), &iov) != 0) {
      const int err = errno;
      return SyscallError(err, absl::StrCat("ptrace(PTRACE_SETREGSET, ", tid, ", NT_X86_XSTATE)"));
    }
    return absl::OkStatus();
  }
  if (::ptrace(PTRACE_SETFPREGS, tid, nullptr, fp.bytes.data()) != 0) {
    const int err = errno;
    return SyscallError(err, absl::StrCat("ptrace(PTRACE_SETFPREGS, ", tid, ")"));
  }
  return absl::OkStatus();
}

absl::Status PtraceCont(pid_t tid) {
  if (::ptrace(PTRACE_CONT, tid, nullptr, 0) != 0) {
    const int err = errno;
    if (err == ESRCH) {
      return absl::OkStatus();  // dying: its exit status follows
    }
    return SyscallError(err, absl::StrCat("ptrace(PTRACE_CONT, ", tid, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

// Process's internals for one call (a friend of Process).
class RemoteCallRunner {
 public:
  RemoteCallRunner(Process& proc, pid_t tid, const RemoteCallOptions& options)
      : proc_(proc), tid_(tid), options_(options) {}

  absl::StatusOr<RemoteCallResult> Run(RemoteAddr function, std::span<const uint64_t> args);
  // System call `nr` through `syscall; int3` written at the thread's rip.
  absl::StatusOr<int64_t> Syscall(long nr, std::span<const uint64_t> args);

 private:
  enum class End : uint8_t { kReturned, kFault, kTimeout, kGone };
  struct Outcome {
    End end = End::kGone;
    uint64_t value = 0;
    siginfo_t si{};
    uint64_t rip = 0;
    std::string why{};  // kGone
  };

  absl::Status Check(std::span<const uint64_t> args, bool need_trap) const;
  // Runs the thread until the call ends one way or another.
  absl::StatusOr<Outcome> Wait();
  // One wait status of the calling thread: an outcome, or nullopt to go on waiting.
  absl::StatusOr<std::optional<Outcome>> OnStatus(int status, bool interrupted);
  absl::Status ResumeOthers();
  absl::Status SendDeferred();

  Process& proc_;
  pid_t tid_;
  const RemoteCallOptions& options_;
  uint64_t trap_ = 0;  // the INT3 the thread stops at when done
  std::vector<siginfo_t> deferred_;
  int killed_forks_ = 0;
};

absl::Status RemoteCallRunner::Check(std::span<const uint64_t> args, bool need_trap) const {
  if (args.size() > 6) {
    return absl::InvalidArgumentError("a remote call takes at most 6 integer arguments");
  }
  if (need_trap && options_.return_trap.value == 0) {
    return absl::InvalidArgumentError("a remote call needs a return trap (MapRemoteTrap)");
  }
  if (!proc_.alive()) {
    return absl::FailedPreconditionError(absl::StrCat("process ", proc_.pid(), " has exited"));
  }
  auto it = proc_.threads_.find(tid_);
  if (it == proc_.threads_.end() || it->second.state != Process::ThreadState::kStopped) {
    return absl::FailedPreconditionError(
        absl::StrCat("thread ", tid_, " is not stopped by kwatch; cannot run a call in it"));
  }
  if (it->second.at_syscall != Process::SyscallAt::kNone) {
    return absl::FailedPreconditionError(absl::StrCat(
        "thread ", tid_, " is at a system-call stop; a remote call needs it stopped elsewhere"));
  }
  if (options_.resume_others && (proc_.interceptor_ != nullptr || proc_.syscall_stops_)) {
    return absl::FailedPreconditionError(
        "a remote call resumes the other threads only in a process without signal "
        "interceptors or system-call stops (run it before arming anything)");
  }
  return absl::OkStatus();
}

absl::StatusOr<RemoteCallResult> RemoteCallRunner::Run(RemoteAddr function,
                                                       std::span<const uint64_t> args) {
  KW_RETURN_IF_ERROR(Check(args, /*need_trap=*/true));
  trap_ = options_.return_trap.value;
  KW_ASSIGN_OR_RETURN(const user_regs_struct saved, proc_.GetRegs(tid_));
  KW_ASSIGN_OR_RETURN(FpState fp, SaveFp(tid_));

  // The frame: below the red zone, rsp + 8 a multiple of 16 at the function's entry, and
  // the return address (the trap) at rsp.
  const uint64_t frame = ((saved.rsp - kRedZone) & ~uint64_t{15}) - 8;
  const uint64_t ret = options_.return_trap.value;
  if (absl::Status s = proc_.WriteMemory(
          RemoteAddr{frame}, std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(&ret), 8));
      !s.ok()) {
    return absl::Status(s.code(), absl::StrFormat("writing the return address at 0x%x on thread "
                                                  "%d's stack: %s",
                                                  frame, tid_, s.message()));
  }
  user_regs_struct regs = saved;
  std::array<uint64_t, 6> a{};
  std::copy(args.begin(), args.end(), a.begin());
  regs.rdi = a[0];
  regs.rsi = a[1];
  regs.rdx = a[2];
  regs.rcx = a[3];
  regs.r8 = a[4];
  regs.r9 = a[5];
  regs.rax = 0;                               // no vector registers for a variadic callee
  regs.orig_rax = static_cast<uint64_t>(-1);  // no system-call restart before the call
  regs.rip = function.value;
  regs.rsp = frame;
  regs.eflags &= ~(kTrapFlag | kDirectionFlag);

  // From here on the thread's registers go back whatever happens (while it lives).
  bool restored = false;
  auto restore = [&]() -> absl::Status {
    if (restored || !proc_.alive() || !proc_.threads_.contains(tid_)) {
      return absl::OkStatus();
    }
    restored = true;
    KW_RETURN_IF_ERROR(proc_.SetRegs(tid_, saved));
    return RestoreFp(tid_, fp);
  };
  absl::Cleanup always = [&] { (void)restore(); };
  KW_RETURN_IF_ERROR(proc_.SetRegs(tid_, regs));

  const bool was_stopping = proc_.stopping_all_;
  // With the others kept stopped, threads the call starts stay stopped too.
  proc_.stopping_all_ = !options_.resume_others;
  absl::Cleanup stopping = [&] { proc_.stopping_all_ = was_stopping; };
  bool others_running = false;
  if (options_.resume_others) {
    others_running = true;
    KW_RETURN_IF_ERROR(ResumeOthers());
  }
  absl::Cleanup restop = [&] {
    if (others_running) {
      proc_.stopping_all_ = was_stopping;
      (void)proc_.StopAll();
    }
  };

  const absl::Time start = absl::Now();
  if (::ptrace(PTRACE_CONT, tid_, nullptr, 0) != 0) {
    const int err = errno;
    return SyscallError(err, absl::StrCat("ptrace(PTRACE_CONT, ", tid_, ")"));
  }
  KW_ASSIGN_OR_RETURN(const Outcome out, Wait());
  const absl::Duration elapsed = absl::Now() - start;
  const absl::Status restored_status = restore();
  if (others_running) {
    others_running = false;
    proc_.stopping_all_ = was_stopping;
    KW_RETURN_IF_ERROR(proc_.StopAll());
  }
  const std::string what = absl::StrFormat("the call of 0x%x in thread %d", function.value, tid_);
  switch (out.end) {
    case End::kGone:
      return absl::AbortedError(absl::StrCat(what, ": ", out.why));
    case End::kTimeout:
      KW_RETURN_IF_ERROR(restored_status);
      KW_RETURN_IF_ERROR(SendDeferred());
      return absl::DeadlineExceededError(absl::StrCat(
          what, " did not return within ", absl::FormatDuration(options_.timeout),
          "; the thread was interrupted and its registers restored (locks the call took stay "
          "taken)"));
    case End::kFault:
      KW_RETURN_IF_ERROR(restored_status);
      KW_RETURN_IF_ERROR(SendDeferred());
      return absl::InternalError(absl::StrFormat(
          "%s faulted: %s (code %d) at address 0x%x, rip 0x%x; the signal was not delivered and "
          "the thread's registers were restored",
          what, SignalText(out.si.si_signo), out.si.si_code,
          reinterpret_cast<uint64_t>(out.si.si_addr), out.rip));
    case End::kReturned:
      break;
  }
  KW_RETURN_IF_ERROR(restored_status);
  KW_RETURN_IF_ERROR(SendDeferred());
  RemoteCallResult result;
  result.value = out.value;
  result.deferred_signals = static_cast<int>(deferred_.size());
  result.killed_forks = killed_forks_;
  result.elapsed = elapsed;
  return result;
}

absl::Status RemoteCallRunner::ResumeOthers() {
  for (auto& [tid, thread] : proc_.threads_) {
    if (tid != tid_ && thread.state == Process::ThreadState::kStopped) {
      KW_RETURN_IF_ERROR(proc_.Cont(tid, std::exchange(thread.pending_signal, 0)));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<RemoteCallRunner::Outcome> RemoteCallRunner::Wait() {
  const absl::Time deadline = absl::Now() + options_.timeout;
  absl::Time give_up = absl::InfiniteFuture();
  bool interrupted = false;
  useconds_t nap = 0;
  for (;;) {
    if (!proc_.alive()) {
      return Outcome{.end = End::kGone, .why = "the process ended"};
    }
    int status = 0;
    KW_ASSIGN_OR_RETURN(const pid_t t, proc_.NextStatus(status, /*nohang=*/true));
    if (t == 0) {
      const absl::Time now = absl::Now();
      if (!interrupted && now >= deadline) {
        if (::ptrace(PTRACE_INTERRUPT, tid_, nullptr, nullptr) != 0 && errno != ESRCH) {
          const int err = errno;
          return SyscallError(err, absl::StrCat("ptrace(PTRACE_INTERRUPT, ", tid_, ")"));
        }
        interrupted = true;
        give_up = now + absl::Seconds(2);
      } else if (interrupted && now >= give_up) {
        return absl::InternalError(
            absl::StrCat("thread ", tid_, " did not stop after PTRACE_INTERRUPT"));
      }
      // Polls: 0, 20, 40, ... up to 250 us between looks (waitpid has no timeout).
      ::usleep(nap);
      nap = std::min<useconds_t>(std::max<useconds_t>(nap * 2, 20), 250);
      continue;
    }
    nap = 0;
    if (t != tid_) {
      if (proc_.Adopt(t, status)) {
        KW_RETURN_IF_ERROR(proc_.HandleStatus(t, status, proc_.pending_events_));
      }
      continue;
    }
    KW_ASSIGN_OR_RETURN(std::optional<Outcome> out, OnStatus(status, interrupted));
    if (out.has_value()) {
      return *std::move(out);
    }
  }
}

absl::StatusOr<std::optional<RemoteCallRunner::Outcome>> RemoteCallRunner::OnStatus(
    int status, bool interrupted) {
  if (WIFEXITED(status) || WIFSIGNALED(status)) {
    KW_RETURN_IF_ERROR(proc_.HandleStatus(tid_, status, proc_.pending_events_));
    return Outcome{.end = End::kGone,
                   .why = proc_.alive() ? "the thread ended" : "the process ended"};
  }
  if (!WIFSTOPPED(status)) {
    return std::nullopt;
  }
  const int event = status >> 16;
  const int sig = WSTOPSIG(status);
  switch (event) {
    case PTRACE_EVENT_EXEC:
      KW_RETURN_IF_ERROR(proc_.HandleStatus(tid_, status, proc_.pending_events_));
      return Outcome{.end = End::kGone, .why = "the process exec'd"};
    case PTRACE_EVENT_CLONE: {
      // As Process does: the new thread is traced, and met at its first stop.
      unsigned long new_tid = 0;
      ::ptrace(PTRACE_GETEVENTMSG, tid_, nullptr, &new_tid);
      const auto child = static_cast<pid_t>(new_tid);
      if (child != 0 && !proc_.threads_.contains(child)) {
        proc_.threads_[child].fresh = true;
      }
      proc_.pending_events_.push_back({ProcessEvent::Kind::kThreadStarted, child, 0});
      KW_RETURN_IF_ERROR(PtraceCont(tid_));
      return std::nullopt;
    }
    case PTRACE_EVENT_FORK: {
      // The child is a copy of this thread in the middle of the call: it would return into
      // the trap with no tracer and die of SIGTRAP. It dies now, before running.
      unsigned long child_pid = 0;
      ::ptrace(PTRACE_GETEVENTMSG, tid_, nullptr, &child_pid);
      if (child_pid != 0) {
        ::kill(static_cast<pid_t>(child_pid), SIGKILL);
        ++killed_forks_;
      }
      KW_RETURN_IF_ERROR(PtraceCont(tid_));
      return std::nullopt;
    }
    case PTRACE_EVENT_STOP:
      if (interrupted) {
        return Outcome{.end = End::kTimeout};
      }
      // An interrupt of kwatch's that arrived late, or a group stop: the call goes on.
      proc_.threads_[tid_].interrupt_pending = false;
      KW_RETURN_IF_ERROR(PtraceCont(tid_));
      return std::nullopt;
    case 0:
      break;
    default:
      KW_RETURN_IF_ERROR(PtraceCont(tid_));
      return std::nullopt;
  }
  if ((sig & 0x80) != 0) {  // a system-call stop (none is asked for): go on
    KW_RETURN_IF_ERROR(PtraceCont(tid_));
    return std::nullopt;
  }
  siginfo_t si{};
  if (::ptrace(PTRACE_GETSIGINFO, tid_, nullptr, &si) != 0) {
    return std::nullopt;  // killed meanwhile: its exit status follows
  }
  auto regs = proc_.GetRegs(tid_);
  if (!regs.ok()) {
    return std::nullopt;
  }
  if (sig == SIGTRAP && regs->rip == trap_ + 1) {
    return Outcome{.end = End::kReturned, .value = regs->rax};
  }
  if (sig == SIGTRAP && proc_.SpuriousTrap(tid_, si)) {
    KW_RETURN_IF_ERROR(PtraceCont(tid_));  // absorbed, as Process does
    return std::nullopt;
  }
  if (Synchronous(sig, si)) {
    return Outcome{.end = End::kFault, .si = si, .rip = regs->rip};
  }
  deferred_.push_back(si);  // sent again once the registers are back
  KW_RETURN_IF_ERROR(PtraceCont(tid_));
  return std::nullopt;
}

absl::Status RemoteCallRunner::SendDeferred() {
  for (siginfo_t& si : deferred_) {
    long r = 0;
    std::string call;
    if (si.si_code < 0 && si.si_code != SI_TKILL) {
      // sigqueue() and the like: the sender, its value and the code stay as they were.
      r = ::syscall(SYS_rt_tgsigqueueinfo, proc_.pid(), tid_, si.si_signo, &si);
      call = "rt_tgsigqueueinfo";
    } else {
      r = ::syscall(SYS_tgkill, proc_.pid(), tid_, si.si_signo);
      call = "tgkill";
    }
    if (r != 0) {
      const int err = errno;
      if (err == ESRCH) {
        return absl::OkStatus();  // the thread is gone: nothing to deliver to
      }
      return SyscallError(
          err, absl::StrCat(call, "(", proc_.pid(), ", ", tid_, ", ", SignalText(si.si_signo),
                            "): sending again a signal held during a call"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> RemoteCallRunner::Syscall(long nr, std::span<const uint64_t> args) {
  KW_RETURN_IF_ERROR(Check(args, /*need_trap=*/false));
  if (options_.resume_others) {
    return absl::InvalidArgumentError(
        "a remote system call patches the code at rip: the other threads stay stopped");
  }
  KW_ASSIGN_OR_RETURN(const user_regs_struct saved, proc_.GetRegs(tid_));
  // `syscall; int3` over the code at rip (nothing else runs it: every thread is stopped).
  const RemoteAddr at{saved.rip};
  std::array<uint8_t, 3> original{};
  KW_RETURN_IF_ERROR(proc_.ReadMemory(at, original));
  static constexpr std::array<uint8_t, 3> kStub = {0x0f, 0x05, 0xcc};
  KW_RETURN_IF_ERROR(proc_.WriteMemory(at, kStub));
  trap_ = saved.rip + 2;
  bool restored = false;
  auto restore = [&]() -> absl::Status {
    if (restored || !proc_.alive() || !proc_.threads_.contains(tid_)) {
      return absl::OkStatus();
    }
    restored = true;
    KW_RETURN_IF_ERROR(proc_.WriteMemory(at, original));
    return proc_.SetRegs(tid_, saved);
  };
  absl::Cleanup always = [&] { (void)restore(); };

  user_regs_struct regs = saved;
  std::array<uint64_t, 6> a{};
  std::copy(args.begin(), args.end(), a.begin());
  regs.rax = static_cast<uint64_t>(nr);
  regs.rdi = a[0];
  regs.rsi = a[1];
  regs.rdx = a[2];
  regs.r10 = a[3];
  regs.r8 = a[4];
  regs.r9 = a[5];
  regs.orig_rax = static_cast<uint64_t>(-1);  // no restart of the thread's own call first
  regs.eflags &= ~kTrapFlag;
  KW_RETURN_IF_ERROR(proc_.SetRegs(tid_, regs));
  const bool was_stopping = proc_.stopping_all_;
  proc_.stopping_all_ = true;
  absl::Cleanup stopping = [&] { proc_.stopping_all_ = was_stopping; };
  if (::ptrace(PTRACE_CONT, tid_, nullptr, 0) != 0) {
    const int err = errno;
    return SyscallError(err, absl::StrCat("ptrace(PTRACE_CONT, ", tid_, ")"));
  }
  KW_ASSIGN_OR_RETURN(const Outcome out, Wait());
  const absl::Status restored_status = restore();
  const std::string what = absl::StrCat("system call ", nr, " in thread ", tid_);
  switch (out.end) {
    case End::kGone:
      return absl::AbortedError(absl::StrCat(what, ": ", out.why));
    case End::kTimeout:
      KW_RETURN_IF_ERROR(restored_status);
      KW_RETURN_IF_ERROR(SendDeferred());
      return absl::DeadlineExceededError(
          absl::StrCat(what, " did not return within ", absl::FormatDuration(options_.timeout)));
    case End::kFault:
      KW_RETURN_IF_ERROR(restored_status);
      KW_RETURN_IF_ERROR(SendDeferred());
      return absl::InternalError(absl::StrFormat("%s faulted: %s (code %d) at rip 0x%x", what,
                                                 SignalText(out.si.si_signo), out.si.si_code,
                                                 out.rip));
    case End::kReturned:
      break;
  }
  KW_RETURN_IF_ERROR(restored_status);
  KW_RETURN_IF_ERROR(SendDeferred());
  return static_cast<int64_t>(out.value);
}

absl::StatusOr<int64_t> RemoteSyscallByTrap(Process& proc, pid_t tid, long nr,
                                            std::span<const uint64_t> args,
                                            absl::Duration timeout) {
  const RemoteCallOptions options{.timeout = timeout};
  RemoteCallRunner runner(proc, tid, options);
  return runner.Syscall(nr, args);
}

absl::StatusOr<RemoteCallResult> RemoteCall(Process& proc, pid_t tid, RemoteAddr function,
                                            std::span<const uint64_t> args,
                                            const RemoteCallOptions& options) {
  RemoteCallRunner runner(proc, tid, options);
  return runner.Run(function, args);
}

absl::StatusOr<RemoteAddr> MapRemoteTrap(Process& proc, pid_t tid, uint64_t bytes) {
  const uint64_t size = (std::max<uint64_t>(bytes, 1) + 4095) & ~uint64_t{4095};
  const std::array<uint64_t, 6> args = {
      0, size, PROT_READ | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, static_cast<uint64_t>(-1), 0};
  KW_ASSIGN_OR_RETURN(const int64_t r, RemoteSyscallByTrap(proc, tid, SYS_mmap, args));
  if (r < 0 && r > -4096) {
    return SyscallError(static_cast<int>(-r),
                        absl::StrCat("mmap(", size, " bytes, PROT_READ|PROT_EXEC) in process ",
                                     proc.pid(), " (a remote call's return trap)"));
  }
  const RemoteAddr at{static_cast<uint64_t>(r)};
  const std::vector<uint8_t> int3(size, 0xcc);
  if (absl::Status s = proc.WriteMemory(at, int3); !s.ok()) {
    (void)UnmapRemote(proc, tid, at, size);
    return s;
  }
  return at;
}

absl::Status UnmapRemote(Process& proc, pid_t tid, RemoteAddr addr, uint64_t bytes) {
  const std::array<uint64_t, 2> args = {addr.value, bytes};
  KW_ASSIGN_OR_RETURN(const int64_t r, RemoteSyscallByTrap(proc, tid, SYS_munmap, args));
  if (r != 0) {
    return SyscallError(static_cast<int>(-r), absl::StrFormat("munmap(0x%x, %d) in process %d",
                                                              addr.value, bytes, proc.pid()));
  }
  return absl::OkStatus();
}

}  // namespace kwatch::core::ptrace
