// Process, stops and events: wait statuses, signals, stopping and resuming the world, steps.
#include "core/ptrace/process.h"

#include <sys/ptrace.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <tuple>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "core/base/status_macros.h"
#include "core/base/syscall_status.h"
#include "core/ptrace/process_internal.h"
#include "core/ptrace/thread_regs.h"
#include "core/ptrace/trap_origin.h"

namespace kwatch::core::ptrace {
namespace {

using process_internal::ExitFromStatus;
using process_internal::IsStopSignal;
using process_internal::kSyscallTrap;

// KWATCH_DEBUG=1 traces signal decisions on stderr.
bool Debug() {
  static const bool kOn = [] {
    const char* v = std::getenv("KWATCH_DEBUG");  // NOLINT(concurrency-mt-unsafe): read once
    return v != nullptr && v[0] == '1';
  }();
  return kOn;
}

}  // namespace

absl::Status Process::Cont(pid_t tid, int sig) {
  auto it = threads_.find(tid);
  // The exit of a call whose entry the interceptor saw is always reported to it too.
  const bool from_entry = it != threads_.end() && it->second.at_syscall == SyscallAt::kEntry;
  const bool trace = syscall_stops_ || (from_entry && interceptor_ != nullptr);
  if (::ptrace(trace ? PTRACE_SYSCALL : PTRACE_CONT, tid, nullptr, sig) != 0) {
    const int err = errno;
    if (err == ESRCH) {
      return absl::OkStatus();  // died meanwhile; its exit status follows
    }
    return SyscallError(
        err, absl::StrCat("ptrace(", trace ? "PTRACE_SYSCALL" : "PTRACE_CONT", ", ", tid, ")"));
  }
  if (it != threads_.end()) {
    it->second.state = ThreadState::kRunning;
    it->second.in_syscall = trace && from_entry;
    it->second.at_syscall = SyscallAt::kNone;
    it->second.syscall_unseen = false;
  }
  return absl::OkStatus();
}

absl::StatusOr<pid_t> Process::NextStatus(int& status, bool nohang) {
  if (!stashed_.empty()) {
    const auto [tid, st] = stashed_.front();
    stashed_.pop_front();
    status = st;
    return tid;
  }
  for (;;) {
    const pid_t tid = ::waitpid(-1, &status, __WALL | (nohang ? WNOHANG : 0));
    if (tid >= 0) {
      return tid;
    }
    const int err = errno;
    if (err != EINTR) {
      return SyscallError(err, "waitpid");
    }
  }
}

bool Process::Adopt(pid_t tid, int status) {
  if (threads_.contains(tid) || tid == pid_) {
    return true;
  }
  if (group_ != nullptr) {
    // Another member's stop or exit: handed to it.
    for (Process* p : group_->members_) {
      if (p != this && (p->threads_.contains(tid) || p->pid_ == tid)) {
        p->stashed_.emplace_back(tid, status);
        return false;
      }
    }
  }
  if (!WIFSTOPPED(status)) {
    return false;  // the end of something that was never ours (or a detached fork child)
  }
  const std::string tgid = ProcStatusField(tid, "Tgid");
  if (tgid == absl::StrCat(pid_)) {
    threads_[tid] = Thread{};  // a new thread whose clone event comes later
    threads_[tid].fresh = true;
    return true;
  }
  if (group_ != nullptr) {
    if (Process* owner = group_->Owner(tid); owner != nullptr && owner != this) {
      owner->stashed_.emplace_back(tid, status);
      return false;
    }
    group_->foreign_stops_.insert(tid);
    return false;
  }
  foreign_stops_.insert(tid);  // a forked child's first stop, before its parent's fork event
  return false;
}

absl::StatusOr<pid_t> Process::HandleFork(pid_t parent) {
  unsigned long child_pid = 0;
  ::ptrace(PTRACE_GETEVENTMSG, parent, nullptr, &child_pid);
  const auto child = static_cast<pid_t>(child_pid);
  if (child <= 0) {
    return 0;
  }
  // The child starts traced (PTRACE_O_TRACEFORK) and stopped; wait for that stop unless a
  // waitpid(-1) already saw it.
  const bool seen =
      group_ != nullptr ? group_->foreign_stops_.erase(child) > 0 : foreign_stops_.erase(child) > 0;
  if (!seen) {
    for (;;) {
      int status = 0;
      const pid_t r = ::waitpid(child, &status, __WALL);
      if (r < 0 && errno == EINTR) {
        continue;
      }
      if (r < 0 || !WIFSTOPPED(status)) {
        return 0;  // gone already
      }
      break;
    }
  }
  if (group_ != nullptr && group_->follow_forks()) {
    // Followed: a member, stopped, kwatch's changes in place until its owner takes it. It
    // inherited the tracing options (PTRACE_O_EXITKILL included).
    auto proc = std::unique_ptr<Process>(new Process(child, /*launched=*/false, argv_));
    proc->threads_[child].state = ThreadState::kStopped;
    proc->syscall_stops_ = false;
    if (interceptor_ != nullptr) {
      interceptor_->OnFollowedFork(*proc, parent);
    }
    group_->Add(*proc);
    group_->children_[child] = std::move(proc);
    ++group_->followed_;
    ++followed_forks_;
    return child;
  }
  // kwatch does not follow forks: undo in the child what kwatch changed in the parent's
  // image (protected pages...), then let it go.
  auto proc = std::unique_ptr<Process>(new Process(child, /*launched=*/false, argv_));
  proc->threads_[child].state = ThreadState::kStopped;
  absl::Status cleaned = absl::OkStatus();
  if (interceptor_ != nullptr) {
    cleaned = interceptor_->OnFork(*proc);
  }
  if (::ptrace(PTRACE_DETACH, child, nullptr, 0) != 0 && errno != ESRCH) {
    const int err = errno;
    return SyscallError(err, absl::StrCat("ptrace(PTRACE_DETACH, forked child ", child, ")"));
  }
  proc->detached_ = true;
  ++forks_;
  if (!cleaned.ok()) {
    return absl::Status(cleaned.code(),
                        absl::StrCat("cleaning up forked child ", child, ": ", cleaned.message()));
  }
  return 0;
}

absl::Status Process::HandleStatus(pid_t tid, int status, std::vector<ProcessEvent>& events) {
  if (WIFEXITED(status) || WIFSIGNALED(status)) {
    threads_.erase(tid);
    if (tid == pid_) {
      exit_ = ExitFromStatus(status);
      threads_.clear();
      events.push_back({ProcessEvent::Kind::kExited, tid, exit_->signal});
    } else {
      events.push_back({ProcessEvent::Kind::kThreadExited, tid, 0});
    }
    return absl::OkStatus();
  }
  if (!WIFSTOPPED(status)) {
    return absl::OkStatus();
  }
  Thread& thread = threads_[tid];
  thread.in_syscall = false;
  thread.at_syscall = SyscallAt::kNone;
  if (thread.fresh) {
    thread.fresh = false;
    if (interceptor_ != nullptr) {
      KW_RETURN_IF_ERROR(interceptor_->OnThreadStart(tid));
    }
  }
  const int event = status >> 16;
  const int sig = WSTOPSIG(status);
  if (event == 0 && sig == kSyscallTrap) {
    return HandleSyscallStop(tid);
  }
  switch (event) {
    case PTRACE_EVENT_CLONE: {
      unsigned long new_tid = 0;
      ::ptrace(PTRACE_GETEVENTMSG, tid, nullptr, &new_tid);
      if (new_tid != 0 && !threads_.contains(static_cast<pid_t>(new_tid))) {
        threads_[static_cast<pid_t>(new_tid)] = Thread{};  // may rehash: `thread` is stale
        threads_[static_cast<pid_t>(new_tid)].fresh = true;
      }
      events.push_back({ProcessEvent::Kind::kThreadStarted, static_cast<pid_t>(new_tid), 0});
      if (stopping_all_) {
        Thread& parent = threads_[tid];
        parent.state = ThreadState::kStopped;
        if (parent.interrupt_pending) {
          return absl::OkStatus();
        }
      }
      return Cont(tid, 0);
    }
    case PTRACE_EVENT_FORK: {
      KW_ASSIGN_OR_RETURN(const pid_t followed, HandleFork(tid));
      events.push_back({ProcessEvent::Kind::kForked, tid, 0, followed});
      if (stopping_all_ || handling_claimed_) {
        threads_[tid].state = ThreadState::kStopped;
        return absl::OkStatus();
      }
      return Cont(tid, 0);
    }
    case PTRACE_EVENT_EXEC: {
      // Every other thread is gone; the exec'ing thread now has the leader's tid.
      threads_.clear();
      threads_[pid_].state = ThreadState::kStopped;
      mem_fd_.Reset();  // the new image has a new address space
      events.push_back({ProcessEvent::Kind::kExec, pid_, 0});
      return absl::OkStatus();
    }
    case PTRACE_EVENT_STOP: {
      if (IsStopSignal(sig)) {
        // Group stop: keep the target stopped as job control asked, but keep hearing of it.
        const bool first = thread.state != ThreadState::kGroupStopped;
        thread.state = ThreadState::kGroupStopped;
        thread.interrupt_pending = false;
        if (first && tid == pid_) {
          events.push_back({ProcessEvent::Kind::kGroupStop, tid, sig});
        }
        if (::ptrace(PTRACE_LISTEN, tid, nullptr, 0) != 0 && errno != ESRCH) {
          const int err = errno;
          return SyscallError(err, "ptrace(PTRACE_LISTEN)");
        }
        if (stopping_all_) {
          return absl::OkStatus();
        }
        return absl::OkStatus();
      }
      // A new thread's first stop, or kwatch's own PTRACE_INTERRUPT.
      thread.interrupt_pending = false;
      if (stopping_all_) {
        thread.state = ThreadState::kStopped;
        return absl::OkStatus();
      }
      return Cont(tid, 0);
    }
    case 0: {
      if (interceptor_ != nullptr) {
        siginfo_t si{};
        if (::ptrace(PTRACE_GETSIGINFO, tid, nullptr, &si) == 0 && interceptor_->Claims(tid, si)) {
          thread.state = ThreadState::kStopped;
          if (!stopping_all_ && !handling_claimed_) {
            KW_ASSIGN_OR_RETURN(const bool done, interceptor_->HandleInPlace(tid, si));
            if (done) {
              return Cont(tid, 0);
            }
          }
          threads_[tid].claimed = si;
          if (stopping_all_ || handling_claimed_) {
            return absl::OkStatus();  // handled once the world is stopped
          }
          return HandleClaimed();
        }
      }
      if (sig == SIGTRAP) {
        siginfo_t si{};
        if (::ptrace(PTRACE_GETSIGINFO, tid, nullptr, &si) == 0 && SpuriousTrap(tid, si)) {
          if (si.si_code != kTrapPerf) {  // else a late trap of a breakpoint kwatch closed
            ++spurious_traps_;
          }
          if (stopping_all_ || handling_claimed_) {
            thread.state = ThreadState::kStopped;
            return absl::OkStatus();
          }
          return Cont(tid, 0);  // absorbed: it would kill a target without a handler
        }
      }
      // Signal-delivery stop: the target's own signal, passed on unchanged.
      if (Debug()) {
        siginfo_t si{};
        ::ptrace(PTRACE_GETSIGINFO, tid, nullptr, &si);
        std::fprintf(stderr, "kwatch-debug: tid %d signal %d code %d addr %p (not claimed)\n", tid,
                     sig, si.si_code, si.si_addr);
      }
      events.push_back({ProcessEvent::Kind::kSignal, tid, sig});
      if (stopping_all_ || handling_claimed_) {
        thread.state = ThreadState::kStopped;
        thread.pending_signal = sig;
        return absl::OkStatus();
      }
      return Cont(tid, sig);
    }
    default:
      return Cont(tid, 0);
  }
}

bool Process::SpuriousTrap(pid_t tid, const siginfo_t& si) const {
  TrapEvidence e;
  e.si_code = si.si_code;
  if (e.si_code == kTrapPerf) {
    e.perf_data = SiPerfData(si);
  }
  if (e.si_code != TRAP_BRKPT) {
    return !DeliverTrap(ClassifySigtrap(e));
  }
  // How this host reports an icebp decides which byte is the evidence (checked once, in a
  // child, the first time a breakpoint trap needs it; trap hosts are assumed if it fails).
  const absl::StatusOr<IcebpKind> host = HostIcebpKind();
  const IcebpKind icebp = host.ok() ? *host : IcebpKind::kTrap;
  user_regs_struct regs{};
  if (::ptrace(PTRACE_GETREGS, tid, nullptr, &regs) == 0 && regs.rip > 0) {
    uint8_t byte = 0;
    if (ReadMemory(RemoteAddr{regs.rip - 1}, std::span<uint8_t>(&byte, 1)).ok()) {
      e.byte_before_ip = byte;
    }
    if (icebp == IcebpKind::kFault &&
        ReadMemory(RemoteAddr{regs.rip}, std::span<uint8_t>(&byte, 1)).ok()) {
      e.byte_at_ip = byte;
    }
  }
  if (const absl::StatusOr<uint64_t> dr6 = ReadDebugReg(tid, 6); dr6.ok()) {
    e.dr6 = *dr6;
  }
  const TrapOrigin origin = ClassifySigtrap(e, icebp);
  if (Debug()) {
    const std::string name(TrapOriginName(origin));
    std::fprintf(stderr, "kwatch-debug: tid %d SIGTRAP code %d: %s\n", tid, si.si_code,
                 name.c_str());
  }
  return !DeliverTrap(origin);
}

bool Process::Dying() const {
  if (!alive()) {
    return true;
  }
  auto text = ReadSmallFile(absl::StrCat("/proc/", pid_, "/status"));
  if (!text.ok()) {
    // Reaped or being reaped; any other failure (kwatch out of descriptors: EMFILE) says
    // nothing about the target, and must not hide the error it came with.
    return absl::IsNotFound(text.status());
  }
  constexpr uint64_t kKillBit = uint64_t{1} << (SIGKILL - 1);
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    if (absl::ConsumePrefix(&line, "State:")) {
      line = absl::StripAsciiWhitespace(line);
      if (absl::StartsWith(line, "Z") || absl::StartsWith(line, "X")) {
        return true;
      }
    } else if (absl::ConsumePrefix(&line, "ShdPnd:") || absl::ConsumePrefix(&line, "SigPnd:")) {
      uint64_t mask = 0;
      if (absl::SimpleHexAtoi(absl::StripAsciiWhitespace(line), &mask) && (mask & kKillBit) != 0) {
        return true;
      }
    }
  }
  return false;
}

absl::StatusOr<std::vector<ProcessEvent>> Process::Poll(bool block) {
  std::vector<ProcessEvent> events = std::move(pending_events_);
  pending_events_.clear();
  bool first = events.empty();
  while (alive()) {
    int status = 0;
    pid_t tid = 0;
    if (!stashed_.empty()) {
      std::tie(tid, status) = stashed_.front();  // reaped for us by another member
      stashed_.pop_front();
    } else {
      const int flags = __WALL | ((block && first) ? 0 : WNOHANG);
      tid = ::waitpid(-1, &status, flags);
    }
    first = false;
    if (tid == 0) {
      break;
    }
    if (tid < 0) {
      const int err = errno;
      if (err == EINTR) {
        continue;
      }
      if (err == ECHILD) {
        // Not our child (attached) and no traced thread left: the process is gone.
        if (!exit_.has_value() && ::kill(pid_, 0) != 0) {
          exit_ = ExitInfo{};
          threads_.clear();
          events.push_back({ProcessEvent::Kind::kExited, pid_, 0});
        }
        break;
      }
      return SyscallError(err, "waitpid");
    }
    if (!Adopt(tid, status)) {
      continue;
    }
    if (absl::Status s = HandleStatus(tid, status, events); !s.ok()) {
      if (!Dying()) {
        return s;
      }
      // Killed while kwatch worked on one of its stops: the remaining exits follow.
      if (Debug()) {
        const std::string why(s.message());
        std::fprintf(stderr, "kwatch-debug: pid %d dying: %s\n", pid_, why.c_str());
      }
    }
  }
  return events;
}

absl::Status Process::StopAll() {
  return StopThreads(/*user_code_only=*/false);
}

absl::Status Process::StopUserCode() {
  return StopThreads(/*user_code_only=*/true);
}

absl::Status Process::StopThreads(bool user_code_only) {
  if (!alive()) {
    return absl::OkStatus();
  }
  const bool was = stopping_all_;
  stopping_all_ = true;
  absl::Cleanup done = [this, was] { stopping_all_ = was; };
  // A thread inside a call that stops at its exit runs no user code meanwhile.
  const auto must_stop = [user_code_only](const Thread& t) {
    return t.state == ThreadState::kRunning && !(user_code_only && t.in_syscall);
  };
  for (auto& [tid, thread] : threads_) {
    thread.interrupt_pending = false;
    if (must_stop(thread)) {
      if (::ptrace(PTRACE_INTERRUPT, tid, nullptr, nullptr) == 0) {
        thread.interrupt_pending = true;
      }
    }
  }
  std::vector<ProcessEvent>& events = pending_events_;
  int idle_polls = 0;
  for (;;) {
    bool all_stopped = true;
    for (auto& [tid, thread] : threads_) {
      if (must_stop(thread)) {
        all_stopped = false;
        // An earlier interrupt may have been absorbed by another stop: ask again (an extra
        // interrupt stop later is simply resumed).
        if (!thread.interrupt_pending && ::ptrace(PTRACE_INTERRUPT, tid, nullptr, nullptr) == 0) {
          thread.interrupt_pending = true;
        }
      }
    }
    if (all_stopped || !alive()) {
      break;
    }
    int status = 0;
    KW_ASSIGN_OR_RETURN(const pid_t tid, NextStatus(status, /*nohang=*/true));
    if (tid == 0) {
      // Nothing to wait for yet. A wait status can be lost to this process when another
      // tracee of the same tracer collected it first (a group member's waitpid(-1) that saw a
      // thread's exit before its clone event made it ours): every so often, ask the kernel
      // what became of the threads still awaited, instead of waiting forever.
      if (++idle_polls % 20 == 0) {
        RecoverMissedStops(must_stop);
      }
      ::usleep(500);
      continue;
    }
    idle_polls = 0;
    if (!Adopt(tid, status)) {
      continue;
    }
    KW_RETURN_IF_ERROR(HandleStatus(tid, status, events));
  }
  return absl::OkStatus();
}

void Process::RecoverMissedStops(const std::function<bool(const Thread&)>& awaited) {
  for (auto it = threads_.begin(); it != threads_.end();) {
    const pid_t tid = it->first;
    Thread& thread = it->second;
    if (!awaited(thread)) {
      ++it;
      continue;
    }
    // A status that arrived since the last poll is handled the normal way.
    int status = 0;
    if (::waitpid(tid, &status, __WALL | WNOHANG) == tid) {
      stashed_.emplace_back(tid, status);
      ++it;
      continue;
    }
    const char state = TaskStateLetter(pid_, tid);
    if (state == 0) {
      threads_.erase(it++);  // gone: its exit was reaped by another tracee's wait
      continue;
    }
    if (state == 't' || state == 'T') {
      // Stopped, its wait status collected elsewhere. A signal-delivery stop keeps its signal
      // for the next resume; an event or interrupt stop has none to deliver.
      thread.state = ThreadState::kStopped;
      thread.interrupt_pending = false;
      siginfo_t si{};
      if (::ptrace(PTRACE_GETSIGINFO, tid, nullptr, &si) == 0 && si.si_signo != 0) {
        const bool event_stop = si.si_signo == SIGTRAP && (si.si_code & 0xff) == SIGTRAP;
        const bool own_trap =
            si.si_signo == SIGTRAP && si.si_code == kTrapPerf && IsKwatchSigData(SiPerfData(si));
        if (!event_stop && !own_trap && !IsStopSignal(si.si_signo)) {
          thread.pending_signal = si.si_signo;
        }
      }
    } else {
      thread.interrupt_pending = false;  // ask again: the interrupt may have been absorbed
    }
    ++it;
  }
}

absl::Status Process::SetPendingSignal(pid_t tid, int sig) {
  auto it = threads_.find(tid);
  if (it == threads_.end()) {
    return absl::NotFoundError(absl::StrCat("thread ", tid, " of pid ", pid_, " is not traced"));
  }
  it->second.pending_signal = sig;
  return absl::OkStatus();
}

absl::Status Process::ReleaseHold() {
  if (hold_ > 0 && --hold_ == 0) {
    return ResumeAll();
  }
  return absl::OkStatus();
}

absl::Status Process::ResumeAll() {
  if (hold_ > 0) {
    return absl::OkStatus();  // HoldStopped: the holder resumes them
  }
  if (interceptor_ != nullptr) {
    for (auto& [tid, thread] : threads_) {
      if (thread.claimed.has_value()) {
        return HandleClaimed();  // handles them all, then resumes
      }
    }
  }
  KW_RETURN_IF_ERROR(SettleSyscallStops());
  for (auto& [tid, thread] : threads_) {
    if (thread.state == ThreadState::kStopped) {
      KW_RETURN_IF_ERROR(Cont(tid, std::exchange(thread.pending_signal, 0)));
    }
  }
  return absl::OkStatus();
}

absl::Status Process::Intercept(pid_t tid, const siginfo_t& si) {
  KW_ASSIGN_OR_RETURN(const bool done, interceptor_->HandleInPlace(tid, si));
  return done ? absl::OkStatus() : interceptor_->Handle(tid, si);
}

absl::Status Process::HandleClaimed() {
  handling_claimed_ = true;
  absl::Cleanup done = [this] { handling_claimed_ = false; };
  if (threads_.size() > 1) {
    KW_RETURN_IF_ERROR(StopUserCode());
  }
  for (bool again = true; again && alive();) {
    again = false;
    for (auto& [tid, thread] : threads_) {
      if (!thread.claimed.has_value()) {
        continue;
      }
      const siginfo_t si = *thread.claimed;
      thread.claimed.reset();
      if (interceptor_ != nullptr) {
        KW_RETURN_IF_ERROR(Intercept(tid, si));
      } else {
        thread.pending_signal = si.si_signo;
      }
      again = true;
      break;  // Handle() may have changed threads_
    }
  }
  if (!alive()) {
    return absl::OkStatus();
  }
  handling_claimed_ = false;
  if (hold_ > 0) {
    return absl::OkStatus();  // a Handle held the world (HoldStopped): its holder resumes it
  }
  KW_RETURN_IF_ERROR(SettleSyscallStops());
  for (auto& [tid, thread] : threads_) {
    if (thread.state == ThreadState::kStopped) {
      KW_RETURN_IF_ERROR(Cont(tid, std::exchange(thread.pending_signal, 0)));
    }
  }
  return absl::OkStatus();
}

namespace {

// Whether the instruction at `before` made progress: rip moved, or a string instruction's
// registers counted (one iteration of `rep movs` leaves rip where it was).
bool Progressed(const user_regs_struct& before, const user_regs_struct& after) {
  return before.rip != after.rip || before.rcx != after.rcx || before.rsi != after.rsi ||
         before.rdi != after.rdi;
}

}  // namespace

absl::StatusOr<int> Process::SingleStep(pid_t tid) {
  const auto step = [tid]() -> absl::Status {
    if (::ptrace(PTRACE_SINGLESTEP, tid, nullptr, 0) != 0) {
      const int err = errno;
      return SyscallError(err, absl::StrCat("ptrace(PTRACE_SINGLESTEP, ", tid, ")"));
    }
    return absl::OkStatus();
  };
  // Steps started again without the instruction having run: bounded, so that a fault nobody
  // resolves is an error instead of a loop that never reads another stop (or SIGTERM).
  int retries = 0;
  const auto again = [&](absl::string_view why) -> absl::Status {
    if (++retries > kMaxStepRetries) {
      return absl::InternalError(
          absl::StrCat("single-stepping thread ", tid, " of pid ", pid_, ": ", kMaxStepRetries,
                       " attempts stopped before the instruction ran (last: ", why,
                       "); giving up instead of looping (a kwatch bug: please report it)"));
    }
    return step();
  };
  KW_RETURN_IF_ERROR(step());
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
      return 0;
    }
    const int sig = WSTOPSIG(status);
    const int event = status >> 16;
    if (event == 0) {
      // A signal-delivery stop. A signal queued before the step (a fault kwatch caused, or
      // the target's own) is reported before the instruction runs; SIGTRAP is the step.
      siginfo_t si{};
      const bool have_info = ::ptrace(PTRACE_GETSIGINFO, tid, nullptr, &si) == 0;
      if (sig == SIGTRAP && (!have_info || si.si_code == TRAP_TRACE || si.si_code == TRAP_BRKPT ||
                             si.si_code <= 0 || si.si_code == TRAP_HWBKPT)) {
        return SIGTRAP;
      }
      const bool claimed = have_info && interceptor_ != nullptr && interceptor_->Claims(tid, si);
      if (!claimed) {
        threads_[tid].pending_signal = sig;  // the target's own: delivered on resume
        if (Debug()) {
          std::fprintf(stderr, "kwatch-debug: tid %d signal %d code %d addr %p during a step\n",
                       tid, sig, si.si_code, si.si_addr);
        }
        KW_RETURN_IF_ERROR(again("a signal of the target's, set aside"));
        continue;
      }
      if (sig == SIGSEGV && !faulting_steps_.contains(tid)) {
        // kwatch's page protection stopped the stepped instruction (a debugger's step, or an
        // interceptor's own step that touched another protected page). Stepped again, it
        // would fault again: the interceptor that claims the fault runs the instruction
        // (emulated, or stepped with its page open, counting the access), and that was the
        // step. Not for threads in faulting_steps_: the interceptor's own step inside, and a
        // system call kwatch runs in the thread (RemoteSyscall: the fault is older than the
        // `syscall` patched at rip, and comes back when the thread runs its instruction).
        KW_ASSIGN_OR_RETURN(const user_regs_struct before, GetRegs(tid));
        faulting_steps_.insert(tid);
        const bool was_handling = std::exchange(handling_claimed_, true);
        absl::Status s;
        {
          absl::Cleanup restore = [&] {
            faulting_steps_.erase(tid);
            handling_claimed_ = was_handling;
          };
          s = Intercept(tid, si);
        }
        KW_RETURN_IF_ERROR(s);
        if (!alive() || !threads_.contains(tid)) {
          return 0;
        }
        KW_ASSIGN_OR_RETURN(const user_regs_struct after, GetRegs(tid));
        if (Progressed(before, after)) {
          return SIGTRAP;
        }
        // Dropped (a late fault of a page just unprotected): the instruction runs now.
        KW_RETURN_IF_ERROR(again("a fault of kwatch's page protection, dropped"));
        continue;
      }
      // Claimed ones are dropped: the access that raised them runs again later.
      KW_RETURN_IF_ERROR(again(absl::StrCat("signal ", sig, " code ", si.si_code, " at 0x",
                                            absl::Hex(reinterpret_cast<uint64_t>(si.si_addr)),
                                            ", claimed by kwatch")));
      continue;
    }
    if (event == PTRACE_EVENT_STOP && !IsStopSignal(sig)) {
      // An earlier PTRACE_INTERRUPT landed before the step: the step has not run yet.
      threads_[tid].interrupt_pending = false;
      KW_RETURN_IF_ERROR(again("an interrupt stop"));
      continue;
    }
    // A ptrace event (clone, exec, group stop) at the stepped instruction: recorded as
    // usual, and the thread stays stopped.
    const bool was = stopping_all_;
    stopping_all_ = true;
    const absl::Status s = HandleStatus(tid, status, pending_events_);
    stopping_all_ = was;
    KW_RETURN_IF_ERROR(s);
    return SIGTRAP;
  }
}

pid_t Process::AnyStoppedThread() const {
  if (auto it = threads_.find(pid_);
      it != threads_.end() && it->second.state == ThreadState::kStopped) {
    return pid_;
  }
  for (const auto& [tid, thread] : threads_) {
    if (thread.state == ThreadState::kStopped) {
      return tid;
    }
  }
  return 0;
}

absl::Status Process::Resume(pid_t tid) {
  return Cont(tid, 0);
}

void Process::AddInterceptor(SignalInterceptor* interceptor) {
  if (std::find(interceptors_.begin(), interceptors_.end(), interceptor) == interceptors_.end()) {
    interceptors_.push_back(interceptor);
  }
  interceptor_ = interceptors_.size() == 1 ? interceptors_.front() : &fan_out_;
}

void Process::RemoveInterceptor(SignalInterceptor* interceptor) {
  std::erase(interceptors_, interceptor);
  interceptor_ = interceptors_.empty()       ? nullptr
                 : interceptors_.size() == 1 ? interceptors_.front()
                                             : &fan_out_;
}

}  // namespace kwatch::core::ptrace
