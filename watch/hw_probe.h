#pragma once

#include <cstdint>
#include <string>

namespace kwatch::watch {

// How many watched writes ProbeDebugTraps() performs.
inline constexpr uint64_t kDebugTrapProbeWrites = 64;

// Whether this machine delivers debug-register traps, as measured by ProbeDebugTraps().
// Some KVM guests (e.g. Firecracker/PVM-style hypervisors) let the kernel accept hardware
// breakpoints and account for the 4 debug registers, yet never deliver the #DB traps: the
// breakpoints open fine and stay silent.
struct DebugTrapProbe {
  // The kernel accepted a hardware write breakpoint and reported its count.
  bool accepted = false;
  // Every watched write trapped (counted == writes).
  bool delivered = false;
  // Watched writes performed (0 when the breakpoint was refused) and hits the kernel counted.
  uint64_t writes = 0;
  uint64_t counted = 0;
  // One sentence a user can read, naming the kernel release: what was measured and, when
  // traps do not work, why (the perf_event_open error with its advice, or the hypervisor).
  std::string detail;
};

// Checks once per process whether debug-register traps are delivered: opens a counting write
// breakpoint (no ring) on a local variable for the calling thread, performs
// kDebugTrapProbeWrites volatile writes to it, reads the count and closes the breakpoint
// before returning, on every path. The first call needs one free debug register on the
// calling thread (otherwise the probe reports the ENOSPC error as not accepted). Later calls
// return the same object. Thread-safe.
const DebugTrapProbe& ProbeDebugTraps();

}  // namespace kwatch::watch
