#pragma once

// A traced target process. The class is one; its implementation is split by subject:
//   process_launch.cc   lifecycle: launch, attach, run to entry, detach, kill, thread lists
//   process.cc          stops and events: wait statuses, signals, StopAll/ResumeAll, steps
//   syscall_stops.cc    system-call stops, and system calls run at them
//   process_memory.cc   memory and registers (thread_regs.h: the register accessors)
//   remote_exec.cc      code run inside a stopped thread (remote_exec.h: calls, mmap...)

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
#include "core/ptrace/launch_options.h"
#include "core/ptrace/maps.h"
#include "core/ptrace/process_event.h"
#include "core/ptrace/process_group.h"
#include "core/ptrace/signal_interceptor.h"
#include "core/ptrace/syscall_stop.h"

namespace kwatch::core::ptrace {

// A target process traced by this thread through PTRACE_SEIZE (every thread, new threads
// followed with PTRACE_O_TRACECLONE). Owns the trace: the destructor detaches from a live
// target (launched targets keep running unless kill_on_exit). All calls must come from the
// thread that created it (ptrace is per tracer thread).
class Process {
 public:
  // --- Lifecycle (process_launch.cc) ---
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

  // Launched targets only, right after Launch(): runs the dynamic loader up to the program's
  // entry point (AT_ENTRY) with a temporary INT3, so that shared libraries are mapped,
  // and leaves the target stopped there with the original byte restored.
  absl::Status RunToEntry();
  // Detaches from every thread, leaving the target running. Safe to call twice.
  absl::Status Detach();
  // Sends SIGKILL and reaps the target.
  absl::Status Kill();
  // For a session that fails before it starts: kills a launched target (it has not run its
  // own code yet, so nothing of it is lost) and detaches from an attached one (it runs on).
  void Abandon();
  // Threads now (from /proc/PID/task) and as kwatch tracks them.
  absl::StatusOr<std::vector<pid_t>> ListThreads() const;
  std::vector<pid_t> TracedThreads() const;
  absl::StatusOr<std::vector<MapEntry>> Maps() const { return ReadMaps(pid_); }

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

  // --- Stops and events (process.cc) ---
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
  // Call after StopAll; ReleaseHold() ends it and resumes every thread. A SignalInterceptor's
  // Handle may call it too (the world is stopped there): the threads then stay stopped after
  // the claimed signals are handled, until the holder's ReleaseHold.
  void HoldStopped() { ++hold_; }
  absl::Status ReleaseHold();
  // Ends one HoldStopped without resuming anything: for a SignalInterceptor's Handle that held
  // the world while it worked (its caller, HandleClaimed, resumes the threads afterwards).
  void DropHold() {
    if (hold_ > 0) {
      --hold_;
    }
  }
  // Stopped thread `tid` receives signal `sig` (0: none) when it is resumed, in place of
  // whatever it would have received. NotFound when kwatch does not trace `tid`.
  absl::Status SetPendingSignal(pid_t tid, int sig);
  // Reaps all pending wait statuses without blocking (or blocking for the first one when
  // `block`), handles ptrace stops, passes signals on to the target, and returns what
  // changed. Call it when SIGCHLD arrives.
  absl::StatusOr<std::vector<ProcessEvent>> Poll(bool block = false);
  // Resumes one thread left stopped by a kExec event.
  absl::Status Resume(pid_t tid);
  // Executes one instruction of stopped thread `tid` (PTRACE_SINGLESTEP) while the other
  // threads stay as they are. Signals that arrive first are set aside (the target's own are
  // delivered when the thread resumes; those the interceptor claims are dropped) and the step
  // is retried. A fault of kwatch's page protection at the instruction goes to the interceptor
  // that claims it, which runs the instruction (and counts the access): that is the step.
  // Returns SIGTRAP once the instruction ran, or 0 when the process ended; Internal after
  // kMaxStepRetries attempts that stopped before the instruction ran (never an endless loop).
  absl::StatusOr<int> SingleStep(pid_t tid);
  static constexpr int kMaxStepRetries = 1000;
  // A stopped thread of the process (for RemoteSyscall), or 0 when none is stopped.
  pid_t AnyStoppedThread() const;

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

  // --- System-call stops (syscall_stops.cc) ---
  // While on, threads resume with PTRACE_SYSCALL and the interceptor sees each call's entry
  // and exit (OnSyscallStop). Off by default; a call already running keeps the mode it was
  // resumed with.
  void SetSyscallStops(bool on) { syscall_stops_ = on; }
  bool syscall_stops() const { return syscall_stops_; }
  uint64_t syscall_stop_count() const { return syscall_stop_count_; }
  // With the world stopped: passes the syscall stops seen meanwhile to the interceptor now.
  absl::Status SettleSyscallStops();
  // Thread `tid`, at a syscall-entry stop, goes on with its call alone and kwatch waits up to
  // `max_wait` for the call's exit stop (kReturned; `tid` then stays stopped there) or until
  // it sleeps in the kernel (kBlocked; `tid` runs on, fenced by its exit stop).
  absl::StatusOr<SyscallOutcome> FinishSyscall(pid_t tid, absl::Duration max_wait);
  // Thread `tid`, at a syscall-exit stop, goes back to the entry stop of the same call (its
  // registers rewound to the syscall instruction), to run it again.
  absl::Status RestartSyscall(pid_t tid);

  // --- Memory and registers (process_memory.cc) ---
  // Target memory through /proc/PID/mem, which also reads and writes pages the target
  // cannot (code, pages kwatch protects).
  absl::Status ReadMemory(RemoteAddr addr, std::span<uint8_t> out) const;
  absl::Status WriteMemory(RemoteAddr addr, std::span<const uint8_t> data) const;
  // General registers of a stopped thread (thread_regs.h has the extended and debug ones).
  absl::StatusOr<user_regs_struct> GetRegs(pid_t tid) const;
  absl::Status SetRegs(pid_t tid, const user_regs_struct& regs) const;

  // --- Remote execution (remote_exec.cc; remote_exec.h has calls and mmap) ---
  // Runs system call `nr` with up to 6 arguments in stopped thread `tid` and returns its
  // raw result (-errno on failure). The thread's registers and code are restored; other
  // threads must be stopped (StopAll) so that none runs the patched bytes. A thread at a
  // syscall stop runs it through its own syscall instruction instead (nothing patched, other
  // threads may run) and is left at the same stop, its own call untouched.
  absl::StatusOr<int64_t> RemoteSyscall(pid_t tid, long nr, std::span<const uint64_t> args);

 private:
  friend class ProcessGroup;

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
  // Forgets `thread`'s claimed signal, letting the interceptor undo what it left
  // (SignalInterceptor::Drop).
  void DropClaimed(pid_t tid, Thread& thread);
  // Hands the claimed signal `si` of stopped thread `tid` to the interceptor: in place when it
  // can, else to its Handle.
  absl::Status Intercept(pid_t tid, const siginfo_t& si);
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
  absl::flat_hash_set<pid_t> faulting_steps_;  // SingleStep drops their claimed faults
  std::vector<SignalInterceptor*> interceptors_;
  InterceptorFanOut fan_out_{interceptors_};  // used when there are several
  SignalInterceptor* interceptor_ = nullptr;  // the one, the fan-out, or nullptr
  bool syscall_stops_ = false;
  uint64_t syscall_stop_count_ = 0;
  absl::flat_hash_set<pid_t> foreign_stops_;
  friend class RemoteCallRunner;  // core/ptrace/remote_call.cc
  ProcessGroup* group_ = nullptr;
  std::deque<std::pair<pid_t, int>> stashed_;  // statuses other members reaped for us
  uint64_t forks_ = 0;
  uint64_t followed_forks_ = 0;
  uint64_t spurious_traps_ = 0;
  mutable UniqueFd mem_fd_;  // /proc/PID/mem, opened on first use, reopened after exec
};

}  // namespace kwatch::core::ptrace
