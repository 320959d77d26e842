#pragma once

#include "absl/status/statusor.h"
#include "cli/join_socket.h"
#include "cli/watch_options.h"

namespace kwatch::cli {

// The joiner's side (docs/gdbserver.md, "Joining"): `kwatch --write EXPR -p PID` on a process
// that kwatch `tracer` already traces joins its session through the control socket instead of
// failing with "already traced". Sends the watches and output options, then prints what the
// session sends (its events and summary on stdout, its notes on stderr) until the session says
// this kwatch's watches ended: at -c (counted by the session), -d, SIGINT/SIGTERM/SIGHUP (asked
// of the session here), or the end of the session. Returns the exit status (0, or 1 when the
// session refused the watches); an error when the session cannot be reached or went away
// without a word. Options that cannot join yet are refused first, by name.
absl::StatusOr<int> JoinWatch(const WatchOptions& opts, const KwatchTracer& tracer);

// The error of a command that cannot join another kwatch's session yet (`kwatch gdbserver`;
// `kwatch probe` joins, cli/probe_join.h) on a process that kwatch `tracer` traces: what can
// join instead.
absl::Status CannotJoinYet(absl::string_view command, pid_t pid, const KwatchTracer& tracer);

}  // namespace kwatch::cli
