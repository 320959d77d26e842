#pragma once

// `kwatch probe --backend agent`: the probes run inside the target, by libkwatch-agent.so
// (docs/agent.md). kwatch launches or attaches with ptrace, loads the agent
// (watch/agent/loader.h), places each probe, lets the target go entirely (no ptrace while it
// runs) and reads the agent's rings; at the end it seizes the target again and puts every byte
// back. If kwatch dies, the agent's watchdog restores the code itself.
//
// Each probe takes one of two paths, decided when it is placed:
//  - "jump": its instructions covering 5 bytes become a jmp to a trampoline that calls the
//    agent (no trap), when the jump optimizer (core/probe/jump_optimizer.h) accepts it;
//  - "int3": an INT3 the agent's SIGTRAP handler takes, the instruction emulated or run out
//    of line; the summary says why the jump was refused.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "core/base/unique_fd.h"
#include "watch/probe/aggregation.h"
#include "watch/probe/probe_session.h"
#include "watch/probe/probe_set.h"

namespace kwatch::watch::probe {

struct AgentSessionOptions {
  bool allow_jump = true;  // false: every probe takes the INT3 path (--no-jump)
  std::string agent_path;  // "" : watch::agent::FindAgentLibrary()
  // --agg: the aggregator whose tables the target may accumulate itself
  // (watch/probe/agent_aggregation.h); null: kwatch aggregates the hits it receives. The
  // caller's; outlives the session. The session reads the target's rows into it at the end.
  Aggregator* aggregator = nullptr;
};

// Launches the command (held at its entry point) or attaches to `pid`, loads the agent,
// places the probes with every thread stopped, opens the recording, begins through `hooks`
// and detaches. Errors:
//  - Unavailable, when the agent cannot serve this target (not found, a static or non-glibc
//    program, dlopen or init failed, a thread blocks SIGTRAP, -f): the message says why, and
//    the target was let go untouched (attached) or killed before its own code ran (launched),
//    so the caller may start another backend on the same command or pid;
//  - any other error: the session could not start (the target restored and let go, or killed
//    when launched).
absl::StatusOr<std::unique_ptr<ProbeSession>> StartAgentSession(
    const ProbeSessionOptions& opts, const AgentSessionOptions& agent_opts, const ProbeSet& set,
    core::UniqueFd sigfd, const ProbeSessionHooks& hooks);

}  // namespace kwatch::watch::probe
