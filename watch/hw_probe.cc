#include "watch/hw_probe.h"

#include <sys/utsname.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "core/base/remote_addr.h"
#include "drmgr/debug_regs.h"
#include "watch/perf_breakpoint.h"

namespace kwatch::watch {

namespace {

// The running kernel's release (uname -r), or "unknown".
std::string KernelRelease() {
  utsname u{};
  if (::uname(&u) != 0) {
    return "unknown";
  }
  return u.release;
}

// Stores i to *target n times; noinline so that every store is a real one, in one place.
__attribute__((noinline)) void WriteWatched(volatile uint64_t* target, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i) {
    *target = i;
  }
}

DebugTrapProbe RunProbe() {
  DebugTrapProbe probe;
  const std::string kernel = absl::StrCat("(kernel ", KernelRelease(), ")");

  // Declared before the breakpoint so that it outlives it.
  alignas(8) volatile uint64_t target = 0;
  BreakpointRequest req;
  req.addr = core::RemoteAddr{reinterpret_cast<uintptr_t>(&target)};
  req.len = sizeof(target);
  req.kind = drmgr::DrKind::kWrite;
  req.tid = ::gettid();
  req.inherit = false;
  req.exclude_kernel = true;
  req.ring_pages = 0;  // counting only
  absl::StatusOr<std::unique_ptr<PerfBreakpoint>> bp = PerfBreakpoint::Open(req);
  if (!bp.ok()) {
    probe.detail = absl::StrCat(
        "the kernel refused a hardware breakpoint, so kwatch cannot watch memory here: ",
        bp.status().message(), " ", kernel);
    return probe;
  }

  WriteWatched(&target, kDebugTrapProbeWrites);
  const absl::StatusOr<uint64_t> count = (*bp)->Count();
  bp->reset();  // close now: never leave a breakpoint on the stack behind
  probe.writes = kDebugTrapProbeWrites;
  if (!count.ok()) {
    probe.detail =
        absl::StrCat("the kernel accepted a hardware breakpoint but its count could not be read: ",
                     count.status().message(), " ", kernel);
    return probe;
  }

  probe.accepted = true;
  probe.counted = *count;
  probe.delivered = probe.counted == probe.writes;
  if (probe.delivered) {
    probe.detail = absl::StrCat("hardware breakpoints work: all ", probe.writes,
                                " watched writes trapped ", kernel);
  } else if (probe.counted == 0) {
    probe.detail = absl::StrCat(
        "the kernel accepts hardware breakpoints but none of ", probe.writes,
        " watched writes trapped: this machine's hypervisor does not deliver debug-register "
        "traps ",
        kernel);
  } else {
    probe.detail = absl::StrCat("the kernel accepts hardware breakpoints but only ", probe.counted,
                                " of ", probe.writes,
                                " watched writes trapped: debug-register traps are lost on this "
                                "machine ",
                                kernel);
  }
  return probe;
}

}  // namespace

const DebugTrapProbe& ProbeDebugTraps() {
  // A function-local static: initialized once, thread-safe (C++11 and later).
  static const DebugTrapProbe* const kProbe = new DebugTrapProbe(RunProbe());
  return *kProbe;
}

}  // namespace kwatch::watch
