#pragma once

// The INT3 probe engine, ptrace backend: kprobes/uprobes-style probes on a traced process.
//
// A probe is an INT3 over the first byte of an instruction. It stays there as long as the
// probe lives (other threads never run past it). On a hit, with only the trapping thread
// stopped, the pre handlers run and the displaced instruction then either
//  - is emulated (register-only instructions, branches, call, ret): registers (and the
//    stack, for call/ret) are written, the thread resumes at the successor; or
//  - runs out of line: the thread resumes in a copy in the XOL area (core/probe/xol.h),
//    followed by a jump back to the successor: one ptrace stop per hit, no single-step.
//    With post handlers the copy is followed by an INT3 instead (a second stop).
// The XOL copy is the same for every thread, so one slot per address serves them all: a
// copy's only inputs are the thread's own registers and memory.
//
// Return probes (kretprobes) put an internal entry probe on the function: a tracked call's
// return address on the stack is replaced by the trampoline (an INT3 in the XOL area); at
// its hit the instance is popped, the handler runs and rip is set to the real return
// address. Instances are per thread (recursion works); maxactive bounds them (nmissed).
// Instances whose call was abandoned (longjmp, C++ exceptions) are dropped as uprobes does:
// at an entry, those at or below the new return slot; at a return, those deeper than the
// returning one. C++ exceptions cannot unwind through a tracked frame (the unwinder sees the
// trampoline), as with kretprobes; a function entered on a sigaltstack above the thread's
// stack may confuse the ordering.
//
// Everything patched is recorded (Patches()) and put back by RestoreAll(), with every thread
// stopped; a forked child gets the original code back (OnFork); after an exec (OnExec) the
// new image has nothing of kwatch.
//
// Lifetime: created over a Process (launched or attached, any number of threads), installs
// itself as its SignalInterceptor; the destructor restores everything if the target lives
// and uninstalls itself. Not thread-safe: use it, and run Poll, from the tracer thread.
// Handlers run on that thread; they may call Enable/Disable/Stats but must not (un)register.

#include <sys/types.h>
#include <sys/user.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/probe/insn_fixup.h"
#include "core/probe/int3_probe.h"
#include "core/probe/int3_state.h"
#include "core/probe/xol.h"
#include "core/ptrace/guardian.h"
#include "core/ptrace/process.h"
#include "core/x86/x86_emulate.h"

namespace kwatch::core::probe {

class Int3Engine : public ptrace::SignalInterceptor {
 public:
  explicit Int3Engine(ptrace::Process& process);
  ~Int3Engine() override;
  Int3Engine(const Int3Engine&) = delete;
  Int3Engine& operator=(const Int3Engine&) = delete;

  // A probe at `addr` (absolute). Refuses (InvalidArgument, saying why) addresses outside
  // executable code, in the XOL area, inside or overlapping another probed instruction, and
  // instructions that cannot be displaced (insn_fixup.h). Several probes at one address share
  // its breakpoint; their handlers run in registration order.
  absl::StatusOr<ProbeId> Register(RemoteAddr addr, ProbeHandlers handlers, ProbeOptions opts = {});
  // A return probe on the function starting at `function_entry`: handlers.pre at each
  // tracked return, handlers.entry at each tracked entry.
  absl::StatusOr<ProbeId> RegisterReturn(RemoteAddr function_entry, ProbeHandlers handlers,
                                         ReturnProbeOptions opts = {});
  // Enable/Disable flip a flag (the breakpoint stays): callable from handlers. Enabling does
  // not reset maxhits. NotFound for unknown ids.
  absl::Status Enable(ProbeId id);
  absl::Status Disable(ProbeId id);
  // Removes a probe; the last one at an address puts the original byte back. Live return
  // instances still return through the trampoline (without the handler).
  absl::Status Unregister(ProbeId id);
  absl::StatusOr<ProbeStats> Stats(ProbeId id) const;

  // Batches changes: between StopWorld() and ResumeWorld() (nested pairs allowed) the target
  // stays stopped, so probes registered together see the same calls. Each mutating call
  // stops the world by itself otherwise. ResumeWorld resumes every thread kwatch stopped
  // (a launched target stopped at its entry starts running).
  absl::Status StopWorld();
  absl::Status ResumeWorld();

  // Puts back every original byte and every replaced return address, with the world stopped;
  // a thread caught inside an out-of-line copy is moved back to the original code, a hit
  // already trapped but not yet seen is undone (its instruction runs unprobed). Probes end
  // (registered == false); new ones may be registered afterwards.
  absl::Status RestoreAll();
  // The target exec'd (ProcessEvent::kExec): the new image has no breakpoint, no XOL area,
  // no instance. Drops that state; probes end. Call before resuming the target.
  void OnExec();
  // A traced thread ended (ProcessEvent::kThreadExited): its instances are abandoned.
  void OnThreadExit(pid_t tid);
  // A followed fork (core/process_group.h): `child` (stopped, one thread: a copy of thread
  // `forking_tid` of this engine's process) already holds this engine's breakpoints, XOL
  // areas and replaced return addresses. Returns an engine for the child adopting that state
  // without writing anything: the same probes (ids, handlers, enabled flags), counted from
  // zero, the forking thread's return instances becoming the child's. Every patch it adopts is
  // journaled into `guardian` (may be null).
  std::unique_ptr<Int3Engine> AdoptFork(ptrace::Process& child, pid_t forking_tid,
                                        ptrace::Guardian* guardian) const;
  // The engine AdoptFork made for followed child `pid` at its fork event (OnFollowedFork),
  // once; nullptr if none.
  std::unique_ptr<Int3Engine> TakeForkedEngine(pid_t pid);
  // Sets the guardian and journals into it every patch already in place (an adopted engine).
  void JournalInto(ptrace::Guardian* guardian);

  // Everything patched now (breakpoints, replaced return addresses).
  std::vector<PatchRecord> Patches() const;
  // Journals every patch into `guardian` (before writing it) and forgets it once restored.
  // Set before registering; nullptr stops journaling.
  void SetGuardian(ptrace::Guardian* guardian) { guardian_ = guardian; }
  const XolAreas& xol() const { return xol_; }
  ptrace::Process& process() const { return process_; }
  // From a pre handler (entry or return): once the handlers ran, the thread is left where the
  // probe stopped it (an entry: at the probed instruction, not run yet; a return: in its
  // caller, right after the return) and SIGSTOP is queued for it, so that it stops there
  // before running anything (a group stop: the whole process stops, as job control keeps it;
  // detaching leaves it stopped). For `kwatch probe --stop-on`.
  void ParkCurrentThread() { park_ = in_handler_; }
  // A thread a debugger single-steps (PTRACE_SINGLESTEP would run the INT3 and lose its place):
  // thread `tid`, stopped with rip at one of the engine's breakpoints or at the return
  // trampoline, gets the hit there as the trap would give it (handlers run, unless a handler
  // parked the thread there: that hit goes on), then the displaced instruction runs (emulated,
  // or its out-of-line copy single-stepped and the jump back taken), so that the thread ends
  // right after it, as a step would leave it. Returns false, doing nothing, when rip is at none
  // of the engine's addresses (the caller steps the thread itself).
  absl::StatusOr<bool> StepOver(pid_t tid);
  // How hits were handled, for tests and benches.
  struct Counters {
    uint64_t traps = 0;        // breakpoint hits
    uint64_t emulated = 0;     // instructions emulated
    uint64_t out_of_line = 0;  // sent out of line
    uint64_t post_traps = 0;   // second stops for post handlers
    uint64_t returns = 0;      // trampoline hits
    uint64_t parked = 0;       // threads left stopped by ParkCurrentThread
  };
  const Counters& counters() const { return counters_; }

  // SignalInterceptor.
  bool Claims(pid_t tid, const siginfo_t& si) override;
  // A trap at a probe that is gone (removed before kwatch detaches) goes back to the probed
  // instruction, whose byte is restored: the thread runs it as if the probe never was.
  void Drop(pid_t tid, const siginfo_t& si) override;
  absl::Status Handle(pid_t tid, const siginfo_t& si) override;
  absl::StatusOr<bool> HandleInPlace(pid_t tid, const siginfo_t& si) override;
  absl::Status OnFork(ptrace::Process& child) override;
  void OnFollowedFork(ptrace::Process& child, pid_t parent_tid) override;

 private:
  using Probe = int3_internal::Probe;
  using Breakpoint = int3_internal::Breakpoint;
  using Slot = int3_internal::Slot;
  using Instance = int3_internal::Instance;
  using ThreadState = int3_internal::ThreadState;

  absl::Status Mutable() const;
  absl::StatusOr<ProbeId> AddProbe(RemoteAddr addr, Probe probe, ProbeExecution execution,
                                   const ProbeOptions* placement);
  absl::StatusOr<Breakpoint*> EnsureBreakpoint(RemoteAddr addr, ProbeExecution execution,
                                               const ProbeOptions* placement);
  absl::StatusOr<const Slot*> EnsureSlot(const ProbedInsn& insn);
  absl::Status EnsureTrampoline(RemoteAddr near);
  absl::Status ReadOriginal(RemoteAddr addr, std::span<uint8_t> out) const;
  absl::Status RemoveBreakpoint(Breakpoint& bp);
  // Runs `fn` (which may run system calls in `tid`) and undoes the loss of a trap that the
  // single-step of a remote system call swallowed.
  absl::Status WithRemoteSyscalls(pid_t tid, const std::function<absl::Status()>& fn);

  absl::StatusOr<user_regs_struct> RegsOf(pid_t tid);
  // ParkCurrentThread's end: `regs` set, SIGSTOP queued for the thread.
  absl::Status Park(pid_t tid, const user_regs_struct& regs);
  // `resumed`: the thread was parked at this breakpoint (ThreadState::parked_at): the probes'
  // handlers ran then and do not run again (return probes track the call again).
  absl::Status OnBreakpoint(pid_t tid, user_regs_struct& regs, Breakpoint& bp, bool resumed);
  // Takes the thread's ThreadState::parked_at; whether it is `at`.
  bool TakeParked(pid_t tid, RemoteAddr at);
  absl::Status OnPostTrap(pid_t tid, user_regs_struct& regs, const Slot& slot);
  absl::Status OnReturn(pid_t tid, user_regs_struct& regs);
  static bool Admit(Probe& p);
  static void Consume(Probe& p);
  void Abandon(Instance& inst);
  void PruneDeadThreads();
  const Slot* SlotContaining(RemoteAddr rip) const;
  // Moves a thread out of an out-of-line copy into the original code (rip updated in
  // `regs`); returns whether it was in one.
  bool MoveOutOfCopy(user_regs_struct& regs) const;
  void Journal(PatchRecord::Kind kind, RemoteAddr addr, std::span<const uint8_t> original,
               std::span<const uint8_t> patched, uint32_t& handle);
  void Unjournal(uint32_t& handle);
  void DropImage();

  ptrace::Process& process_;
  x86::EmulatorMemory memory_;
  XolAreas xol_;
  RemoteAddr trampoline_;  // 0 until a return probe needs it
  std::map<ProbeId, Probe> probes_;
  absl::flat_hash_map<RemoteAddr, Breakpoint> breakpoints_;
  std::map<uint64_t, Slot> slots_;  // by slot address (kept until exec; never moves)
  absl::flat_hash_map<RemoteAddr, uint64_t> slot_of_;     // probed address -> slot address
  absl::flat_hash_map<RemoteAddr, uint64_t> post_traps_;  // INT3 after a copy -> slot address
  absl::flat_hash_map<RemoteAddr, uint8_t> retired_;      // once probed -> original byte
  absl::flat_hash_map<pid_t, ThreadState> threads_;
  ProbeId next_id_ = 1;
  int world_depth_ = 0;
  bool in_handler_ = false;
  bool park_ = false;            // ParkCurrentThread was called by the handler running now
  uint32_t fault_handlers_ = 0;  // registered probes with a fault handler
  pid_t cached_tid_ = 0;         // registers read by Claims, for HandleInPlace
  user_regs_struct cached_regs_{};
  pid_t syscall_tid_ = 0;  // thread running kwatch's remote system calls
  bool swallowed_trap_ = false;
  ptrace::Guardian* guardian_ = nullptr;
  Counters counters_;
  absl::flat_hash_map<pid_t, std::unique_ptr<Int3Engine>> forked_;  // OnFollowedFork, untaken
};

}  // namespace kwatch::core::probe
