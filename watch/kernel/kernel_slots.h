#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "drmgr/allocator_types.h"
#include "drmgr/applier.h"
#include "drmgr/scope.h"
#include "drmgr/slot_allocator.h"
#include "watch/perf_breakpoint.h"

namespace kwatch::watch::kernel {

// One debug register of a kernel session in use: the perf breakpoint that holds it and the
// watches its events go to (several when drmgr shares one slot between equal ranges).
struct KernelBreakpoint {
  std::unique_ptr<watch::PerfBreakpoint> bp;
  std::vector<size_t> watches;
  int cpu = -1;   // kernel watches: the CPU (-1: a --kernel-accesses breakpoint, per thread)
  int slot = -1;  // drmgr's slot index in its scope (that CPU, or the process)
  pid_t tid = 0;  // --kernel-accesses: the thread it was opened on (new threads inherit it)
};

// The debug registers of kernel sessions, allocated by drmgr (priority of a watchpoint, policy
// kFail: nothing falls back to pages, which cannot protect the kernel nor see its accesses):
//  - kernel watches: one request per (watch, CPU) in CPU scope, each decision applied as
//    CPU-wide perf breakpoints (pid -1);
//  - --kernel-accesses of a process: one request per watch in the process's scope, each
//    decision applied as one inherited breakpoint per thread (exclude_user).
// When the kernel refuses a register (ENOSPC: held by another tool on that CPU or thread), the
// breakpoints opened for that change list are closed, drmgr is told (drmgr::ApplyWithRetry)
// and decides again. drmgr's reasons name requests; the errors here name watches ("watch #2
// jiffies").
//
// Owns the allocator and the breakpoints. Not thread-safe: the session's thread calls it.
class KernelSlots {
 public:
  // Kernel watches. `opened`: how every breakpoint is opened (kind, callchain, ring); its
  // addr, len and cpu come from each slot. `labels[i]` names watch i ("jiffies").
  KernelSlots(watch::BreakpointRequest opened, std::vector<std::string> labels);
  // --kernel-accesses of process `pid`: `threads` lists its threads when a slot is opened
  // (called while the process is stopped, so that no thread is missed).
  KernelSlots(watch::BreakpointRequest opened, std::vector<std::string> labels, pid_t pid,
              std::function<std::vector<pid_t>()> threads);

  // Asks for watch `w`'s `len` bytes at `addr` on `cpu` (kernel watches) and opens what drmgr
  // decides. On success the watch holds registers on that CPU (split into aligned chunks if
  // needed). ResourceExhausted with drmgr's reason when it gets none (every register of the
  // CPU in use by other watches or held outside kwatch); other perf_event_open errors as they
  // are. On error, the breakpoints of other requests are as before.
  absl::Status Request(size_t w, uint64_t addr, uint64_t len, int cpu);

  // The same for --kernel-accesses: the process's scope, a breakpoint on each of its threads.
  absl::Status RequestForProcess(size_t w, uint64_t addr, uint64_t len);

  // Releases every request on `cpu` (it went offline) and returns its breakpoints, closed by
  // the caller once their counts are read (drain their rings first).
  std::vector<KernelBreakpoint> ReleaseCpu(int cpu);

  std::vector<KernelBreakpoint>& armed() { return armed_; }
  drmgr::AllocatorSnapshot Snapshot() const { return alloc_.Snapshot(); }

  // drmgr's text with its request names replaced by the watches users know.
  std::string PeopleReason(const std::string& reason) const;

 private:
  // Asks drmgr for watch `w` in `scope` and makes its decision real.
  absl::Status RequestIn(size_t w, uint64_t addr, uint64_t len, const drmgr::Scope& scope);
  // Makes `changes` real: all or nothing for the arms (a refused one closes those opened
  // here). ResourceExhausted from the kernel sets `refused`, the scope it refused.
  absl::Status Apply(const drmgr::Changes& changes, std::optional<drmgr::Scope>* refused);

  // The drmgr::Applier of these breakpoints, for drmgr::ApplyWithRetry: Apply above, with the
  // scope the kernel refused kept for refused_scope(). Lives for one RequestIn call. As before,
  // all or nothing for the arms only: a refused list's disarms stay done (a closed breakpoint
  // is not reopened).
  class Writer final : public drmgr::Applier {
   public:
    explicit Writer(KernelSlots& slots) : slots_(slots) {}
    absl::Status Apply(const drmgr::Changes& changes) override {
      refused_.reset();
      return slots_.Apply(changes, &refused_);
    }
    std::optional<drmgr::Scope> refused_scope() const override { return refused_; }

   private:
    KernelSlots& slots_;
    std::optional<drmgr::Scope> refused_;
  };

  watch::BreakpointRequest opened_;
  std::vector<std::string> labels_;
  pid_t pid_ = 0;                                // --kernel-accesses: the process
  std::function<std::vector<pid_t>()> threads_;  // ... its threads
  drmgr::SlotAllocator alloc_;
  drmgr::ClientId client_;
  std::map<drmgr::RequestId, std::pair<size_t, int>> owner_;  // request -> (watch, cpu or -1)
  std::vector<KernelBreakpoint> armed_;
};

}  // namespace kwatch::watch::kernel
