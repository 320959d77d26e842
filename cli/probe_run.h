#pragma once

// The running part of `kwatch probe`: its options, and one session (watch/probe/) run to its
// end with the command's output: hits go through a fan-out to the tally, the recording (-o)
// and a text or JSON printer (cli/probe_output.h); the summary follows. A session stops on the
// target's end, --count, --duration or SIGINT/SIGTERM/SIGHUP (read from `sigfd`).

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/base/unique_fd.h"
#include "core/ptrace/process.h"
#include "watch/probe/probe_set.h"

namespace kwatch::cli {

struct ProbeCmdOptions {
  std::vector<std::string> specs;           // positional and -a
  std::string binary;                       // -x: the ELF file the specs refer to
  std::optional<pid_t> pid;                 // -p
  std::vector<std::string> command;         // after --
  std::optional<core::ptrace::RunAs> user;  // -u: run the command as this user
  std::string list_lines;                   // -L FUNC
  std::string list_vars;                    // -V POINT
  uint64_t count = 0;
  double duration = 0;
  bool json = false;
  bool quiet = false;
  bool kill_on_exit = false;
  bool follow_forks = false;     // -f: children the target forks are probed too (ptrace)
  bool hw = false;               // --hw: execute breakpoints in debug registers, no INT3
  std::string backend = "auto";  // auto, agent, ptrace, uprobe
  bool no_jump = false;          // agent: every probe through INT3 (--no-jump)
  std::string output;            // -o
  std::string command_line;      // as typed, for recordings
  uint32_t maxactive = 0;        // return probes (ptrace), 0: engine default
  uint32_t stack_bytes = 512;    // uprobe: user stack sampled per hit
  // uprobe: data pages of each per-CPU ring, per probe (power of two). 1024: 4 MiB, about
  // 5,500 samples of 512 stack bytes before kwatch must have read them.
  uint32_t ring_pages = 1024;
};

// Runs the probes of `set` with the backend the options name (ptrace, uprobe, or --hw's debug
// registers) over the signalfd `sigfd` (watch::BlockSessionSignals, before any target is
// launched). Returns kwatch's exit status: the launched target's, 1 when -o was not honoured.
absl::StatusOr<int> RunProbeSession(const ProbeCmdOptions& opts, const watch::probe::ProbeSet& set,
                                    core::UniqueFd sigfd);

}  // namespace kwatch::cli
