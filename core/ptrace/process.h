#pragma once

#include <signal.h>
#include <sys/types.h>
#include <sys/user.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/base/remote_addr.h"
#include "core/base/unique_fd.h"
#include "core/ptrace/maps.h"
#include "core/ptrace/process_group.h"
#include "core/ptrace/syscall_stop.h"

namespace kwatch::core {

// How a target process ended.
struct ExitInfo {
  bool signaled = false;
  int code = 0;    // exit status when !signaled
  int signal = 0;  // terminating signal when signaled
  bool core_dumped = false;

  // Shell convention: the status, or 128 + signal.
  int ShellStatus() const { return signaled ? 128 + signal : code; }
};

// A lifecycle change observed while polling a traced process.
struct ProcessEvent {
  enum class Kind : uint8_t {
    kThreadStarted,  // tid is the new thread
    kThreadExited,   // tid is gone
    kExec,           // the process replaced its image; tid (== pid) is stopped until Resume()
    kExited,         // the whole process ended; see exit_info()
    kSignal,         // a signal was delivered to tid (already passed on to the target)
    kGroupStop,      // job-control stop (SIGSTOP/SIGTSTP...): the target stays stopped
    kForked,         // tid forked a child: cleaned up and let go, or followed (`child`)
  };
  Kind kind = Kind::kThreadStarted;
  pid_t tid = 0;
  int signal = 0;
  // kForked in a ProcessGroup following forks: the child's pid, stopped until its owner
  // takes it (ProcessGroup::TakeChild) and resumes it; 0 when the child was let go.
  pid_t child = 0;
};

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
};

// Who a launched command runs as (`-u USER`, as strace does): resolved by ResolveUser.
struct RunAs {
  std::string name;
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;  // supplementary groups, the user's own (getgrouplist)
};

// USER is a login name or a numeric uid. NotFound names the user; PermissionDenied when
// kwatch is not root (switching user needs CAP_SETUID and CAP_SETGID).
absl::StatusOr<RunAs> ResolveUser(const std::string& user);

struct LaunchOptions {
  bool kill_on_exit = true;     // PTRACE_O_EXITKILL: the target dies if kwatch dies
  std::optional<RunAs> run_as;  // the command's user, groups and group ids (else kwatch's)
};

// A target process traced by this thread through PTRACE_SEIZE (every thread, new threads
// followed with PTRACE_O_TRACECLONE). Owns the trace: the destructor detaches from a live
// target (launched targets keep running unless kill_on_exit). All calls must come from the
// thread that created it (ptrace is per tracer thread).
class Process {
 public:
  // Starts argv[0] (looked up in PATH) under ptrace and stops it right after exec, before
  // any of its code (or the dynamic loader) has run. NotFound / PermissionDenied name the
  // program and the exec error.
  static absl::StatusOr<std::unique_ptr<Process>> Launch(const std::vector<std::string>& argv,
                                                         const LaunchOptions& opts = {});

  // Seizes every thread of a running process without stopping it. Errors explain ESRCH
  // (no such process), EPERM (needs root or CAP_SYS_PTRACE, Yama ptrace_scope, or another
  // tracer such as gdb or strace already attached: names it from /proc/PID/status).
  static absl::StatusOr<std::unique_ptr<Process>> Attach(pid_t pid);

  // The target of a session: Attach(*pid) when a pid is given, else Launch(argv, opts) and
  // RunToEntry() (a launched target that fails to reach its entry point is killed).
  static absl::StatusOr<std::unique_ptr<Process>> Start(std::optional<pid_t> pid,
                                                        const std::vector<std::string>& argv,
                                                        const LaunchOptions& opts);

  ~Process();
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  pid_t pid() const { return pid_; }
  bool launched() const { return launched_; }
  bool alive() const { return !exit_.has_value(); }
  // True when the process is being torn down by a fatal signal (SIGKILL pending, or its
  // threads already zombies): ptrace requests on it then fail with ESRCH at any point, and
  // such failures are its death, not kwatch's error; its exit status follows from waitpid.
  bool Dying() const;
  const std::optional<ExitInfo>& exit_info() const { return exit_; }
  const std::vector<std::string>& argv() const { return argv_; }
  // Children the target forked and kwatch let go (each cleaned up and left untraced).
  uint64_t forks() const { return forks_; }
  // Children the target forked that kwatch follows (members of its group).
  uint64_t followed_forks() const { return followed_forks_; }
  // The group this process belongs to (ProcessGroup::Add), or nullptr.
  ProcessGroup* group() const { return group_; }
  // SIGTRAPs absorbed because nothing explains them (a debug exception with no cause:
  // see core/trap_origin.h); every other SIGTRAP is delivered to the target unchanged.
  uint64_t spurious_traps() const { return spurious_traps_; }

  // Launched targets only, right after Launch(): runs the dynamic loader up to the program's
  // entry point (AT_ENTRY) with a temporary INT3, so that shared libraries are mapped,
  // and leaves the target stopped there with the original byte restored.
  absl::Status RunToEntry();

  // Stops every thread (PTRACE_INTERRUPT) and waits until all are in a ptrace stop; no new
  // thread can appear until ResumeAll(). Other stops seen meanwhile are handled as Poll does.
  absl::Status StopAll();
  // Like StopAll, but a thread inside a system call that will stop at the call's exit
  // (resumed from its entry stop while syscall stops are on) is left there: it runs no user
  // code until kwatch resumes it. Does not interrupt blocking calls.
  absl::Status StopUserCode();
  // Resumes every thread stopped by kwatch (group-stopped threads stay stopped), after
  // passing any syscall stop seen meanwhile to the interceptor.
  absl::Status ResumeAll();
  // Keeps every thread stopped across several StopAll/ResumeAll pairs (a session arming two
  // backends, each stopping and resuming the world): ResumeAll resumes nothing while held.
  // Call after StopAll; ReleaseHold() ends it and resumes every thread.
  void HoldStopped() { ++hold_; }
  absl::Status ReleaseHold();
  // With the world stopped: passes the syscall stops seen meanwhile to the interceptor now.
  absl::Status SettleSyscallStops();

  // System-call stops: while on, threads resume with PTRACE_SYSCALL and the interceptor sees
  // each call's entry and exit (OnSyscallStop). Off by default; a call already running keeps
  // the mode it was resumed with.
  void SetSyscallStops(bool on) { syscall_stops_ = on; }
  bool syscall_stops() const { return syscall_stops_; }
  uint64_t syscall_stop_count() const { return syscall_stop_count_; }
  // Thread `tid`, at a syscall-entry stop, goes on with its call alone and kwatch waits up to
  // `max_wait` for the call's exit stop (kReturned; `tid` then stays stopped there) or until
  // it sleeps in the kernel (kBlocked; `tid` runs on, fenced by its exit stop).
  absl::StatusOr<SyscallOutcome> FinishSyscall(pid_t tid, absl::Duration max_wait);
  // Thread `tid`, at a syscall-exit stop, goes back to the entry stop of the same call (its
  // registers rewound to the syscall instruction), to run it again.
  absl::Status RestartSyscall(pid_t tid);

  // Reaps all pending wait statuses without blocking (or blocking for the first one when
  // `block`), handles ptrace stops, passes signals on to the target, and returns what
  // changed. Call it when SIGCHLD arrives.
  absl::StatusOr<std::vector<ProcessEvent>> Poll(bool block = false);

  // Resumes one thread left stopped by a kExec event.
  absl::Status Resume(pid_t tid);

  // Detaches from every thread, leaving the target running. Safe to call twice.
  absl::Status Detach();
  // Sends SIGKILL and reaps the target.
  absl::Status Kill();

  // Target memory through /proc/PID/mem, which also reads and writes pages the target
  // cannot (code, pages kwatch protects).
  absl::Status ReadMemory(RemoteAddr addr, std::span<uint8_t> out) const;
  absl::Status WriteMemory(RemoteAddr addr, std::span<const uint8_t> data) const;

  // Threads now (from /proc/PID/task) and as kwatch tracks them.
  absl::StatusOr<std::vector<pid_t>> ListThreads() const;
  std::vector<pid_t> TracedThreads() const;
  absl::StatusOr<std::vector<MapEntry>> Maps() const { return ReadMaps(pid_); }

  // Interceptors of signal-delivery stops. Several backends may own signals of one process
  // (stop mode's debug traps and page mode's faults in one session): the first that claims a
  // signal handles it, and every one hears of forks, new threads and system-call stops.
  void AddInterceptor(SignalInterceptor* interceptor);
  void RemoveInterceptor(SignalInterceptor* interceptor);
  // Makes `interceptor` the only one (nullptr: none).
  void SetInterceptor(SignalInterceptor* interceptor) {
    interceptors_.clear();
    interceptor_ = nullptr;
    if (interceptor != nullptr) {
      AddInterceptor(interceptor);
    }
  }

  // Executes one instruction of stopped thread `tid` (PTRACE_SINGLESTEP) while the other
  // threads stay as they are. Signals that arrive first are set aside (the target's own are
  // delivered when the thread resumes; those the interceptor claims are dropped) and the step
  // is retried. Returns SIGTRAP once the instruction ran, or 0 when the process ended.
  absl::StatusOr<int> SingleStep(pid_t tid);

  // Runs system call `nr` with up to 6 arguments in stopped thread `tid` and returns its
  // raw result (-errno on failure). The thread's registers and code are restored; other
  // threads must be stopped (StopAll) so that none runs the patched bytes. A thread at a
  // syscall stop runs it through its own syscall instruction instead (nothing patched, other
  // threads may run) and is left at the same stop, its own call untouched.
  absl::StatusOr<int64_t> RemoteSyscall(pid_t tid, long nr, std::span<const uint64_t> args);

  // A stopped thread of the process (for RemoteSyscall), or 0 when none is stopped.
  pid_t AnyStoppedThread() const;

  // Registers of a stopped thread.
  absl::StatusOr<user_regs_struct> GetRegs(pid_t tid) const;
  absl::Status SetRegs(pid_t tid, const user_regs_struct& regs) const;

 private:
  enum class ThreadState : uint8_t { kRunning, kStopped, kGroupStopped };
  enum class SyscallAt : uint8_t { kNone, kEntry, kExit };
  struct Thread {
    ThreadState state = ThreadState::kRunning;
    SyscallAt at_syscall = SyscallAt::kNone;  // stopped at a syscall stop
    bool in_syscall = false;      // running a call resumed from its entry with PTRACE_SYSCALL
    bool syscall_unseen = false;  // its syscall stop waits for the interceptor
    bool interrupt_pending = false;
    bool fresh = false;  // created by clone, its first stop not seen yet (OnThreadStart)
    std::optional<siginfo_t> claimed;  // an intercepted signal waiting for Handle()
    int pending_signal = 0;            // delivered on the next resume
  };

  Process(pid_t pid, bool launched, std::vector<std::string> argv)
      : pid_(pid), launched_(launched), argv_(std::move(argv)) {}

  absl::Status SeizeThread(pid_t tid);
  // Handles one wait status of `tid`, appending to `events`.
  absl::Status HandleStatus(pid_t tid, int status, std::vector<ProcessEvent>& events);
  absl::Status Cont(pid_t tid, int sig);
  absl::Status StopThreads(bool user_code_only);
  // For StopThreads: the threads `awaited` that the kernel says are gone are forgotten, those
  // it shows stopped are marked stopped (a signal-delivery stop keeps its signal), the rest
  // are interrupted again.
  void RecoverMissedStops(const std::function<bool(const Thread&)>& awaited);
  // A syscall stop of `tid` (SIGTRAP|0x80): to the interceptor now, or later.
  absl::Status HandleSyscallStop(pid_t tid);
  absl::StatusOr<SyscallStop> ReadSyscallStop(pid_t tid) const;
  absl::Status DeliverSyscallStop(pid_t tid, bool world_stopped);
  // Resumes `tid` with PTRACE_SYSCALL and waits for its next syscall stop (entry or exit as
  // asked), setting aside signals that come first (delivered on the next resume).
  absl::Status AwaitSyscallStop(pid_t tid, bool entry);
  absl::StatusOr<int64_t> SyscallAtStop(pid_t tid, long nr, std::span<const uint64_t> args);
  absl::StatusOr<int> MemFd() const;
  // Stops the world and lets the interceptor handle every claimed signal, then resumes.
  absl::Status HandleClaimed();
  // Whether the SIGTRAP that stopped `tid` is a spurious debug exception, or a late trap of a
  // breakpoint kwatch already closed (core/trap_origin.h), to absorb.
  bool SpuriousTrap(pid_t tid, const siginfo_t& si) const;
  // Before detaching: lets signals kwatch caused that still wait in threads' queues arrive
  // and drops them, so that none reaches the target after kwatch has gone.
  absl::Status FlushClaimedSignals();
  // Whether a wait status of `tid` concerns this process (adopting threads not seen yet);
  // false for a forked child's first stop (kept in foreign_stops_).
  bool Adopt(pid_t tid, int status);
  // PTRACE_EVENT_FORK of `parent`: cleans the child up through the interceptor and detaches
  // it, or (a group following forks) makes it a member; returns its pid when followed, else 0.
  absl::StatusOr<pid_t> HandleFork(pid_t parent);
  // The next wait status of any tracee: one another member of the group handed over first,
  // then waitpid(-1) (0 with `nohang` when none is ready). EINTR retried.
  absl::StatusOr<pid_t> NextStatus(int& status, bool nohang);

  pid_t pid_;
  bool launched_;
  std::vector<std::string> argv_;
  absl::flat_hash_map<pid_t, Thread> threads_;
  std::optional<ExitInfo> exit_;
  std::vector<ProcessEvent> pending_events_;  // seen inside StopAll/RunToEntry, for Poll
  bool stopping_all_ = false;                 // inside StopAll: keep interrupt stops
  int hold_ = 0;                              // HoldStopped depth
  bool detached_ = false;
  bool handling_claimed_ = false;
  // Forwards to every interceptor of interceptors_ (used when there are several).
  class FanOut : public SignalInterceptor {
   public:
    explicit FanOut(const std::vector<SignalInterceptor*>& all) : all_(all) {}
    bool Claims(pid_t tid, const siginfo_t& si) override;
    absl::Status Handle(pid_t tid, const siginfo_t& si) override;
    absl::StatusOr<bool> HandleInPlace(pid_t tid, const siginfo_t& si) override;
    absl::Status OnFork(Process& child) override;
    void OnFollowedFork(Process& child, pid_t parent_tid) override;
    absl::Status OnThreadStart(pid_t tid) override;
    absl::Status OnSyscallStop(pid_t tid, const SyscallStop& stop, bool world_stopped) override;

   private:
    const std::vector<SignalInterceptor*>& all_;
    SignalInterceptor* claimer_ = nullptr;  // of the last signal claimed
  };
  std::vector<SignalInterceptor*> interceptors_;
  FanOut fan_out_{interceptors_};
  SignalInterceptor* interceptor_ = nullptr;  // the one, the fan-out, or nullptr
  bool syscall_stops_ = false;
  uint64_t syscall_stop_count_ = 0;
  absl::flat_hash_set<pid_t> foreign_stops_;
  friend class ProcessGroup;
  friend class RemoteCallRunner;  // core/ptrace/remote_call.cc
  ProcessGroup* group_ = nullptr;
  std::deque<std::pair<pid_t, int>> stashed_;  // statuses other members reaped for us
  uint64_t forks_ = 0;
  uint64_t followed_forks_ = 0;
  uint64_t spurious_traps_ = 0;
  mutable UniqueFd mem_fd_;  // /proc/PID/mem, opened on first use, reopened after exec
};

// Reads NAME from /proc/PID/status ("TracerPid", "Name"...), "" if absent.
std::string ProcStatusField(pid_t pid, const std::string& name);

}  // namespace kwatch::core
