#pragma once

// The running part of `kwatch probe`: options, and one session runner per backend. Both
// take resolved probes (cli/probe_set.h), print and record through a HitSink
// (cli/probe_output.h), stop on the target's end, --count, --duration or SIGINT/SIGTERM/
// SIGHUP (delivered through `sigfd`), and return kwatch's exit status.

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cli/probe_output.h"
#include "cli/probe_set.h"
#include "core/store/trace_writer.h"
#include "core/process.h"
#include "core/unique_fd.h"

namespace kwatch::cli {

struct ProbeCmdOptions {
  std::vector<std::string> specs;    // positional and -a
  std::string binary;                // -x: the ELF file the specs refer to
  std::optional<pid_t> pid;          // -p
  std::vector<std::string> command;  // after --
  std::optional<core::RunAs> user;   // -u: run the command as this user
  std::string list_lines;            // -L FUNC
  std::string list_vars;             // -V POINT
  uint64_t count = 0;
  double duration = 0;
  bool json = false;
  bool quiet = false;
  bool kill_on_exit = false;
  bool follow_forks = false;   // -f: children the target forks are probed too (ptrace)
  std::string backend = "ptrace";
  std::string output;          // -o
  std::string command_line;    // as typed, for recordings
  uint32_t maxactive = 0;      // return probes (ptrace), 0: engine default
  uint32_t stack_bytes = 512;  // uprobe: user stack sampled per hit
  // uprobe: data pages of each per-CPU ring, per probe (power of two). 1024: 4 MiB, about
  // 5,500 samples of 512 stack bytes before kwatch must have read them.
  uint32_t ring_pages = 1024;
};

// Runs the session with the INT3 engine over ptrace (launch or attach).
absl::StatusOr<int> RunPtraceProbes(const ProbeCmdOptions& opts, ProbeSet& set, int sigfd);

// Runs the session with the kernel's uprobe PMU: launched, attached (-p, no ptrace) or, with
// neither, every process running the file.
absl::StatusOr<int> RunUprobeProbes(const ProbeCmdOptions& opts, ProbeSet& set, int sigfd);

// --- shared by the runners ---

// epoll over the signalfd, a 50 ms tick and the backend's fds.
class ProbeLoop {
 public:
  static absl::StatusOr<std::unique_ptr<ProbeLoop>> Create(int sigfd);
  absl::Status Add(int fd);
  // Waits up to `timeout_ms`; fills what happened. A stop signal sets `stop_signal`.
  struct Ready {
    bool child = false;  // SIGCHLD
    bool tick = false;
    int stop_signal = 0;
    std::vector<int> fds;  // other fds that are readable
  };
  absl::StatusOr<Ready> Wait(int timeout_ms);

 private:
  ProbeLoop() = default;
  int sigfd_ = -1;
  core::UniqueFd epfd_;
  core::UniqueFd tick_;
};

// The recording for -o (nullptr without -o), holding the probes.
absl::StatusOr<std::unique_ptr<core::TraceWriter>> OpenRecording(const ProbeCmdOptions& opts,
                                                                 const ProbeSet& set, pid_t pid,
                                                                 uint64_t load_bias);
// Finishes the recording and says so on stderr.
void FinishRecording(core::TraceWriter* writer, const HitSink& sink, const ProbeRunInfo& info,
                     const std::string& path);

uint64_t NowNs();

// Reads what waits in the signalfd without blocking: the first SIGINT/SIGTERM/SIGHUP, or 0
// (SIGCHLD is dropped: the runners poll the target every round anyway).
int ReadStopSignal(int sigfd);

}  // namespace kwatch::cli
