#pragma once

// `kwatch probe --backend ptrace`: the INT3 engine (core/probe/int3_engine.h) on a launched
// or attached process, every patch journaled by a guardian process; with follow_forks, the
// children it forks are probed too (their engines adopt the parent's probes at the fork).

#include <memory>

#include "absl/status/statusor.h"
#include "core/base/unique_fd.h"
#include "watch/probe/probe_session.h"
#include "watch/probe/probe_set.h"

namespace kwatch::watch::probe {

// Launches the command or attaches to `pid`, finds the probed file's load bias, starts the
// guardian, opens the recording, registers every probe with the world stopped, begins
// through `hooks` and resumes the target. On error the target is restored and let go (a
// launched target that never ran its own code is killed).
absl::StatusOr<std::unique_ptr<ProbeSession>> StartPtraceSession(const ProbeSessionOptions& opts,
                                                                 const ProbeSet& set,
                                                                 core::UniqueFd sigfd,
                                                                 const ProbeSessionHooks& hooks);

}  // namespace kwatch::watch::probe
