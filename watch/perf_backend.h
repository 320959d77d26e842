#pragma once

#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "core/ptrace/process.h"
#include "core/symbols/symbolizer.h"
#include "drmgr/allocator_types.h"
#include "watch/perf_access.h"
#include "watch/perf_breakpoint.h"
#include "watch/perf_util.h"
#include "watch/session.h"
#include "watch/slot_backend.h"

namespace kwatch::watch {

// Stream mode, the perf applier: each debug-register slot drmgr decides for the process is
// one perf hardware-breakpoint event per traced thread, inherited by threads created later,
// sampled into mmap ring buffers. A slot's hits go to every holder whose range the slot's
// chunk overlaps (a split watch gets the hits of each of its chunks; a shared chunk feeds
// several watches; a write-only holder of a read-write slot drops reads). The accessing
// instruction and the access kind of read-write slots come from decoding the code before
// the trap address; data samples carry the user registers after the access, from which the
// exact bytes and, for plain movs, the exact value of the access follow (TrapDecoder).
//
// The kernel reserves a breakpoint's slot when the event is opened, enabled or not: a slot
// that leaves (multiplex rotation, preemption) is closed, after its ring is drained.
class PerfBackend final : public SlotBackend {
 public:
  PerfBackend(core::ptrace::Process& proc, const std::vector<Watch>& watches,
              core::symbols::Symbolizer& symbolizer, const SessionOptions& opts,
              std::map<drmgr::RequestId, uint32_t> owners)
      : SlotBackend(std::move(owners)),
        proc_(proc),
        watches_(watches),
        decoder_(symbolizer, PerfUserRegsMaskGeneral()),
        opts_(opts) {}
  PerfBackend(const PerfBackend&) = delete;
  PerfBackend& operator=(const PerfBackend&) = delete;
  ~PerfBackend() override { Disarm(); }

  BackendKind kind() const override { return BackendKind::kPerf; }
  absl::Status Arm() override { return absl::OkStatus(); }
  absl::Status Apply(const drmgr::Changes& changes) override;
  void Disarm() override;
  void Forget() override { Disarm(); }  // closing perf events is all there is
  std::vector<int> Fds() const override;
  void Collect(std::vector<core::AccessEvent>& out) override;
  uint64_t lost() const override;
  uint64_t unrelated() const override { return unrelated_; }

  // Slots armed now.
  size_t armed_slots() const { return slots_.size(); }
  // How data samples resolved so far (trap addresses decoded, exact addresses and values).
  const TrapDecodeStats& decode_stats() const { return decoder_.stats(); }

 private:
  struct Slot {
    drmgr::Chunk chunk;
    drmgr::DrKind kind = drmgr::DrKind::kWrite;
    std::vector<drmgr::SlotHolder> holders;
    std::vector<std::unique_ptr<PerfBreakpoint>> bps;  // one per thread armed
    pid_t thread = 0;  // a thread scope's slot: its thread (its event is parked at Close)
  };
  using SlotKey = std::pair<drmgr::Scope, int>;

  // Opens the slot's events on every traced thread of the process (scope process) or the one
  // thread (scope thread); all or nothing.
  absl::StatusOr<Slot> Open(const drmgr::SlotChange& change);
  // Drains the slot's rings into `out` (events for its holders).
  void DrainSlot(Slot& slot, std::vector<core::AccessEvent>& out);
  // Closes a slot, keeping what its rings held for the next Collect.
  void Close(Slot& slot);

  core::ptrace::Process& proc_;
  const std::vector<Watch>& watches_;
  TrapDecoder decoder_;
  SessionOptions opts_;
  std::map<SlotKey, Slot> slots_;
  std::vector<core::AccessEvent> pending_;  // drained from slots that closed
  // Events of thread scopes' slots that closed (a per-call watch arms and disarms at every
  // call), drained and disabled, kept per thread for its next slot (PerfBreakpoint::Retarget:
  // no open, mmap, close and munmap per call). The kernel keeps a debug register of their
  // thread reserved for them: a change of any other scope closes them all first.
  std::map<pid_t, std::vector<std::unique_ptr<PerfBreakpoint>>> parked_;
  void CloseParked() { parked_.clear(); }
  uint64_t lost_closed_ = 0;
  uint64_t unrelated_ = 0;
};

}  // namespace kwatch::watch
