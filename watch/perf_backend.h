#pragma once

#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "core/process.h"
#include "core/symbolizer.h"
#include "drmgr/allocator_types.h"
#include "watch/perf_breakpoint.h"
#include "watch/session.h"
#include "watch/slot_backend.h"

namespace kwatch::watch {

// Stream mode, the perf applier: each debug-register slot drmgr decides for the process is
// one perf hardware-breakpoint event per traced thread, inherited by threads created later,
// sampled into mmap ring buffers. A slot's hits go to every holder whose range the slot's
// chunk overlaps (a split watch gets the hits of each of its chunks; a shared chunk feeds
// several watches; a write-only holder of a read-write slot drops reads). The accessing
// instruction and the access kind of read-write slots come from decoding the code before
// the trap address.
//
// The kernel reserves a breakpoint's slot when the event is opened, enabled or not: a slot
// that leaves (multiplex rotation, preemption) is closed, after its ring is drained.
class PerfBackend : public SlotBackend {
 public:
  PerfBackend(core::Process& proc, const std::vector<Watch>& watches, core::Symbolizer& symbolizer,
              const SessionOptions& opts, std::map<drmgr::RequestId, uint32_t> owners)
      : SlotBackend(std::move(owners)),
        proc_(proc),
        watches_(watches),
        symbolizer_(symbolizer),
        opts_(opts) {}
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

 private:
  struct Slot {
    drmgr::Chunk chunk;
    drmgr::DrKind kind = drmgr::DrKind::kWrite;
    std::vector<drmgr::SlotHolder> holders;
    std::vector<std::unique_ptr<PerfBreakpoint>> bps;  // one per thread armed
  };
  using SlotKey = std::pair<drmgr::Scope, int>;
  // The memory operand of the instruction before a trap address, when its address does not
  // depend on registers (a sample has none): RIP-relative and absolute operands.
  struct Operand {
    bool known = false;
    uint64_t addr = 0;
    uint32_t size = 0;
  };
  const Operand& OperandAt(core::RemoteAddr trap_ip, const core::AccessSite& site);

  // Opens the slot's events on every traced thread of the process (scope process) or the one
  // thread (scope thread); all or nothing.
  absl::StatusOr<Slot> Open(const drmgr::SlotChange& change) const;
  // Drains the slot's rings into `out` (events for its holders).
  void DrainSlot(Slot& slot, std::vector<core::AccessEvent>& out);
  // Closes a slot, keeping what its rings held for the next Collect.
  void Close(Slot& slot);

  core::Process& proc_;
  const std::vector<Watch>& watches_;
  core::Symbolizer& symbolizer_;
  SessionOptions opts_;
  std::map<SlotKey, Slot> slots_;
  absl::flat_hash_map<uint64_t, Operand> operands_;  // by trap address
  std::vector<core::AccessEvent> pending_;           // drained from slots that closed
  uint64_t lost_closed_ = 0;
  uint64_t unrelated_ = 0;
};

}  // namespace kwatch::watch
