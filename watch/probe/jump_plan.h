#pragma once

// Whether a probe at an address can take a jump to a trampoline (the agent's fastest path),
// decided from the probed file's code: the agent session before it patches, and --dry-run
// without any target.

#include <vector>

#include "core/base/remote_addr.h"
#include "core/probe/jump_optimizer.h"
#include "core/symbols/symbols.h"

namespace kwatch::watch::probe {

// The jump optimizer's decision for a probe at `addr` (in `syms`' addresses), the other probes
// being at `all` (they may not lie in the displaced bytes). `syms` null: refused, no symbols.
core::probe::JumpDecision PlanJumpAt(const core::symbols::Symbols* syms, core::RemoteAddr addr,
                                     const std::vector<core::RemoteAddr>& all);

}  // namespace kwatch::watch::probe
