#pragma once

#include <sys/types.h>

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/ptrace/process.h"
#include "core/symbols/symbolizer.h"
#include "core/x86/access_regs.h"
#include "drmgr/allocator_types.h"
#include "drmgr/scope.h"
#include "watch/session.h"
#include "watch/slot_backend.h"
#include "watch/trap_breakpoints.h"

namespace kwatch::watch {

// What one thread's debug registers hold of kwatch's: DR0-DR3 and the DR7 encoding of the
// breakpoints kwatch placed in them (perf events, see TrapBreakpoints; ptrace's view of the
// registers shows none of them). A register never armed reads 0.
struct ThreadDebugRegs {
  std::array<uint64_t, 4> addr{};
  uint64_t dr7 = 0;
  bool operator==(const ThreadDebugRegs&) const = default;
};

// The stop applier and stop mode (`kwatch --stop`, `kwatch probe --hw`): drmgr's slots of task
// scopes become breakpoints in the debug registers of the target's threads (a process scope in
// every thread, threads created later included; a thread scope in its thread), each one a
// perf event with sigtrap (TrapBreakpoints), so that none outlives kwatch, not even a SIGKILL
// of kwatch. Each access then stops the thread with SIGTRAP (TRAP_PERF): the event's sig_data
// names the register, kwatch decodes the accessing instruction (the other registers whose
// bytes it touched fired too: one access sends one SIGTRAP), reads the value right there and
// takes the old value from a shadow copy of the watched bytes (seeded when a slot is armed,
// updated at each event).
//
// Slot indices of drmgr are per scope; a thread carrying slots of its process scope and of its
// own scope gets them in distinct physical registers (process slot i prefers DRi).
//
// The kernel counts each event against the thread's four registers while it is open: a slot
// held by someone else makes Apply fail with ENOSPC; Disarm frees them.
//
// Owned by the session, used from the thread that owns `proc`; registers itself as the
// Process's signal interceptor while armed. `watches` and `symbolizer` must outlive it.
class StopBackend final : public SlotBackend, public core::ptrace::SignalInterceptor {
 public:
  // `watches` are indexed by Watch::id; `owners` maps allocator requests to watch ids.
  StopBackend(core::ptrace::Process& proc, const std::vector<Watch>& watches,
              core::symbols::Symbolizer& symbolizer, std::map<drmgr::RequestId, uint32_t> owners);
  ~StopBackend() override;
  StopBackend(const StopBackend&) = delete;
  StopBackend& operator=(const StopBackend&) = delete;

  // ---- WatchBackend / SlotBackend ----
  BackendKind kind() const override { return BackendKind::kStop; }
  // Becomes the Process's interceptor; writes nothing (Apply does).
  absl::Status Arm() override;
  // Stops every thread, places the breakpoints the changes ask for in every thread concerned,
  // resumes. All or nothing: on error every thread's breakpoints are put back. InvalidArgument
  // for a CPU scope or another process's scope; ResourceExhausted (ENOSPC) with
  // refused_scope() set when the kernel counts a slot as held outside kwatch.
  absl::Status Apply(const drmgr::Changes& changes) override;
  // Closes every breakpoint (the threads need not stop); traps raised before are claimed and
  // dropped.
  void Disarm() override;
  void Forget() override;
  void Collect(std::vector<core::AccessEvent>& out) override;
  uint64_t unrelated() const override { return unrelated_; }

  // ---- SignalInterceptor ----
  // A trap of kwatch's breakpoints (IsOwnTrap) while armed, or late after Disarm.
  bool Claims(pid_t tid, const siginfo_t& si) override;
  // SIGTRAP, TRAP_PERF, with the sig_data of a kwatch breakpoint.
  static bool IsOwnTrap(const siginfo_t& si) { return IsTrapBreakpointSignal(si); }
  absl::Status Handle(pid_t tid, const siginfo_t& si) override;
  // Always handled in place: only `tid`'s registers and memory are read.
  absl::StatusOr<bool> HandleInPlace(pid_t tid, const siginfo_t& si) override;
  // Nothing to undo: a fork child inherits none of kwatch's breakpoints (no inherit), and
  // kwatch writes no debug register through ptrace.
  absl::Status OnFork(core::ptrace::Process& child) override;
  // Places the process scope's slots in the new thread (and closes the breakpoints of
  // threads that exited meanwhile).
  absl::Status OnThreadStart(pid_t tid) override;

  // Accesses of the watches `sync` picks (by owner id; --follow's pointers) are not collected:
  // each goes to `hook` while every thread of the process is stopped (the trapping one right
  // after its access), so that the hook may change the slots (Apply, inside a HoldStopped)
  // before any thread runs on. An error of the hook ends the session.
  using SyncHook = std::function<absl::Status(const core::AccessEvent& ev)>;
  void SetSyncHook(std::function<bool(uint32_t owner)> sync, SyncHook hook) {
    sync_ = std::move(sync);
    sync_hook_ = std::move(hook);
  }

  // Registers kwatch placed in thread `tid` (zero when none).
  ThreadDebugRegs RegistersOf(pid_t tid) const;
  // The perf events behind them.
  const TrapBreakpoints& breakpoints() const { return bps_; }
  // Reads removed from write-only holders of read-write slots.
  uint64_t reads_filtered() const { return reads_filtered_; }
  // Traps of a breakpoint kwatch no longer had (closed or replaced before the trap was seen).
  uint64_t stray_traps() const { return stray_traps_; }

 private:
  using SlotKey = std::pair<drmgr::Scope, int>;  // drmgr's scope and slot index
  struct Armed {
    drmgr::Chunk chunk;
    drmgr::DrKind kind = drmgr::DrKind::kWrite;
    std::vector<drmgr::SlotHolder> holders;
  };
  // A thread's registers and which slot sits in each physical register.
  struct ThreadState {
    ThreadDebugRegs regs;
    std::array<std::optional<SlotKey>, 4> phys;
  };
  // The watched bytes of one holder as last seen.
  struct Shadow {
    uint64_t addr = 0;
    std::vector<uint8_t> bytes;
  };

  // The registers `tid` should hold under `slots`, keeping physical registers stable from
  // `cur`. ResourceExhausted (never expected: drmgr gives no thread more than 4 slots).
  static absl::StatusOr<ThreadState> Layout(pid_t tid, const std::map<SlotKey, Armed>& slots,
                                            const ThreadState& cur);
  // Makes the breakpoints of thread `tid` go from `cur` to `want` (the changed registers closed
  // first, then opened). On ENOSPC `*refused` is the physical register refused.
  absl::Status WriteRegs(pid_t tid, const ThreadState& cur, const ThreadState& want, int* refused);
  void SeedShadows(const std::map<SlotKey, Armed>& slots);
  void RefreshShadow(drmgr::RequestId id);
  // Turns the trap into events. With `in_place` (only `tid` stopped), returns false without
  // changing anything when an event goes to the sync hook (it needs every thread stopped).
  absl::StatusOr<bool> OnTrap(pid_t tid, const siginfo_t& si, bool in_place);

  core::ptrace::Process& proc_;
  const std::vector<Watch>& watches_;
  core::symbols::Symbolizer& symbolizer_;
  bool armed_ = false;
  bool draining_ = false;           // disarmed: SIGTRAPs queued before are claimed and dropped
  std::map<SlotKey, Armed> slots_;  // applied
  std::map<pid_t, ThreadState> threads_;  // threads with breakpoints placed
  TrapBreakpoints bps_;                   // their perf events
  std::map<drmgr::RequestId, Shadow> shadows_;
  // How each accessing instruction's value is recovered from the registers (nullopt: it does
  // not decode), by instruction address.
  absl::flat_hash_map<uint64_t, std::optional<core::x86::AccessPlan>> plans_;
  std::vector<core::AccessEvent> events_;
  std::function<bool(uint32_t owner)> sync_;
  SyncHook sync_hook_;
  uint64_t unrelated_ = 0;
  uint64_t reads_filtered_ = 0;
  uint64_t stray_traps_ = 0;
};

}  // namespace kwatch::watch
