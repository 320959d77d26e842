#pragma once

// The running part of `kwatch probe`: options, and the loop over a probe session
// (watch/probe/) for each backend. Sessions take resolved probes (watch/probe/probe_set.h);
// their hits reach a HitPrinter (cli/probe_output.h), which prints and records them. A session
// stops on the target's end, --count, --duration or SIGINT/SIGTERM/SIGHUP (delivered through
// `sigfd`); the runners return kwatch's exit status.

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cli/probe_output.h"
#include "core/base/unique_fd.h"
#include "core/ptrace/process.h"
#include "core/store/trace_writer.h"
#include "watch/probe/probe_session.h"
#include "watch/probe/probe_set.h"

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
  bool follow_forks = false;  // -f: children the target forks are probed too (ptrace)
  bool hw = false;            // --hw: execute breakpoints in debug registers, no INT3
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
absl::StatusOr<int> RunPtraceProbes(const ProbeCmdOptions& opts, ProbeSet& set,
                                    core::UniqueFd sigfd);

// Runs the session with the kernel's uprobe PMU: launched, attached (-p, no ptrace) or, with
// neither, every process running the file.
absl::StatusOr<int> RunUprobeProbes(const ProbeCmdOptions& opts, ProbeSet& set,
                                    core::UniqueFd sigfd);

// Runs the session with execute breakpoints in the debug registers (--hw,
// watch/probe/hw_session.h): launch or attach over ptrace like RunPtraceProbes, but the code
// is never written.
absl::StatusOr<int> RunHwProbes(const ProbeCmdOptions& opts, ProbeSet& set, core::UniqueFd sigfd);

// The recording for -o (nullptr without -o), holding the probes.
absl::StatusOr<std::unique_ptr<core::TraceWriter>> OpenRecording(const ProbeCmdOptions& opts,
                                                                 const ProbeSet& set, pid_t pid,
                                                                 uint64_t load_bias);
// Finishes the recording and says so on stderr. False when recording failed (the caller
// exits 1 after its summary).
bool FinishRecording(core::TraceWriter* writer, const HitPrinter& sink, const ProbeRunInfo& info,
                     const std::string& path);

// What a session needs of the command's options.
watch::probe::ProbeSessionOptions SessionOptions(const ProbeCmdOptions& opts);

// The output of one session: the recording (-o) and the printer, made through Hooks() when
// the session starts. Outlives the session; not movable once Hooks() was called.
struct SessionOutput {
  SessionOutput(const ProbeCmdOptions& o, const ProbeSet& s, std::string b)
      : opts(o), set(s), backend(std::move(b)) {}

  const ProbeCmdOptions& opts;
  const ProbeSet& set;
  std::string backend;  // "ptrace", "uprobe", "hw": in the recording and the live lines
  std::unique_ptr<core::TraceWriter> writer;
  std::unique_ptr<HitPrinter> printer;

  watch::probe::ProbeSessionHooks Hooks();
};

// Steps `session` to its end, then finishes the recording and prints the summary. Returns
// kwatch's exit status: the launched target's, 1 when -o was not honoured.
absl::StatusOr<int> RunProbeSession(watch::probe::ProbeSession& session, SessionOutput& out);

}  // namespace kwatch::cli
