#pragma once

// Whether a probe at an address can take a jump to a trampoline (the agent's fastest path),
// decided from the probed file's code: the agent session before it patches, and --dry-run
// without any target.

#include <vector>

#include "absl/status/status.h"
#include "core/base/remote_addr.h"
#include "core/probe/jump_optimizer.h"
#include "core/ptrace/process.h"
#include "core/symbols/symbols.h"
#include "watch/agent/controller.h"

namespace kwatch::watch::probe {

// The jump optimizer's decision for a probe at `addr` (in `syms`' addresses), the other probes
// being at `all` (they may not lie in the displaced bytes). `syms` null: refused, no symbols.
core::probe::JumpDecision PlanJumpAt(const core::symbols::Symbols* syms, core::RemoteAddr addr,
                                     const std::vector<core::RemoteAddr>& all);

// Places the trampoline of jump probe `index` (in `ctl`'s tables, at `addr`, with the kKwProbeJump
// flag) within reach of `addr`, sets the probe's xol_addr to the displaced instructions inside it,
// and patches the jump in (Controller::Patch: INT3 first; FailedPrecondition when a thread's rip
// is inside the range). Every thread of `proc` stopped. OutOfRange when no trampoline fits near.
absl::Status PatchJumpProbe(agent::Controller& ctl, core::ptrace::Process& proc,
                            const core::probe::JumpPlan& plan, uint32_t index,
                            core::RemoteAddr addr);

}  // namespace kwatch::watch::probe
