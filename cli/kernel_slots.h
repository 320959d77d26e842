#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "drmgr/allocator_types.h"
#include "drmgr/slot_allocator.h"
#include "watch/perf_breakpoint.h"

namespace kwatch::cli {

// One debug register of a kernel session in use: the perf breakpoint that holds it and the
// watches its events go to (several when drmgr shares one slot between equal ranges).
struct KernelBreakpoint {
  std::unique_ptr<watch::PerfBreakpoint> bp;
  std::vector<size_t> watches;
  int cpu = -1;   // kernel watches: the CPU (-1: a --kernel-accesses breakpoint, per task)
  int slot = -1;  // drmgr's slot index on that CPU
};

// The debug registers of kernel watches, allocated by drmgr: one request per (watch, CPU) in
// CPU scope (priority of a watchpoint, policy kFail: kernel watches have no page fallback),
// each decision applied as CPU-wide perf breakpoints (pid -1). When the kernel refuses a
// register (ENOSPC: held by another tool on that CPU), the breakpoints opened for that change
// list are closed, drmgr is told (ReportNoSpace) and decides again. drmgr's reasons name
// requests; the errors here name watches ("watch #2 jiffies").
//
// Owns the allocator and the breakpoints. Not thread-safe: the session's thread calls it.
class KernelSlots {
 public:
  // `opened`: how every breakpoint is opened (kind, callchain, ring); its addr, len and cpu
  // come from each slot. `labels[i]` names watch i ("jiffies").
  KernelSlots(watch::BreakpointRequest opened, std::vector<std::string> labels);

  // Asks for watch `w`'s `len` bytes at `addr` on `cpu` and opens what drmgr decides. On
  // success the watch holds registers on that CPU (split into aligned chunks if needed).
  // ResourceExhausted with drmgr's reason when it gets none (every register of the CPU in use
  // by other watches or held outside kwatch); other perf_event_open errors as they are. On
  // error, the breakpoints of other requests are as before.
  absl::Status Request(size_t w, uint64_t addr, uint64_t len, int cpu);

  // Releases every request on `cpu` (it went offline) and returns its breakpoints, closed by
  // the caller once their counts are read (drain their rings first).
  std::vector<KernelBreakpoint> ReleaseCpu(int cpu);

  std::vector<KernelBreakpoint>& armed() { return armed_; }
  drmgr::AllocatorSnapshot Snapshot() const { return alloc_.Snapshot(); }

  // drmgr's text with its request names replaced by the watches users know.
  std::string PeopleReason(const std::string& reason) const;

 private:
  // Makes `changes` real: all or nothing for the arms (a refused one closes those opened
  // here). ResourceExhausted from the kernel sets `refused_cpu`.
  absl::Status Apply(const drmgr::Changes& changes, int* refused_cpu);

  watch::BreakpointRequest opened_;
  std::vector<std::string> labels_;
  drmgr::SlotAllocator alloc_;
  drmgr::ClientId client_;
  std::map<drmgr::RequestId, std::pair<size_t, int>> owner_;  // request -> (watch, cpu)
  std::vector<KernelBreakpoint> armed_;
};

}  // namespace kwatch::cli
