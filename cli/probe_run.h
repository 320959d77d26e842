#pragma once

// The running part of `kwatch probe`: its options, and one session (watch/probe/) run to its
// end with the command's output: hits go through a fan-out to the tally, the recording (-o)
// and a text or JSON printer (cli/probe_output.h); the summary follows. A session stops on the
// target's end, --count, --duration or SIGINT/SIGTERM/SIGHUP (read from `sigfd`).

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cli/join_socket.h"
#include "core/base/unique_fd.h"
#include "watch/probe/aggregation.h"
#include "watch/probe/hit_filter.h"
#include "watch/probe/probe_session.h"
#include "watch/probe/probe_set.h"

namespace kwatch::cli {

struct ProbeCmdOptions {
  // -p, the command after --, -u, -c, -d, -q, --kill-on-exit, -f, --maxactive, --stack-bytes,
  // --ring-pages, and the command line as typed (for recordings and `kwatch slots`).
  watch::probe::ProbeSessionOptions session;
  std::vector<std::string> specs;  // positional and -a
  std::string binary;              // -x: the ELF file the specs refer to
  std::string root;                // --root: the filesystem -x is read from (a container's)
  std::string list_lines;          // -L FUNC
  std::string list_vars;           // -V POINT
  std::string funcs_glob;          // -F [GLOB] ("" with -F alone: perf's default, !_*)
  bool json = false;
  bool hw = false;                        // --hw: execute breakpoints in debug registers, no INT3
  std::string backend = "auto";           // auto, agent, ptrace, uprobe
  bool no_jump = false;                   // agent: every probe through INT3 (--no-jump)
  std::string output;                     // -o
  watch::probe::HitFilterOptions filter;  // --skip, -c EVENT:N
  std::vector<watch::probe::AggregationSpec> aggs;  // --agg
  double interval = 0;                              // --interval: seconds, 0: at the end only
  bool dry_run = false;                             // --dry-run
  bool show_stack = false;  // --stack: the hits' stacks are printed (else captured for ustack)
  // -p PID traced by another kwatch session: this one joins it (cli/probe_join.h).
  std::optional<KwatchTracer> join;
};

// Runs the probes of `set` with the backend the options name (ptrace, uprobe, or --hw's debug
// registers) over the signalfd `sigfd` (watch::BlockSessionSignals, before any target is
// launched). Returns kwatch's exit status: the launched target's, 1 when -o was not honoured.
absl::StatusOr<int> RunProbeSession(const ProbeCmdOptions& opts, const watch::probe::ProbeSet& set,
                                    core::UniqueFd sigfd);

}  // namespace kwatch::cli
