// Process, lifecycle: launch, attach, run to the entry point, detach, kill, thread lists.
#include <dirent.h>
#include <elf.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <pwd.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <csignal>
#include <cstring>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "core/base/confinement.h"
#include "core/base/status_macros.h"
#include "core/base/syscall_status.h"
#include "core/base/unique_fd.h"
#include "core/ptrace/exit_anchor.h"
#include "core/ptrace/process.h"
#include "core/ptrace/process_internal.h"

namespace kwatch::core::ptrace {
namespace {

// TRACESYSGOOD marks syscall stops (SIGTRAP | 0x80); they only happen while kwatch asks.
constexpr long kTraceOptions =
    PTRACE_O_TRACECLONE | PTRACE_O_TRACEEXEC | PTRACE_O_TRACEFORK | PTRACE_O_TRACESYSGOOD;

std::string ProgramName(const std::vector<std::string>& argv) {
  return argv.empty() ? std::string("(none)") : argv[0];
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
  if (std::string confined = ConfinementAdvice(CAP_SYS_PTRACE, "SYS_PTRACE"); !confined.empty()) {
    return confined;
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

namespace process_internal {

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

}  // namespace process_internal

using process_internal::ExitFromStatus;
using process_internal::ReadAuxvEntry;

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
  (void)StartExitAnchor();  // best effort: without it kwatch only dies more slowly
  std::array<int, 2> pipefd{};
  if (::pipe2(pipefd.data(), O_CLOEXEC) != 0) {
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
    sigprocmask(SIG_SETMASK, &none, nullptr);  // NOLINT(concurrency-mt-unsafe): one thread
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGPIPE, SIGCHLD}) {
      signal(sig, SIG_DFL);  // NOLINT(concurrency-mt-unsafe): the child has one thread
    }
    if (opts.run_as.has_value()) {
      const RunAs& as = *opts.run_as;
      if (::setgroups(as.groups.size(), as.groups.data()) != 0 || ::setgid(as.gid) != 0 ||
          ::setuid(as.uid) != 0) {
        const int err = errno;
        [[maybe_unused]] const ssize_t n = ::write(write_end.get(), &err, sizeof(err));
        _exit(127);
      }
    }
    raise(SIGSTOP);
    execvp(args[0], args.data());
    const int err = errno;
    [[maybe_unused]] const ssize_t n = ::write(write_end.get(), &err, sizeof(err));
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
  (void)StartExitAnchor();  // best effort: without it kwatch only dies more slowly
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

namespace {

// After every known thread is detached: detaches those of `tids` still traced by this thread,
// which kwatch never met (a clone whose first stop was not collected).
void LetGoUnseenTracees(const std::vector<pid_t>& tids) {
  // A thread the kernel attached for kwatch (a clone) whose stops kwatch never met refuses
  // PTRACE_DETACH while it runs (ESRCH, taken above for "gone") and stays traced, unseen: at
  // the target's next exec the kernel waits for kwatch to reap it, and the exec never ends
  // (seen under load with the agent's watchdog thread). Stop each such thread and let it go.
  const std::string self = absl::StrCat(::syscall(SYS_gettid));
  for (const pid_t tid : tids) {
    if (ProcStatusField(tid, "TracerPid") != self) {
      continue;
    }
    (void)::ptrace(PTRACE_INTERRUPT, tid, nullptr, nullptr);
    for (int waited_ms = 0; waited_ms < 1000; ++waited_ms) {
      int status = 0;
      const pid_t r = ::waitpid(tid, &status, __WALL | WNOHANG);
      if (r == tid || (r < 0 && errno != EINTR)) {
        break;  // stopped (or gone)
      }
      ::usleep(1000);
    }
    (void)::ptrace(PTRACE_DETACH, tid, nullptr, nullptr);
  }
}

}  // namespace

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
  if (auto tids = ListThreads(); tids.ok()) {
    LetGoUnseenTracees(*tids);
  }
  detached_ = true;
  return absl::OkStatus();
}

void Process::DropClaimed(pid_t tid, Thread& thread) {
  if (thread.claimed.has_value() && interceptor_ != nullptr) {
    interceptor_->Drop(tid, *thread.claimed);
  }
  thread.claimed.reset();
}

absl::Status Process::FlushClaimedSignals() {
  if (interceptor_ == nullptr) {
    return absl::OkStatus();
  }
  for (auto& [tid, thread] : threads_) {
    DropClaimed(tid, thread);  // the faulting access re-runs after detach
  }
  // A signal kwatch caused may still wait in a thread's queue (raised just before the world
  // stopped): let each such thread take it now, while kwatch can still claim it.
  for (int round = 0; round < 8; ++round) {
    bool any = false;
    for (const pid_t tid : TracedThreads()) {
      const std::string pending = ProcStatusField(tid, "SigPnd");
      uint64_t mask = 0;
      // SIGSTOP: the stop of a thread an interceptor parked (gdbserver's breakpoints); one
      // nobody claims is passed on as before.
      constexpr uint64_t kClaimable =
          (1ULL << (SIGSEGV - 1)) | (1ULL << (SIGTRAP - 1)) | (1ULL << (SIGSTOP - 1));
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
        DropClaimed(tid, it->second);
      }
    }
    if (!any) {
      break;
    }
  }
  return absl::OkStatus();
}

void Process::Abandon() {
  if (launched_) {
    (void)Kill();
  } else {
    (void)Detach();
  }
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

}  // namespace kwatch::core::ptrace
