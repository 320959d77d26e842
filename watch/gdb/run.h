#pragma once

// `kwatch gdbserver`: a gdb remote-protocol server over a process kwatch traces, alone or
// with kwatch's own watches in the same session (server.h says how the two share stops).

#include <sys/types.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/ptrace/launch_options.h"
#include "watch/access_sink.h"
#include "watch/session.h"
#include "watch/target_set.h"

namespace kwatch::watch::gdb {

class GdbServer;

struct GdbServerOptions {
  std::string listen;        // HOST:PORT (TCP), or
  bool stdio = false;        // gdb on stdin/stdout (`target remote | kwatch gdbserver --stdio ...`)
  std::optional<pid_t> pid;  // attach to this process, or
  std::vector<std::string> command;  // launch this one
  core::ptrace::LaunchOptions launch;
  // kwatch's own watches in the same session (none: gdb alone). Their events go to the sink.
  std::vector<WatchRequest> requests;
  SessionOptions session;
  TargetSetOptions target;
  std::string command_line;  // as typed, for `kwatch slots`
  // Lines for people (stderr): where it listens, what gdb did.
  std::function<void(const std::string&)> say;
  // The watch session is armed (with watches only): the caller prints its header.
  std::function<void(TargetSet&)> armed;
  // With watches only: the server is up (its INT3 engine made), before gdb is served; called
  // again with nullptr before the server (and its engine) goes.
  std::function<void(GdbServer*)> serving;
};

// Sets up the target (launched and stopped at its entry point, or attached and stopped),
// waits for gdb, serves it, and runs kwatch's watches until the target ends. With --stdio the
// launched program's stdin is /dev/null and its stdout kwatch's stderr (the pipe is gdb's).
// Returns the launched target's exit status when it ran to its end, else 0. Errors: the port
// in use (FailedPrecondition naming it), the target's setup, the connection.
absl::StatusOr<int> RunGdbServer(GdbServerOptions opts, AccessSink* sink);

}  // namespace kwatch::watch::gdb
