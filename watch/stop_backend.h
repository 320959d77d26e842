#pragma once

#include <sys/types.h>

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/process.h"
#include "core/symbolizer.h"
#include "drmgr/allocator_types.h"
#include "drmgr/scope.h"
#include "watch/session.h"
#include "watch/slot_backend.h"

namespace kwatch::watch {

// What one thread's debug registers hold: DR0-DR3 and DR7 as kwatch wrote them through
// PTRACE_POKEUSER (a register never written reads 0).
struct ThreadDebugRegs {
  std::array<uint64_t, 4> addr{};
  uint64_t dr7 = 0;
  bool operator==(const ThreadDebugRegs&) const = default;
};

// The ptrace applier and stop mode (`kwatch --stop`): drmgr's slots of task scopes are written
// into DR0-DR3 and DR7 of the target's threads with PTRACE_POKEUSER (a process scope in every
// thread, threads created later included; a thread scope in its thread). Each access then
// stops the thread with SIGTRAP (TRAP_HWBKPT): kwatch reads DR6 for the slots that fired,
// decodes the accessing instruction, reads the value right there and takes the old value from
// a shadow copy of the watched bytes (seeded when a slot is armed, updated at each event).
//
// Slot indices of drmgr are per scope; a thread carrying slots of its process scope and of its
// own scope gets them in distinct physical registers (process slot i prefers DRi).
//
// The kernel makes each ptrace debug register a perf event, counted against the thread's four
// slots from the first write of DRn on, enabled or not, until the thread exits or execs
// (Linux 6.1; PTRACE_DETACH keeps them too): a slot held by someone else makes the write fail
// with ENOSPC, and a slot kwatch once wrote stays counted after Disarm.
//
// Owned by the session, used from the thread that owns `proc`; registers itself as the
// Process's signal interceptor while armed. `watches` and `symbolizer` must outlive it.
class StopBackend : public SlotBackend, public core::SignalInterceptor {
 public:
  // `watches` are indexed by Watch::id; `owners` maps allocator requests to watch ids.
  StopBackend(core::Process& proc, const std::vector<Watch>& watches, core::Symbolizer& symbolizer,
              std::map<drmgr::RequestId, uint32_t> owners);
  ~StopBackend() override;
  StopBackend(const StopBackend&) = delete;
  StopBackend& operator=(const StopBackend&) = delete;

  // ---- WatchBackend / SlotBackend ----
  BackendKind kind() const override { return BackendKind::kStop; }
  // Becomes the Process's interceptor; writes nothing (Apply does).
  absl::Status Arm() override;
  // Stops every thread, writes the registers the changes ask for in every thread concerned,
  // resumes. All or nothing: on error every thread's registers are put back. InvalidArgument
  // for a CPU scope or another process's scope; ResourceExhausted (ENOSPC) with
  // refused_scope() set when the kernel counts a slot as held outside kwatch.
  absl::Status Apply(const drmgr::Changes& changes) override;
  // Clears DR7 and DR0-DR3 of every thread (the kernel keeps the slots counted, see above).
  void Disarm() override;
  void Forget() override;
  void Collect(std::vector<core::AccessEvent>& out) override;
  uint64_t unrelated() const override { return unrelated_; }

  // ---- SignalInterceptor ----
  // SIGTRAP with si_code TRAP_HWBKPT while armed.
  bool Claims(pid_t tid, const siginfo_t& si) override;
  absl::Status Handle(pid_t tid, const siginfo_t& si) override;
  // Always handled in place: only `tid`'s registers and the watched bytes are read.
  absl::StatusOr<bool> HandleInPlace(pid_t tid, const siginfo_t& si) override;
  // The kernel gives a fork child no ptrace breakpoint but copies the DR7 (and DR6) value
  // ptrace shows: both are cleared in the child.
  absl::Status OnFork(core::Process& child) override;
  // Writes the process scope's slots into the new thread.
  absl::Status OnThreadStart(pid_t tid) override;

  // Registers kwatch wrote in thread `tid` (zero when none).
  ThreadDebugRegs RegistersOf(pid_t tid) const;
  // Reads removed from write-only holders of read-write slots.
  uint64_t reads_filtered() const { return reads_filtered_; }
  // Traps whose DR6 named no slot kwatch armed.
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
  absl::StatusOr<ThreadState> Layout(pid_t tid, const std::map<SlotKey, Armed>& slots,
                                     const ThreadState& cur) const;
  // Writes `want` over `cur` in stopped thread `tid` (disable changed slots, addresses, DR7).
  // On ENOSPC `*refused` is the physical register refused.
  static absl::Status WriteRegs(pid_t tid, const ThreadState& cur, const ThreadState& want,
                                int* refused);
  void SeedShadows(const std::map<SlotKey, Armed>& slots);
  void RefreshShadow(drmgr::RequestId id);
  absl::Status OnTrap(pid_t tid);

  core::Process& proc_;
  const std::vector<Watch>& watches_;
  core::Symbolizer& symbolizer_;
  bool armed_ = false;
  bool draining_ = false;           // disarmed: SIGTRAPs queued before are claimed and dropped
  std::map<SlotKey, Armed> slots_;  // applied
  std::map<pid_t, ThreadState> threads_;  // threads with registers written
  std::map<drmgr::RequestId, Shadow> shadows_;
  std::vector<core::AccessEvent> events_;
  uint64_t unrelated_ = 0;
  uint64_t reads_filtered_ = 0;
  uint64_t stray_traps_ = 0;
};

}  // namespace kwatch::watch
