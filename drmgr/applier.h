#pragma once

#include <optional>

#include "absl/status/status.h"
#include "drmgr/allocator_types.h"
#include "drmgr/scope.h"

// The contract between drmgr's decisions and whatever makes them real in debug registers.
// SlotAllocator decides (pure logic); an Applier writes (perf_event_open breakpoints,
// ptrace, or drmgr/simulator.h's in-memory registers); ApplyWithRetry is the one glue between
// the two when the kernel counts registers drmgr does not know about. The same split as gdb's
// x86 debug-register code, where the low-level writers are apart from the sharing logic.
namespace kwatch::drmgr {

// Makes SlotAllocator change lists real. Implementations: the perf and stop backends
// (watch/), the kernel-watch breakpoints (watch/kernel/kernel_slots.h), Simulator (tests). An
// applier is owned and called by one thread (the session's), like the allocator it follows.
class Applier {
 public:
  virtual ~Applier() = default;

  // Applies the changes in order, all or nothing: on error the registers are as before.
  // ResourceExhausted when the kernel refused a slot (ENOSPC: held outside kwatch, e.g. by a
  // debugger or another tool); refused_scope() then names the scope of the refused arm.
  // Other errors as the applier's mechanism reports them.
  virtual absl::Status Apply(const Changes& changes) = 0;

  // After Apply failed with ResourceExhausted: the scope in which the kernel refused a slot,
  // for SlotAllocator::ReportNoSpace. nullopt after a successful Apply, after any other error,
  // and when the applier cannot tell which scope was refused.
  virtual std::optional<Scope> refused_scope() const = 0;

 protected:
  // Copied and moved only as part of an implementation (no slicing through the interface).
  Applier() = default;
  Applier(const Applier&) = default;
  Applier& operator=(const Applier&) = default;
  Applier(Applier&&) = default;
  Applier& operator=(Applier&&) = default;
};

class SlotAllocator;

// Applies `changes` (a change list `alloc` just returned) with `applier`. While the kernel
// refuses a slot (Apply fails with ResourceExhausted and a refused_scope()), tells `alloc`
// that one more register of that scope is held outside kwatch (ReportNoSpace), which decides
// again from the state before the refused list, and applies that decision instead; at most
// kNumDebugRegisters + 1 times. A request that loses its hardware this way is left by `alloc`
// in the state its policy gives, with drmgr's reason ("... held outside kwatch"): read it with
// SlotAllocator::Describe. OK once a change list is applied. Otherwise the last Apply's error
// (also when ReportNoSpace refuses: every register of the scope is already counted as
// external); the registers are then as before the call, while `alloc` holds a decision that
// is not in them (callers give up on the session, or the request).
absl::Status ApplyWithRetry(SlotAllocator& alloc, Applier& applier, Changes changes);

}  // namespace kwatch::drmgr
