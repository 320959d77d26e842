#pragma once

// The joiner's side of `kwatch probe SPEC -p PID` on a process that another kwatch session
// already traces (docs/gdbserver.md, "Joining"): instead of failing with "already traced", it
// joins that session through its control socket (cli/join_socket.h). The session places the
// probes in its own INT3 engine (the ptrace path: the agent needs kwatch to be the target's only
// tracer), fetches their arguments at each hit and sends the hits (cli/probe_join_wire.h); this
// side runs them through the same output as any `kwatch probe` (filter, tally, --agg, -o, the
// text or JSON printer), so the lines and the summary are those of `--backend ptrace`.

#include <memory>

#include "absl/status/statusor.h"
#include "cli/join_socket.h"
#include "cli/probe_run.h"
#include "core/base/unique_fd.h"
#include "watch/probe/probe_session.h"
#include "watch/probe/probe_set.h"

namespace kwatch::cli {

// What `kwatch probe` cannot join a session with, by option ("--hw (...)"); nullptr when `opts`
// can join.
const char* ProbeOptionThatCannotJoin(const ProbeCmdOptions& opts);

// Joins the session of `tracer` over *opts.session.pid with the probes of `set`: computes the
// probed file's load bias from /proc/PID/maps, opens the recording (hooks), asks the session to
// place the probes and checks that it resolved them to the same addresses, then begins through
// `hooks`. Stops on the target's end (the session says so), --count, --duration, a stop signal
// read from `sigfd`, or the session going away; Finish asks the session to take the probes out
// and prints nothing itself. Errors: the session cannot be reached, or refused (its message).
absl::StatusOr<std::unique_ptr<watch::probe::ProbeSession>> StartJoinedProbeSession(
    const ProbeCmdOptions& opts, const watch::probe::ProbeSet& set, core::UniqueFd sigfd,
    const watch::probe::ProbeSessionHooks& hooks, const KwatchTracer& tracer);

}  // namespace kwatch::cli
