#pragma once

// `kwatch probe --backend uprobe`: the kernel's uprobe PMU (watch/uprobe_event.h). The
// kernel runs the breakpoint; the session reads samples (registers and a slice of the user
// stack) from per-CPU rings and evaluates the arguments from them afterwards. No ptrace, no
// code change to undo: closing the events removes the probes.

#include <memory>

#include "absl/status/statusor.h"
#include "core/base/unique_fd.h"
#include "watch/probe/probe_session.h"
#include "watch/probe/probe_set.h"

namespace kwatch::watch::probe {

// Launches the command (stopped after exec, then let go: no tracer), or checks the process
// given with `pid`, or with neither probes every process running the file; opens one uprobe
// event per probe (on every process, hits of others filtered out), opens the recording and
// begins through `hooks`. On error nothing is left: a launched target is killed.
absl::StatusOr<std::unique_ptr<ProbeSession>> StartUprobeSession(const ProbeSessionOptions& opts,
                                                                 const ProbeSet& set,
                                                                 core::UniqueFd sigfd,
                                                                 const ProbeSessionHooks& hooks);

}  // namespace kwatch::watch::probe
