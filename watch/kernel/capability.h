#pragma once

#include "absl/strings/string_view.h"

namespace kwatch::watch::kernel {

// Whether the "CapEff:" line of a /proc/PID/status text holds CAP_SYS_ADMIN or CAP_PERFMON,
// either of which lets perf_event_open open breakpoints on kernel addresses
// (perfmon_capable(): CAP_PERFMON since Linux 5.8, else CAP_SYS_ADMIN). False without such a
// line, or when its value is not hexadecimal.
bool CapEffAllowsKernelEvents(absl::string_view proc_status);

// Whether this process may open kernel breakpoint events: root (effective uid 0), or the
// capabilities above in /proc/self/status (false when it cannot be read).
bool HasPerfmonCapability();

}  // namespace kwatch::watch::kernel
