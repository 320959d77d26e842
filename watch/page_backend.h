#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "core/base/unique_fd.h"
#include "core/ptrace/guardian.h"
#include "core/ptrace/process.h"
#include "core/x86/x86_access.h"
#include "watch/backend.h"
#include "watch/page_syscalls.h"
#include "watch/session.h"
#include "watch/summary.h"

namespace kwatch::watch {

// Page-protection watchpoints ("pagepoints"): the pages holding watched bytes are
// mprotect()ed inside the target (PROT_READ for write watches, PROT_NONE when reads count);
// each access faults, kwatch decodes the faulting instruction (Zydis) to learn the exact
// address, size and kind, reads the old value, lifts the protection, single-steps the
// instruction with every other thread stopped, reads the new value and protects again.
// Exact (old and new values, no lost events) for any number of watches, at the cost of a
// fault and a few ptrace stops per access to the page, including accesses to other data
// on it (counted as unrelated()).
//
// The kernel's own accesses to a protected page inside a system call raise no fault: the call
// would fail with EFAULT (futex, read into the page...). So while armed, threads run with
// syscall stops, and a call that may touch a protected page (watch/page_syscalls.h) is run
// (1) through a scratch copy of its buffer when it has one (read, write, recv, poll...):
//     exact events for the bytes the kernel wrote or read, nothing left unprotected;
// (2) else with the page opened and every other thread stopped (fenced), protected again
//     at the call's exit; a call that sleeps meanwhile (futex wait) gets its page protected
//     again at once when it uses memory only before sleeping, else the page stays open until
//     its exit and that time is reported (kernel_stats().unprotected): accesses by other
//     threads then are not seen;
// (3) a call that still fails with EFAULT on a protected page (a pointer kwatch did not
//     know, such as one inside a structure) is run again with the pages opened.
//
// The program's own SIGSEGV handler: a fault raised while the thread blocks SIGSEGV (in its
// SIGSEGV handler, without SA_NODEFER) makes the kernel reset the handler to SIG_DFL and unblock
// SIGSEGV in the thread before kwatch sees it (force_sig_info_to_task; seen on Linux 6.x), so the
// program's next fault of its own would kill it. When the program catches SIGSEGV, each fault
// of kwatch's reads /proc/PID/stat's sigcatch; a handler gone is put back (rt_sigaction in the
// faulting thread, every thread stopped) and SIGSEGV blocked in that thread again
// (PTRACE_SETSIGMASK). The handler is read at Arm (a remote rt_sigaction) and followed through
// the program's own rt_sigaction calls (their exit stops): one installed later counts too. One
// with SA_RESETHAND is left reset (handler_resets_kept()). Page mode raises no SIGBUS.
class PageBackend final : public WatchBackend, public core::ptrace::SignalInterceptor {
 public:
  PageBackend(core::ptrace::Process& proc, const std::vector<Watch>& watches)
      : proc_(proc), watches_(watches) {}
  ~PageBackend() override;
  PageBackend(const PageBackend&) = delete;
  PageBackend& operator=(const PageBackend&) = delete;

  BackendKind kind() const override { return BackendKind::kPage; }
  absl::Status Arm() override;
  void Disarm() override;
  void Forget() override;
  void Collect(std::vector<core::AccessEvent>& out) override;
  uint64_t unrelated() const override { return unrelated_; }

  bool Claims(pid_t tid, const siginfo_t& si) override;
  absl::Status Handle(pid_t tid, const siginfo_t& si) override;
  absl::StatusOr<bool> HandleInPlace(pid_t tid, const siginfo_t& si) override;
  // A claimed fault left unhandled as kwatch detaches: puts back a handler it made the kernel
  // reset (see the class comment); a failure is said on stderr.
  void Drop(pid_t tid, const siginfo_t& si) override;
  // Watches the debug registers hold in the same session (hybrid sessions). An instruction
  // this backend emulates never reaches the registers, so its accesses to these watches'
  // bytes are reported here (exact values); one it single-steps runs in the target and the
  // registers see it. The vector must outlive the backend.
  void SetRegisterWatches(const std::vector<Watch>* watches) { register_watches_ = watches; }

  // A forked child inherits the protected pages: give it back their original protections.
  absl::Status OnFork(core::ptrace::Process& child) override;
  // -f: the same cleanup for a followed child, done at its fork event (the pages and scratch
  // mappings it inherited are exactly the parent's then); its session arms it afresh. The
  // outcome waits in TakeForkCleanup.
  void OnFollowedFork(core::ptrace::Process& child, pid_t parent_tid) override;
  // The outcome of cleaning followed child `pid` at its fork, once (OK when nothing was done).
  absl::Status TakeForkCleanup(pid_t pid);
  absl::Status OnSyscallStop(pid_t tid, const core::ptrace::SyscallStop& stop,
                             bool world_stopped) override;

  // What the kernel did with the protected pages inside system calls.
  const KernelAccessStats& kernel_stats() const { return kstats_; }
  const KernelAccessStats* kernel_access() const override { return &kstats_; }

  // Times the program's SIGSEGV handler was put back after the kernel reset it, and resets
  // left alone (a handler with SA_RESETHAND), see the class comment.
  uint64_t handler_restores() const { return handler_restores_; }
  uint64_t handler_resets_kept() const { return handler_resets_kept_; }

  // Faults handled by emulating the instruction, and by single-stepping it.
  uint64_t emulated() const { return emulated_; }
  uint64_t stepped() const { return stepped_; }

  // Pages kwatch protects, page address -> protections (PROT_*) before and while armed.
  struct Page {
    int original = 0;
    int armed = 0;
    int holds = 0;  // system calls in flight that need it open (original protections)
  };
  const std::map<uint64_t, Page>& pages() const { return pages_; }

 private:
  absl::Status Protect(pid_t tid, uint64_t page, int prot);
  static absl::Status ProtectIn(core::ptrace::Process& proc, pid_t tid, uint64_t page, int prot);
  absl::Status ReadValue(uint64_t addr, uint32_t size, uint64_t& out) const;
  // Which watches the instruction touches (reading their values before the access), and
  // the protected pages its operands lie on.
  struct Hit {
    uint32_t watch_id;
    core::AccessKind kind;
    uint64_t addr;  // the watched bytes the operand touched
    uint32_t size;
    uint64_t old_value;
  };
  void Match(const absl::StatusOr<core::x86::DecodedAccess>& decoded, uint64_t fault,
             std::vector<Hit>& hits, std::vector<uint64_t>& touched) const;
  // The hits of `decoded`'s operands on `ws` (every operand's bytes inside each watch).
  void MatchWatches(const std::vector<Watch>& ws, const core::x86::DecodedAccess& decoded,
                    std::vector<Hit>& hits) const;
  const Watch& WatchById(uint32_t id) const;
  void Record(pid_t tid, uint64_t rip, const std::vector<Hit>& hits);

  // A system call that may touch protected pages, from its entry stop to its exit stop.
  struct Before {  // watched bytes the call may write, before it
    uint32_t watch_id;
    uint64_t addr;
    uint64_t value;
  };
  struct Call {
    uint64_t nr = 0;
    uint64_t ip = 0;  // after the syscall instruction
    SyscallModel model;
    std::vector<uint64_t> held;  // protected pages it holds open
    std::vector<Before> before;
    int scratch = -1;            // bounce: index in scratch_
    uint64_t bounced_arg = 0;    // the argument's own value, put back at the exit
    uint64_t open_since_ns = 0;  // pages left open while other threads run, since
    bool retried = false;        // run again after EFAULT
    bool unseen = false;         // looked after only from its EFAULT exit on
    bool restarting = false;     // ended with a restart code: its holds end at the next entry
  };
  absl::Status OnEntry(pid_t tid, const core::ptrace::SyscallStop& st, bool world_stopped);
  absl::Status OnExit(pid_t tid, const core::ptrace::SyscallStop& st, bool world_stopped);
  // The call's exit: events, bounce copied back, holds released. `st` is its exit stop.
  absl::Status ExitCall(pid_t tid, Call& c, const core::ptrace::SyscallStop& st,
                        bool world_stopped);
  // Runs the rest of the call with its pages open and the others stopped.
  absl::Status RunOpen(pid_t tid, Call& c, bool world_stopped);
  absl::Status RunAgainAfterEfault(pid_t tid, Call& c, bool world_stopped);
  // Pages of `ranges` kwatch protects and that block `use` (opened or not).
  std::vector<uint64_t> BlockedPages(const std::vector<KernelRange>& ranges) const;
  absl::Status OpenPages(pid_t tid, Call& c, const std::vector<uint64_t>& pages);
  // Drops the call's holds; pages no call holds any more are protected again through
  // `via_tid` (0: through the next thread at a syscall stop, see ClosePending).
  absl::Status ReleasePages(pid_t via_tid, Call& c);
  absl::Status ClosePending(pid_t tid);
  // mprotect of a run of pages in one call per stretch of equal protections.
  absl::Status ProtectRuns(pid_t tid, const std::vector<uint64_t>& pages, bool open);
  absl::Status SetupBounce(pid_t tid, Call& c);
  absl::Status FinishBounce(pid_t tid, Call& c, int64_t ret, bool copy_out);
  void SnapshotBefore(Call& c);
  void RecordKernel(pid_t tid, const Call& c, int64_t ret);
  KernelAccessStats::Syscall& CallStats(uint64_t nr);
  void AddUnprotected(Call& c, uint64_t now_ns);

  // The program's SIGSEGV disposition, as rt_sigaction(2) takes it on x86-64 (8-byte sigset).
  struct KernelSigaction {
    uint64_t handler = 0;
    uint64_t flags = 0;
    uint64_t restorer = 0;
    uint64_t mask = 0;
  };
  // Arm (every thread stopped, `tid` one of them): reads the handler when SIGSEGV is caught.
  // FailedPrecondition, naming the call that failed, when it is caught but cannot be read.
  absl::Status LearnHandler(pid_t tid);
  // Whether the process catches SIGSEGV now (/proc/PID/stat).
  absl::StatusOr<bool> SegvCaught();
  // Whether the kernel reset the handler kwatch knows of (none known: false, at no cost).
  absl::StatusOr<bool> HandlerReset();
  // Puts the handler back and blocks SIGSEGV in `tid` again (every thread stopped).
  absl::Status RestoreHandler(pid_t tid);
  // The program's rt_sigaction(SIGSEGV, act, ...) returned: handler_ follows `act`.
  absl::Status OnSigaction(const core::ptrace::SyscallStop& exit);

  struct Scratch {  // a mapping kwatch made in the target for bounce buffers
    uint64_t addr = 0;
    uint64_t size = 0;
    bool busy = false;
  };
  absl::StatusOr<int> TakeScratch(pid_t tid, uint64_t size);
  void UnmapScratch(core::ptrace::Process& proc, pid_t tid);

  core::ptrace::Process& proc_;
  // Restores the protections of pages_ if kwatch dies without doing it (core/guardian.h).
  std::unique_ptr<core::ptrace::Guardian> guardian_;
  const std::vector<Watch>& watches_;
  const std::vector<Watch>* register_watches_ = nullptr;
  std::map<uint64_t, Page> pages_;
  bool armed_ = false;
  // After Disarm: faults raised while the pages were protected may still be on their way
  // (queued SIGSEGVs); they are claimed and dropped, the instruction then runs unprotected.
  bool draining_ = false;
  std::vector<core::AccessEvent> events_;
  // Up to 16 bytes of code at an address (fewer at the end of a mapping), read once.
  struct Code {
    std::array<uint8_t, 16> bytes{};
    size_t size = 0;
  };
  std::span<const uint8_t> CodeAt(uint64_t rip);
  absl::flat_hash_map<uint64_t, Code> code_cache_;  // by instruction address
  std::map<pid_t, Call> calls_;                     // by thread (stable references: handlers nest)
  std::vector<Scratch> scratch_;
  std::vector<uint64_t> close_pending_;  // pages to protect again at the next syscall stop
  bool disarming_ = false;               // calls in flight are settled; new ones are left alone
  KernelAccessStats kstats_;
  std::map<pid_t, absl::Status> fork_cleanup_;  // followed children cleaned at their fork
  std::optional<KernelSigaction> handler_;      // while the program catches SIGSEGV
  core::UniqueFd stat_fd_;                      // /proc/PID/stat, read again at each check
  uint64_t handler_restores_ = 0;
  uint64_t handler_resets_kept_ = 0;
  uint64_t unrelated_ = 0;
  uint64_t emulated_ = 0;
  uint64_t stepped_ = 0;
};

}  // namespace kwatch::watch
