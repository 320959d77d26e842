#pragma once

// A `kwatch probe` session as a library object: the command makes one (ptrace, uprobe or
// debug-register backend), calls Step until it returns false, then Finish, and shows the end.

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/base/remote_addr.h"
#include "core/ptrace/process.h"
#include "core/symbols/symbolizer.h"
#include "watch/probe/hit_sink.h"

namespace kwatch::watch::probe {

struct ProbeSessionOptions;
// The bytes of stack the agent and the uprobe sample copy per hit for --stack: --stack-bytes
// when given above its default, else 8192.
uint32_t StackCopyBytes(const ProbeSessionOptions& opts);

struct ProbeSessionOptions {
  std::optional<pid_t> pid;                 // attach to this process
  std::vector<std::string> command;         // else launch this command
  std::optional<core::ptrace::RunAs> user;  // run the command as this user
  uint64_t count = 0;                       // stop after this many hits (0: no limit)
  double duration = 0;                      // stop after this many seconds (0: no limit)
  bool kill_on_exit = false;                // the end kills a launched target (else lets it go)
  bool follow_forks = false;                // ptrace: children the target forks are probed too
  bool quiet = false;                       // no notes about followed children
  uint32_t maxactive = 0;                   // ptrace return probes, 0: engine default
  uint32_t stack_frames = 0;                // --stack: user frames per hit (0: none)
  // --stop-on (ptrace): the hit that ends the session leaves its thread where it stopped and
  // the target stopped (SIGSTOP), detached, for a debugger.
  bool stop_on = false;
  uint32_t stack_bytes = 512;  // uprobe: user stack sampled per hit
  // uprobe: data pages of each per-CPU ring, per probe (power of two). 1024: 4 MiB, about
  // 5,500 samples of 512 stack bytes before kwatch must have read them.
  uint32_t ring_pages = 1024;
  std::string command_line;  // hw: how `kwatch slots` names the session
};

// What a session knows when its probes are about to go live (the sink's OnStart follows).
struct ProbeSessionStart {
  uint64_t start_ns = 0;  // CLOCK_MONOTONIC origin of the session
  // The target, whose hits are not labelled with their pid (0: none, or every process).
  pid_t main_pid = 0;
  // Names a return address ("run+0x2a"); null when nothing can name it.
  std::function<std::string(core::RemoteAddr)> caller;
  // Where a code address is (function, offset, file, line), for --stack frames; null when
  // nothing can say.
  std::function<core::symbols::CodeLocation(core::RemoteAddr)> locate;
};

// How the session reaches its user: the recording is opened once the target and its load
// bias are known (an error ends the session before it starts), and the sink is made just
// before the probes go live. The sink, and what the hooks capture, outlive the session.
struct ProbeSessionHooks {
  // `pid`: the target (0: every process running the file); `load_bias` of the probed file in
  // it (0 when unknown: addresses are link-time).
  std::function<absl::Status(pid_t pid, uint64_t load_bias)> open_recording;
  std::function<HitSink&(const ProbeSessionStart& start)> begin;
};

// The debug-register backend's placement at the end, for its summary.
struct ProbeHwEnd {
  std::map<uint32_t, int> registers;  // ProbeDef::id -> debug register (-1: none)
  int external_slots = 0;             // registers held outside kwatch
  uint64_t stray_traps = 0;           // traps that named no probe (dropped)
};

// How one probe was run: "jump", "int3" (the agent), "ptrace", "uprobe", "hw"; and why it
// did not take a faster path ("" when it took the fastest).
struct ProbePath {
  std::string path;
  std::string why;
};

// How a session ended.
struct ProbeSessionEnd {
  std::map<uint32_t, ProbeEndStats> stats;  // by ProbeDef::id
  ProbeRunInfo info;
  bool launched = false;  // the target was launched by the session (its exit is kwatch's)
  // A failure while the session ran or ended, reported after the summary.
  absl::Status error;
  using Hw = ProbeHwEnd;
  std::optional<Hw> hw;  // the debug-register backend's
  // By ProbeDef::id: the path each probe took (agent sessions; else every probe took the
  // backend's own, ProbeRunInfo::backend).
  std::map<uint32_t, ProbePath> paths;
};

// One probe session (each backend's derives from ProbeSessionBase, watch/probe/session_base.h).
// Owns the target (launched or attached), the probes and its EventLoop with the signalfd it was
// given (watch::BlockSessionSignals, called before the session starts); the probe set and the
// sink are the caller's and outlive it. Stops on the target's end, the hit limit, the duration,
// a stop signal read from the signalfd (SIGINT/SIGTERM/SIGHUP) or the sink's failure. Not
// thread-safe: one thread calls Step and Finish.
class ProbeSession {
 public:
  virtual ~ProbeSession() = default;

  // One iteration: waits up to `timeout` (at most one 50 ms tick) for hits, signals and the
  // target, and delivers what came. Returns false once the session should end; an error for a
  // failed system call. Either way, call Finish next.
  virtual absl::StatusOr<bool> Step(absl::Duration timeout) = 0;

  // Takes the probes out, lets the target go (killed if launched and kill_on_exit) and counts.
  // An error when there is nothing to summarize (the session failed and was cleaned up).
  virtual absl::StatusOr<ProbeSessionEnd> Finish() = 0;

 protected:
  // Copied and moved only as part of an implementation (no slicing through the interface).
  ProbeSession() = default;
  ProbeSession(const ProbeSession&) = default;
  ProbeSession& operator=(const ProbeSession&) = default;
  ProbeSession(ProbeSession&&) = default;
  ProbeSession& operator=(ProbeSession&&) = default;
};

}  // namespace kwatch::watch::probe
