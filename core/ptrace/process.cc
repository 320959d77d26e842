#include "core/ptrace/process.h"

#include <dirent.h>
#include <elf.h>
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <sys/ptrace.h>
#include <sys/uio.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <tuple>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "core/base/status_macros.h"
#include "core/base/syscall_status.h"
#include "core/base/unique_fd.h"
#include "core/ptrace/trap_origin.h"

namespace kwatch::core {

namespace {

// KWATCH_DEBUG=1 traces signal decisions on stderr.
bool Debug() {
  static const bool on = [] {
    const char* v = std::getenv("KWATCH_DEBUG");  // NOLINT(concurrency-mt-unsafe): read once
    return v != nullptr && v[0] == '1';
  }();
  return on;
}

// TRACESYSGOOD marks syscall stops (SIGTRAP | 0x80); they only happen while kwatch asks.
constexpr long kTraceOptions =
    PTRACE_O_TRACECLONE | PTRACE_O_TRACEEXEC | PTRACE_O_TRACEFORK | PTRACE_O_TRACESYSGOOD;
constexpr int kSyscallTrap = SIGTRAP | 0x80;

bool IsStopSignal(int sig) {
  return sig == SIGSTOP || sig == SIGTSTP || sig == SIGTTIN || sig == SIGTTOU;
}

ExitInfo ExitFromStatus(int status) {
  ExitInfo info;
  if (WIFSIGNALED(status)) {
    info.signaled = true;
    info.signal = WTERMSIG(status);
    info.core_dumped = WCOREDUMP(status);
  } else {
    info.code = WEXITSTATUS(status);
  }
  return info;
}

std::string ProgramName(const std::vector<std::string>& argv) {
  return argv.empty() ? std::string("(none)") : argv[0];
}

absl::StatusOr<uint64_t> ReadAuxvEntry(pid_t pid, uint64_t type) {
  KW_ASSIGN_OR_RETURN(const std::string auxv, ReadSmallFile(absl::StrCat("/proc/", pid, "/auxv")));
  for (size_t off = 0; off + 16 <= auxv.size(); off += 16) {
    uint64_t key = 0;
    uint64_t val = 0;
    std::memcpy(&key, auxv.data() + off, 8);
    std::memcpy(&val, auxv.data() + off + 8, 8);
    if (key == type) {
      return val;
    }
    if (key == AT_NULL) {
      break;
    }
  }
  return absl::NotFoundError(absl::StrCat("auxv entry ", type, " not found for pid ", pid));
}

// Advice for a ptrace EPERM on `pid`.
std::string PtraceDeniedAdvice(pid_t pid) {
  const std::string tracer = ProcStatusField(pid, "TracerPid");
  if (!tracer.empty() && tracer != "0") {
    int tracer_pid = 0;
    (void)absl::SimpleAtoi(tracer, &tracer_pid);
    return absl::StrCat("process ", pid, " is already traced by pid ", tracer, " (",
                        ProcStatusField(tracer_pid, "Name"),
                        "); detach that debugger or tracer first");
  }
  if (::geteuid() == 0) {
    return absl::StrCat("even root may not trace pid ", pid, " here (",
                        ProcStatusField(pid, "Name"),
                        "): init, kernel threads and processes protected by a security module "
                        "(lockdown, SELinux, AppArmor) cannot be traced");
  }
  auto scope = ReadSmallFile("/proc/sys/kernel/yama/ptrace_scope");
  std::string advice = "tracing another process needs root or CAP_SYS_PTRACE";
  if (scope.ok() && !absl::StripAsciiWhitespace(*scope).empty() &&
      absl::StripAsciiWhitespace(*scope) != "0") {
    absl::StrAppend(&advice, ", and Yama's kernel.yama.ptrace_scope is ",
                    absl::StripAsciiWhitespace(*scope),
                    " (`sysctl kernel.yama.ptrace_scope=0` allows tracing non-children)");
  }
  return advice;
}

}  // namespace

std::string ProcStatusField(pid_t pid, const std::string& name) {
  auto text = ReadSmallFile(absl::StrCat("/proc/", pid, "/status"));
  if (!text.ok()) {
    return "";
  }
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    if (absl::ConsumePrefix(&line, name) && absl::ConsumePrefix(&line, ":")) {
      return std::string(absl::StripAsciiWhitespace(line));
    }
  }
  return "";
}

absl::StatusOr<RunAs> ResolveUser(const std::string& user) {
  long size = ::sysconf(_SC_GETPW_R_SIZE_MAX);
  std::vector<char> buf(size > 0 ? static_cast<size_t>(size) : 16384);
  passwd pw{};
  passwd* found = nullptr;
  int rc = ::getpwnam_r(user.c_str(), &pw, buf.data(), buf.size(), &found);
  uid_t numeric = 0;
  if (found == nullptr && absl::SimpleAtoi(user, &numeric)) {
    rc = ::getpwuid_r(numeric, &pw, buf.data(), buf.size(), &found);
  }
  if (found == nullptr) {
    if (rc != 0) {
      return SyscallError(rc, absl::StrCat("getpwnam_r(", user, ")"));
    }
    return absl::NotFoundError(
        absl::StrCat("-u ", user, ": no such user (`getent passwd` lists them)"));
  }
  RunAs as;
  as.name = pw.pw_name;
  as.uid = pw.pw_uid;
  as.gid = pw.pw_gid;
  int n = 64;
  for (int tries = 0; tries < 4; ++tries) {
    as.groups.resize(static_cast<size_t>(n));
    int got = n;
    if (::getgrouplist(pw.pw_name, pw.pw_gid, as.groups.data(), &got) >= 0) {
      as.groups.resize(static_cast<size_t>(got));
      break;
    }
    n = got > n ? got : n * 4;
  }
  if (::geteuid() != 0) {
    return absl::PermissionDeniedError(absl::StrCat(
        "-u ", user, ": running the command as another user needs root (kwatch switches to ",
        as.name, " before exec: CAP_SETUID and CAP_SETGID)"));
  }
  return as;
}

absl::StatusOr<std::unique_ptr<Process>> Process::Launch(const std::vector<std::string>& argv,
                                                         const LaunchOptions& opts) {
  if (argv.empty()) {
    return absl::InvalidArgumentError("no command given to launch");
  }
  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC) != 0) {
    const int err = errno;
    return SyscallError(err, "pipe2");
  }
  UniqueFd read_end(pipefd[0]);
  UniqueFd write_end(pipefd[1]);
  std::vector<char*> args;
  args.reserve(argv.size() + 1);
  for (const auto& a : argv) {
    args.push_back(const_cast<char*>(a.c_str()));  // NOLINT(cppcoreguidelines-pro-type-const-cast)
  }
  args.push_back(nullptr);

  const pid_t pid = ::fork();
  if (pid < 0) {
    const int err = errno;
    return SyscallError(err, "fork");
  }
  if (pid == 0) {
    // Child: only async-signal-safe calls from here on.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGPIPE, SIGCHLD}) {
      signal(sig, SIG_DFL);
    }
    if (opts.run_as.has_value()) {
      const RunAs& as = *opts.run_as;
      if (::setgroups(as.groups.size(), as.groups.data()) != 0 || ::setgid(as.gid) != 0 ||
          ::setuid(as.uid) != 0) {
        int err = errno;
        (void)!write(write_end.get(), &err, sizeof(err));
        _exit(127);
      }
    }
    raise(SIGSTOP);
    execvp(args[0], args.data());
    int err = errno;
    (void)!write(write_end.get(), &err, sizeof(err));
    _exit(127);
  }
  write_end.Reset();
  auto proc = std::unique_ptr<Process>(new Process(pid, /*launched=*/true, argv));

  int status = 0;
  if (::waitpid(pid, &status, WUNTRACED) != pid || !WIFSTOPPED(status)) {
    int err = 0;
    if (opts.run_as.has_value() && ::read(read_end.get(), &err, sizeof(err)) == sizeof(err)) {
      return SyscallError(err, absl::StrCat("switching the command to user ", opts.run_as->name,
                                            " (setgroups, setgid, setuid)"));
    }
    return absl::InternalError(absl::StrCat("child ", pid, " did not stop before exec"));
  }
  long options = kTraceOptions;
  if (opts.kill_on_exit) {
    options |= PTRACE_O_EXITKILL;
  }
  if (::ptrace(PTRACE_SEIZE, pid, nullptr, options) != 0) {
    const int err = errno;
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    return SyscallError(err, absl::StrCat("ptrace(PTRACE_SEIZE, ", pid, ")"),
                        PtraceDeniedAdvice(pid));
  }
  proc->threads_[pid] = Thread{};
  ::kill(pid, SIGCONT);
  for (;;) {
    if (::waitpid(pid, &status, __WALL) != pid) {
      const int err = errno;
      if (err == EINTR) {
        continue;
      }
      return SyscallError(err, "waitpid");
    }
    if (WIFEXITED(status) || WIFSIGNALED(status)) {
      proc->threads_.clear();
      proc->exit_ = ExitFromStatus(status);
      proc->detached_ = true;
      int exec_err = 0;
      if (::read(read_end.get(), &exec_err, sizeof(exec_err)) == sizeof(exec_err)) {
        const std::string what = absl::StrCat("cannot execute '", argv[0], "'");
        if (exec_err == ENOENT) {
          return absl::NotFoundError(absl::StrCat(what, ": no such file or not found in PATH (",
                                                  ErrnoText(exec_err), ")"));
        }
        if (exec_err == EACCES) {
          return absl::PermissionDeniedError(absl::StrCat(
              what, ": ", ErrnoText(exec_err), " (is it executable? chmod +x, or a noexec mount)"));
        }
        return SyscallError(exec_err, absl::StrCat("execvp(", argv[0], ")"));
      }
      return absl::AbortedError(absl::StrCat("'", argv[0], "' ended before exec"));
    }
    const int event = status >> 16;
    const int sig = WSTOPSIG(status);
    if (event == PTRACE_EVENT_EXEC) {
      proc->threads_[pid].state = ThreadState::kStopped;
      return proc;
    }
    const int inject = (event != 0 || sig == SIGCONT || sig == SIGSTOP) ? 0 : sig;
    if (::ptrace(PTRACE_CONT, pid, nullptr, inject) != 0) {
      const int err = errno;
      return SyscallError(err, "ptrace(PTRACE_CONT)");
    }
  }
}

absl::Status Process::SeizeThread(pid_t tid) {
  if (threads_.contains(tid)) {
    return absl::OkStatus();
  }
  if (::ptrace(PTRACE_SEIZE, tid, nullptr, kTraceOptions) != 0) {
    const int err = errno;
    if (err == EPERM && ProcStatusField(tid, "TracerPid") == absl::StrCat(::getpid())) {
      threads_[tid] = Thread{};  // auto-attached through PTRACE_O_TRACECLONE
      return absl::OkStatus();
    }
    if (err == ESRCH && tid != pid_) {
      return absl::OkStatus();  // thread exited meanwhile
    }
    if (err == ESRCH) {
      return absl::NotFoundError(absl::StrCat("no process with pid ", tid));
    }
    return SyscallError(err, absl::StrCat("ptrace(PTRACE_SEIZE, ", tid, ")"),
                        err == EPERM ? PtraceDeniedAdvice(pid_) : "");
  }
  threads_[tid] = Thread{};
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Process>> Process::Start(std::optional<pid_t> pid,
                                                        const std::vector<std::string>& argv,
                                                        const LaunchOptions& opts) {
  if (pid.has_value()) {
    return Attach(*pid);
  }
  KW_ASSIGN_OR_RETURN(std::unique_ptr<Process> proc, Launch(argv, opts));
  if (absl::Status s = proc->RunToEntry(); !s.ok()) {
    (void)proc->Kill();
    return s;
  }
  return proc;
}

absl::StatusOr<std::unique_ptr<Process>> Process::Attach(pid_t pid) {
  if (pid <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("invalid pid ", pid));
  }
  if (pid == ::getpid()) {
    return absl::InvalidArgumentError("kwatch cannot attach to itself");
  }
  std::string cmdline;
  if (auto c = ReadSmallFile(absl::StrCat("/proc/", pid, "/cmdline")); c.ok()) {
    cmdline = std::string(absl::StripTrailingAsciiWhitespace(*c));
  } else {
    return absl::NotFoundError(absl::StrCat("no process with pid ", pid));
  }
  std::vector<std::string> argv = absl::StrSplit(cmdline, '\0', absl::SkipEmpty());
  if (ProcStatusField(pid, "Tgid") != absl::StrCat(pid)) {
    return absl::InvalidArgumentError(absl::StrCat(
        pid, " is a thread of process ", ProcStatusField(pid, "Tgid"), "; attach to the process"));
  }
  auto proc = std::unique_ptr<Process>(new Process(pid, /*launched=*/false, std::move(argv)));
  KW_RETURN_IF_ERROR(proc->SeizeThread(pid));
  // Threads created by seized threads are auto-attached; repeat until no untraced thread
  // remains (threads created by not-yet-seized threads show up in the next pass).
  for (int pass = 0; pass < 100; ++pass) {
    KW_ASSIGN_OR_RETURN(const std::vector<pid_t> tids, proc->ListThreads());
    bool added = false;
    for (pid_t tid : tids) {
      if (!proc->threads_.contains(tid)) {
        KW_RETURN_IF_ERROR(proc->SeizeThread(tid));
        added = true;
      }
    }
    if (!added) {
      return proc;
    }
  }
  return absl::UnavailableError(
      absl::StrCat("process ", pid, " creates threads faster than kwatch can attach"));
}

Process::~Process() {
  if (!detached_ && alive()) {
    (void)Detach();
  }
  if (group_ != nullptr) {
    group_->Remove(*this);
  }
}

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
  errno = 0;
  const long dr6 = ::ptrace(
      PTRACE_PEEKUSER, tid,
      reinterpret_cast<void*>(offsetof(struct user, u_debugreg) + 6 * sizeof(long)), nullptr);
  if (errno == 0) {
    e.dr6 = static_cast<uint64_t>(dr6);
  }
  const TrapOrigin origin = ClassifySigtrap(e, icebp);
  if (Debug()) {
    std::fprintf(stderr, "kwatch-debug: tid %d SIGTRAP code %d: %s\n", tid, si.si_code,
                 std::string(TrapOriginName(origin)).c_str());
  }
  return !DeliverTrap(origin);
}

bool Process::Dying() const {
  if (!alive()) {
    return true;
  }
  auto text = ReadSmallFile(absl::StrCat("/proc/", pid_, "/status"));
  if (!text.ok()) {
    return true;  // reaped or being reaped
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
        std::fprintf(stderr, "kwatch-debug: pid %d dying: %s\n", pid_,
                     std::string(s.message()).c_str());
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
        KW_ASSIGN_OR_RETURN(const bool done, interceptor_->HandleInPlace(tid, si));
        if (!done) {
          KW_RETURN_IF_ERROR(interceptor_->Handle(tid, si));
        }
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
  KW_RETURN_IF_ERROR(SettleSyscallStops());
  for (auto& [tid, thread] : threads_) {
    if (thread.state == ThreadState::kStopped) {
      KW_RETURN_IF_ERROR(Cont(tid, std::exchange(thread.pending_signal, 0)));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int> Process::SingleStep(pid_t tid) {
  const auto step = [tid]() -> absl::Status {
    if (::ptrace(PTRACE_SINGLESTEP, tid, nullptr, 0) != 0) {
      const int err = errno;
      return SyscallError(err, absl::StrCat("ptrace(PTRACE_SINGLESTEP, ", tid, ")"));
    }
    return absl::OkStatus();
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
      if (!(have_info && interceptor_ != nullptr && interceptor_->Claims(tid, si))) {
        threads_[tid].pending_signal = sig;  // the target's own: delivered on resume
        if (Debug()) {
          std::fprintf(stderr, "kwatch-debug: tid %d signal %d code %d addr %p during a step\n",
                       tid, sig, si.si_code, si.si_addr);
        }
      }
      // Claimed ones are dropped: the access that raised them runs again later.
      KW_RETURN_IF_ERROR(step());
      continue;
    }
    if (event == PTRACE_EVENT_STOP && !IsStopSignal(sig)) {
      // An earlier PTRACE_INTERRUPT landed before the step: the step has not run yet.
      threads_[tid].interrupt_pending = false;
      KW_RETURN_IF_ERROR(step());
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

absl::Status Process::RunToEntry() {
  KW_ASSIGN_OR_RETURN(const uint64_t entry, ReadAuxvEntry(pid_, AT_ENTRY));
  errno = 0;
  const long word = ::ptrace(PTRACE_PEEKDATA, pid_, entry, nullptr);
  if (errno != 0) {
    const int err = errno;
    return SyscallError(err, "ptrace(PTRACE_PEEKDATA, entry)");
  }
  const long patched = (word & ~0xffL) | 0xcc;
  if (::ptrace(PTRACE_POKEDATA, pid_, entry, patched) != 0) {
    const int err = errno;
    return SyscallError(err, "ptrace(PTRACE_POKEDATA, entry)");
  }
  bool restored = false;
  auto restore = [&]() -> absl::Status {
    if (restored || !alive()) {
      return absl::OkStatus();
    }
    restored = true;
    if (::ptrace(PTRACE_POKEDATA, pid_, entry, word) != 0) {
      const int err = errno;
      return SyscallError(err, "ptrace(PTRACE_POKEDATA, restore entry)");
    }
    return absl::OkStatus();
  };
  KW_RETURN_IF_ERROR(Cont(pid_, 0));
  std::vector<ProcessEvent>& events = pending_events_;
  while (alive()) {
    int status = 0;
    KW_ASSIGN_OR_RETURN(const pid_t tid, NextStatus(status, /*nohang=*/false));
    if (tid == pid_ && WIFSTOPPED(status) && (status >> 16) == 0 && WSTOPSIG(status) == SIGTRAP) {
      KW_ASSIGN_OR_RETURN(user_regs_struct regs, GetRegs(pid_));
      if (regs.rip == entry + 1) {
        KW_RETURN_IF_ERROR(restore());
        regs.rip = entry;
        KW_RETURN_IF_ERROR(SetRegs(pid_, regs));
        threads_[pid_].state = ThreadState::kStopped;
        return absl::OkStatus();
      }
    }
    if (!Adopt(tid, status)) {
      continue;
    }
    KW_RETURN_IF_ERROR(HandleStatus(tid, status, events));
  }
  return absl::AbortedError(absl::StrCat("'", ProgramName(argv_),
                                         "' ended before reaching its entry point (status ",
                                         exit_->ShellStatus(), ")"));
}

absl::Status Process::Detach() {
  if (detached_ || !alive()) {
    detached_ = true;
    return absl::OkStatus();
  }
  syscall_stops_ = false;
  KW_RETURN_IF_ERROR(StopAll());
  // Calls whose stops the interceptor has not seen yet: it may have to undo what it did to
  // them (a redirected buffer) before kwatch lets go. Seeing them may resume a thread.
  for (int round = 0; round < 16; ++round) {
    bool unseen = false;
    for (const auto& [tid, thread] : threads_) {
      unseen = unseen || thread.syscall_unseen;
    }
    if (!unseen) {
      break;
    }
    KW_RETURN_IF_ERROR(SettleSyscallStops());
    KW_RETURN_IF_ERROR(StopAll());
  }
  KW_RETURN_IF_ERROR(FlushClaimedSignals());
  for (auto& [tid, thread] : threads_) {
    const int sig = std::exchange(thread.pending_signal, 0);
    if (::ptrace(PTRACE_DETACH, tid, nullptr, sig) != 0) {
      const int err = errno;
      if (err != ESRCH) {
        return SyscallError(err, absl::StrCat("ptrace(PTRACE_DETACH, ", tid, ")"));
      }
    }
  }
  threads_.clear();
  detached_ = true;
  return absl::OkStatus();
}

absl::Status Process::FlushClaimedSignals() {
  if (interceptor_ == nullptr) {
    return absl::OkStatus();
  }
  for (auto& [tid, thread] : threads_) {
    thread.claimed.reset();  // dropped: the faulting access re-runs after detach
  }
  // A signal kwatch caused may still wait in a thread's queue (raised just before the world
  // stopped): let each such thread take it now, while kwatch can still claim it.
  for (int round = 0; round < 8; ++round) {
    bool any = false;
    for (const pid_t tid : TracedThreads()) {
      const std::string pending = ProcStatusField(tid, "SigPnd");
      uint64_t mask = 0;
      constexpr uint64_t kClaimable = (1ULL << (SIGSEGV - 1)) | (1ULL << (SIGTRAP - 1));
      if (pending.empty() || !absl::SimpleHexAtoi(pending, &mask) || (mask & kClaimable) == 0) {
        continue;
      }
      Thread& thread = threads_[tid];
      if (thread.state != ThreadState::kStopped) {
        continue;
      }
      any = true;
      KW_RETURN_IF_ERROR(Cont(tid, std::exchange(thread.pending_signal, 0)));
      // The queued fault signal is taken on the way back to user space. Interrupt only if it
      // has not come within 100 ms (an interrupt sent at once could win the race and leave
      // the signal queued).
      for (int waited_ms = 0;;) {
        int status = 0;
        const pid_t r = ::waitpid(tid, &status, __WALL | WNOHANG);
        if (r == 0) {
          if (++waited_ms == 100 && ::ptrace(PTRACE_INTERRUPT, tid, nullptr, nullptr) == 0) {
            threads_[tid].interrupt_pending = true;
          }
          ::usleep(1000);
          continue;
        }
        if (r < 0 && errno == EINTR) {
          continue;
        }
        if (r < 0) {
          break;
        }
        stopping_all_ = true;
        const absl::Status s = HandleStatus(tid, status, pending_events_);
        stopping_all_ = false;
        KW_RETURN_IF_ERROR(s);
        if (!threads_.contains(tid) || threads_[tid].state != ThreadState::kRunning) {
          break;
        }
      }
      if (auto it = threads_.find(tid); it != threads_.end()) {
        it->second.claimed.reset();
      }
    }
    if (!any) {
      break;
    }
  }
  return absl::OkStatus();
}

absl::Status Process::Kill() {
  if (!alive()) {
    return absl::OkStatus();
  }
  if (::kill(pid_, SIGKILL) != 0) {
    const int err = errno;
    if (err != ESRCH) {
      return SyscallError(err, absl::StrCat("kill(", pid_, ", SIGKILL)"));
    }
  }
  while (alive()) {
    auto events = Poll(/*block=*/true);
    if (!events.ok()) {
      return events.status();
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int> Process::MemFd() const {
  if (!mem_fd_) {
    mem_fd_.Reset(::open(absl::StrCat("/proc/", pid_, "/mem").c_str(), O_RDWR | O_CLOEXEC));
    if (!mem_fd_) {
      const int err = errno;
      return SyscallError(err, absl::StrFormat("open(/proc/%d/mem)", pid_),
                          err == ENOENT ? "the target has exited" : "");
    }
  }
  return mem_fd_.get();
}

absl::Status Process::ReadMemory(RemoteAddr addr, std::span<uint8_t> out) const {
  KW_ASSIGN_OR_RETURN(const int fd, MemFd());
  const ssize_t m = ::pread(fd, out.data(), out.size(), static_cast<off_t>(addr.value));
  if (m != static_cast<ssize_t>(out.size())) {
    const int err = m < 0 ? errno : EIO;
    return SyscallError(
        err, absl::StrFormat("read %d bytes at 0x%x of pid %d", out.size(), addr.value, pid_));
  }
  return absl::OkStatus();
}

absl::Status Process::WriteMemory(RemoteAddr addr, std::span<const uint8_t> data) const {
  KW_ASSIGN_OR_RETURN(const int fd, MemFd());
  const ssize_t m = ::pwrite(fd, data.data(), data.size(), static_cast<off_t>(addr.value));
  if (m != static_cast<ssize_t>(data.size())) {
    const int err = m < 0 ? errno : EIO;
    return SyscallError(
        err, absl::StrFormat("write %d bytes at 0x%x of pid %d", data.size(), addr.value, pid_));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<pid_t>> Process::ListThreads() const {
  const std::string dir = absl::StrCat("/proc/", pid_, "/task");
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) {
    const int err = errno;
    if (err == ENOENT) {
      return absl::NotFoundError(absl::StrCat("process ", pid_, " has exited"));
    }
    return SyscallError(err, absl::StrCat("opendir(", dir, ")"));
  }
  absl::Cleanup close_dir = [d] { ::closedir(d); };
  std::vector<pid_t> tids;
  while (const dirent* e = ::readdir(d)) {  // NOLINT(concurrency-mt-unsafe): own DIR*
    int tid = 0;
    if (absl::SimpleAtoi(e->d_name, &tid)) {
      tids.push_back(tid);
    }
  }
  std::sort(tids.begin(), tids.end());
  return tids;
}

std::vector<pid_t> Process::TracedThreads() const {
  std::vector<pid_t> out;
  out.reserve(threads_.size());
  for (const auto& [tid, t] : threads_) {
    out.push_back(tid);
  }
  std::sort(out.begin(), out.end());
  return out;
}

absl::StatusOr<user_regs_struct> Process::GetRegs(pid_t tid) const {
  user_regs_struct regs{};
  if (::ptrace(PTRACE_GETREGS, tid, nullptr, &regs) != 0) {
    const int err = errno;
    return SyscallError(err, absl::StrCat("ptrace(PTRACE_GETREGS, ", tid, ")"));
  }
  return regs;
}

absl::Status Process::SetRegs(pid_t tid, const user_regs_struct& regs) const {
  if (::ptrace(PTRACE_SETREGS, tid, nullptr, &regs) != 0) {
    const int err = errno;
    return SyscallError(err, absl::StrCat("ptrace(PTRACE_SETREGS, ", tid, ")"));
  }
  return absl::OkStatus();
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

bool Process::FanOut::Claims(pid_t tid, const siginfo_t& si) {
  claimer_ = nullptr;
  for (SignalInterceptor* i : all_) {
    if (i->Claims(tid, si)) {
      claimer_ = i;
      return true;
    }
  }
  return false;
}

absl::Status Process::FanOut::Handle(pid_t tid, const siginfo_t& si) {
  if (claimer_ == nullptr && !Claims(tid, si)) {
    return absl::InternalError("a claimed signal has no interceptor");
  }
  return claimer_->Handle(tid, si);
}

absl::StatusOr<bool> Process::FanOut::HandleInPlace(pid_t tid, const siginfo_t& si) {
  if (claimer_ == nullptr && !Claims(tid, si)) {
    return false;
  }
  return claimer_->HandleInPlace(tid, si);
}

absl::Status Process::FanOut::OnFork(Process& child) {
  absl::Status first;
  for (SignalInterceptor* i : all_) {
    first.Update(i->OnFork(child));
  }
  return first;
}

void Process::FanOut::OnFollowedFork(Process& child, pid_t parent_tid) {
  for (SignalInterceptor* i : all_) {
    i->OnFollowedFork(child, parent_tid);
  }
}

absl::Status Process::FanOut::OnThreadStart(pid_t tid) {
  for (SignalInterceptor* i : all_) {
    KW_RETURN_IF_ERROR(i->OnThreadStart(tid));
  }
  return absl::OkStatus();
}

absl::Status Process::FanOut::OnSyscallStop(pid_t tid, const SyscallStop& stop,
                                            bool world_stopped) {
  for (SignalInterceptor* i : all_) {
    KW_RETURN_IF_ERROR(i->OnSyscallStop(tid, stop, world_stopped));
  }
  return absl::OkStatus();
}

}  // namespace kwatch::core
