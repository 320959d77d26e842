#pragma once

// Per-call watches in the target (issue: watches armed by code, item 6): the in-process agent
// numbers each call of a watched function at its entry (a return probe), looks its objects up at
// the lookup point and arms each in a perf breakpoint of the calling thread that the agent opened
// in the target (PERF_EVENT_IOC_MODIFY_ATTRIBUTES: retargeted and enabled in one ioctl), and
// disables it at the call's end (agent/abi.h "Per-call watches"). No thread stops for a call:
// the probes are jumps to trampolines, the return goes through the agent's return trampoline.
//
// kwatch stays the tracer of the watch session and the reader: the agent copies each call's
// samples into its own ring at the call's end (they outlive the process); a call still running
// is read live at each drain through kwatch's mapping of the same perf ring (a copy of the
// breakpoint's fd by pidfd_getfd), and the end's copy is skipped up to what was read (ring
// positions). Samples of the agent's own code (its trampolines pushing registers over a
// returned call's frame) are dropped and counted.
//
// Only when every probe can be a jump: an INT3 probe would stop the traced thread for kwatch
// anyway, so the ptrace path is as good (StartAgentCalls says why it refused).

#include <memory>

#include "absl/status/statusor.h"
#include "core/ptrace/process.h"
#include "watch/call_watches.h"

namespace kwatch::watch::probe {

struct AgentCallsOptions {
  uint32_t ring_pages = 32;  // data pages of each breakpoint's ring (a power of two)
};

// Loads the agent into `proc` (every thread stopped by kwatch) and plants `plan`. Unavailable
// or FailedPrecondition, naming why, when the agent cannot take it (nothing is left patched).
absl::StatusOr<std::unique_ptr<CallAgent>> StartAgentCalls(core::ptrace::Process& proc,
                                                           CallWatches& calls,
                                                           const CallAgentPlan& plan,
                                                           const AgentCallsOptions& options = {});

}  // namespace kwatch::watch::probe
