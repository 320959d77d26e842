#pragma once

// kwatch's side of the GDB remote serial protocol (all-stop mode) over a traced process that
// kwatch may also be watching: gdb reads and writes memory and registers, lists threads,
// continues and steps, and places breakpoints (Z0 through kwatch's INT3 engine, so that they
// share addresses with kwatch's probes; Z1-Z4 as drmgr requests at debugger priority, see
// hw_points.h).
//
// Stops. The server is the last SignalInterceptor of the process: a signal that kwatch's own
// backends and the INT3 engine do not claim (a trap of gdb's breakpoints, the target's own
// signals but those gdb passes with QPassSignals) reaches Handle with every thread stopped,
// and Handle serves gdb right there, until gdb resumes, detaches or kills the target. While
// gdb holds the target, nothing else of kwatch runs (its events wait in their rings), and
// kwatch's own traps are never shown to gdb. A Ctrl-C from gdb (0x03) is read between two
// waits of the session (PollConnection), which stops the world and serves gdb the same way.
//
// Lifetime: created over a Process and a Connection that outlive it; Start() installs the
// INT3 engine and the interceptor (after the watch session armed, so that its interceptors
// claim first); the destructor removes gdb's breakpoints and the interceptor. Not thread-safe:
// everything runs on the tracer thread.

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/base/remote_addr.h"
#include "core/probe/int3_engine.h"
#include "core/ptrace/process.h"
#include "core/ptrace/process_event.h"
#include "core/ptrace/signal_interceptor.h"
#include "watch/gdb/connection.h"
#include "watch/gdb/hw_points.h"

namespace kwatch::watch::gdb {

class GdbServer final : public core::ptrace::SignalInterceptor {
 public:
  // What the session does once gdb let go of a stop.
  enum class State : uint8_t {
    kServing,   // gdb is connected: the target runs until the next stop
    kDetached,  // gdb detached (D) or went away: kwatch's session goes on without it
    kKilled,    // gdb killed the target (k, vKill): it is dying
  };

  // `attached`: the target was attached to (qAttached: 1), not launched.
  GdbServer(core::ptrace::Process& proc, Connection& conn, bool attached);
  ~GdbServer() override;
  GdbServer(const GdbServer&) = delete;
  GdbServer& operator=(const GdbServer&) = delete;

  // Installs the INT3 engine and the interceptor.
  absl::Status Start();

  // Every thread of the target is stopped (StopAll or the setup's hold): serves gdb, the
  // first time until it resumes the target (or detaches, or kills it). The caller resumes the
  // threads afterwards (ResumeAll or ReleaseHold). `interrupted`: a Ctrl-C stopped it (SIGINT
  // is reported) rather than the start of the session (SIGTRAP).
  absl::Status ServeStopped(bool interrupted);
  // Between two waits of the session: handles what gdb sent meanwhile (0x03 stops the world
  // and serves gdb; end of stream detaches). Never blocks when gdb sent nothing.
  absl::Status PollConnection();
  // The target ended: tells gdb (W or X, unless gdb killed it) and serves what gdb still asks
  // until it goes (or, with gdb detached, does nothing).
  absl::Status ReportExit(const core::ptrace::ExitInfo& info);
  // The target exec'd (stopped at its exec event): the new image has none of gdb's
  // breakpoints; gdb is told at the next stop it sees.
  void OnExec();

  // Arbitration with kwatch's watches in the same target (HwPoints::set_lender); after Start.
  void SetSlotLender(HwPoints::Lender lender) { hw_->set_lender(std::move(lender)); }

  State state() const { return state_; }
  // Stops gdb's requests reported (breakpoints, watchpoints, signals), for the summary.
  uint64_t stops() const { return stops_; }
  const HwPoints& hw_points() const { return *hw_; }
  // The INT3 engine of gdb's Z0 breakpoints (after Start): one per process, so that the probes
  // of a `kwatch probe` that joins this session (cli/join_server.h) share addresses with them.
  core::probe::Int3Engine* engine() const { return engine_.get(); }

  // SignalInterceptor.
  bool Claims(pid_t tid, const siginfo_t& si) override;
  absl::Status Handle(pid_t tid, const siginfo_t& si) override;
  absl::Status OnThreadStart(pid_t tid) override;

 private:
  // Why the target stopped, as the stop reply says it.
  struct StopInfo {
    pid_t tid = 0;
    int signal = 0;         // Linux signal (SIGTRAP for breakpoints and steps)
    std::string reason;     // "swbreak:", "hwbreak:", "watch:ADDR", ... ("" for none)
    bool delivery = false;  // a signal-delivery stop: resuming `tid` can deliver a signal
    bool exited = false;
    core::ptrace::ExitInfo exit;
  };
  // What gdb asked for when it resumed.
  enum class Resume : uint8_t { kContinue, kDetach, kKill, kGone };

  // Serves packets until gdb resumes the target; `stop` is the current stop (reported at once
  // unless `quiet`, the session's first stop, which gdb asks for with '?').
  absl::StatusOr<Resume> Serve(StopInfo stop, bool quiet);
  // One packet; sets `resume` when it resumes the target.
  absl::Status Dispatch(absl::string_view p, StopInfo& stop, std::optional<Resume>& resume);
  // The stop reply; the stopped thread becomes the current one (Hg, Hc).
  std::string StopReply(const StopInfo& stop);
  // vCont / c / C / s / S: steps are done here (the target stays stopped and a new stop is
  // set); true when the target is to run.
  absl::StatusOr<bool> DoResume(absl::string_view p, StopInfo& stop);
  absl::StatusOr<StopInfo> Step(pid_t tid, int sig);
  std::string ReadMemoryReply(absl::string_view args) const;
  absl::Status WriteMemory(uint64_t addr, const std::vector<uint8_t>& data);
  std::string Breakpoint(absl::string_view p, bool insert);
  absl::Status InsertSoftware(core::RemoteAddr addr);
  absl::Status RemoveSoftware(core::RemoteAddr addr);
  std::string Xfer(absl::string_view p);
  void RemoveAllPoints();
  pid_t ThreadFor(pid_t wanted) const;
  // Sends, or notes that gdb went away.
  absl::Status Reply(absl::string_view payload);

  core::ptrace::Process& proc_;
  Connection& conn_;
  bool attached_;
  bool started_ = false;
  State state_ = State::kServing;
  std::unique_ptr<core::probe::Int3Engine> engine_;
  std::unique_ptr<HwPoints> hw_;
  std::map<core::RemoteAddr, core::probe::ProbeId> sw_;  // Z0 through the engine
  std::map<core::RemoteAddr, uint8_t> raw_sw_;  // Z0 the engine refused: an INT3 of gdb's own
  std::map<pid_t, core::RemoteAddr> parked_;    // threads stopped at a Z0 of the engine
  std::set<int> pass_signals_;                  // QPassSignals (Linux numbers)
  // Signals gdb gave a thread that was not stopped for a signal (C after a breakpoint, a step
  // or the first stop): sent with tgkill, and let through to the target when they arrive.
  std::set<std::pair<pid_t, int>> injected_;
  pid_t g_thread_ = 0;  // Hg
  pid_t c_thread_ = 0;  // Hc
  bool stepping_ = false;
  std::optional<HwPoints::Hit> step_hit_;  // a hardware point hit during a step
  bool in_serve_ = false;
  bool interrupt_pending_ = false;
  uint64_t stops_ = 0;
};

}  // namespace kwatch::watch::gdb
