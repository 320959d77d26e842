#pragma once

// The part every probe backend's session shares (ptrace, uprobe, hw; the in-process agent
// next): Step's round over the EventLoop, the stop conditions and their wording, the duties of
// each tick, and the hand-off of hits and notes to the sink. A backend derives from
// ProbeSessionBase and writes only what differs: Start (its target and probes), Collect and
// PollTarget (what a round reads), Finish, and optionally Abandon and OnStop.
//
// One round of Step:
//   1. the first round only: Collect and PollTarget (hits may have come, and the target may
//      have ended, while the probes were being armed);
//   2. stdout is flushed and the loop waits (hits, signals, the 50 ms tick, the backend's fds);
//   3. Collect: the backend reads what its fds hold (hits that came before a stop signal are
//      shown);
//   4. a stop signal (SIGINT/SIGTERM/SIGHUP) ends the session there ("interrupted by INT");
//   5. PollTarget: the target's end, exec, forks (every round: SIGCHLDs merge);
//   6. the duties, at a tick or when a tick's time has passed since the last: the sink is
//      flushed, its failure ends the session, so does --duration.
// The stop reason is the first one given (Stop); the session ends once there is one. A failed
// system call in a round ends it too (Step returns the error, failed() keeps it).
//
// Hits: a backend gives each hit to Deliver (the sink takes it unless --count is reached, which
// stops the session). A backend whose hits are handled inside a call that does not return to
// the loop while the target hits probes back to back (Process::Poll) runs DutiesDuringHit from
// its hit handler.
//
// Lifetime: a backend's Start*Session makes the loop from the signalfd it is given
// (EventLoop::Create), then the session, and calls Begin; the session owns the loop (and so the
// signalfd) from then on; the probe set, the hooks' captures and the sink outlive it.
// Not thread-safe: one thread calls Step and Finish, and the hit handlers run on it.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/base/remote_addr.h"
#include "core/ptrace/process.h"
#include "core/symbols/symbolizer.h"
#include "watch/event_loop.h"
#include "watch/probe/hit_sink.h"
#include "watch/probe/probe_note.h"
#include "watch/probe/probe_session.h"
#include "watch/probe/probe_set.h"

namespace kwatch::watch::probe {

class ProbeSessionBase : public ProbeSession {
 public:
  ProbeSessionBase(const ProbeSessionBase&) = delete;
  ProbeSessionBase& operator=(const ProbeSessionBase&) = delete;
  ~ProbeSessionBase() override = default;

  absl::StatusOr<bool> Step(absl::Duration timeout) final;

  // Runs Start; on error, Abandon, and returns the error.
  absl::Status Begin();

  // How often the duties run, in ns (and the loop's tick).
  static constexpr uint64_t kDutyIntervalNs = 50'000'000;

 protected:
  // `backend`: "ptrace", "uprobe", "hw" (the summary's and the notes' name).
  ProbeSessionBase(std::string backend, ProbeSessionOptions opts, const ProbeSet& set,
                   std::unique_ptr<EventLoop> loop, ProbeSessionHooks hooks);

  // --- What a backend implements.
  // Launches or attaches to the target, opens the recording (hooks().open_recording), arms the
  // probes and begins the output (BeginOutput, then OnStart and the armed note to the sink).
  virtual absl::Status Start() = 0;
  // After a failed Start (and from a backend's Finish after a failed Step): takes out what is
  // armed and lets the target go; a launched target that never ran with its probes is killed.
  virtual void Abandon() {}
  // Reads what the backend's fds hold (rings): every round after the wait, before a stop signal
  // is acted on; and once before the first wait (`ready` empty).
  virtual absl::Status Collect(const EventLoop::Ready& /*ready*/) { return absl::OkStatus(); }
  // Polls the target: its end (Stop with TargetEnded), exec, forks, job control.
  virtual absl::Status PollTarget() = 0;
  // Called once, when the session gets its stop reason (e.g. disables the probes).
  virtual void OnStop() {}

  // --- What the base gives a backend.
  const std::string& backend() const { return backend_; }
  const ProbeSessionOptions& opts() const { return opts_; }
  const ProbeSet& set() const { return set_; }
  const ProbeSessionHooks& hooks() const { return hooks_; }
  EventLoop& loop() { return *loop_; }

  // Makes the sink (hooks().begin) and starts the session's clock at `start.start_ns` (set
  // when 0). The sink's OnStart is the backend's, once its probes are live.
  HitSink& BeginOutput(ProbeSessionStart start);
  // The sink; only after BeginOutput.
  HitSink& sink() { return *sink_; }
  bool has_sink() const { return sink_ != nullptr; }
  // CLOCK_MONOTONIC at the start of the session, in ns.
  uint64_t start_ns() const { return start_ns_; }
  // Seconds since the start.
  double Elapsed() const;

  // Ends the session with `reason`, unless it already has a stop reason.
  void Stop(std::string reason);
  bool stopping() const { return !stop_reason_.empty(); }
  const std::string& stop_reason() const { return stop_reason_; }
  // Adds to the stop reason ("; target killed (--kill-on-exit)").
  void AppendToStopReason(const std::string& text) { stop_reason_ += text; }
  // A Step's failure (OK while none).
  const absl::Status& failed() const { return failed_; }

  // Whether a hit is taken now: not once the session stops or the sink reached --count.
  bool TakesHits() const { return stop_reason_.empty() && !sink_->done(); }
  // Gives `hit` to the sink; when that reaches --count, stops the session. Returns whether the
  // sink took it.
  bool Deliver(const ProbeHit& hit);
  // From a hit handler at `hit_ns`: the duties, if a tick's time passed since the last, with a
  // stop signal read without waiting. Returns true when they stopped the session.
  bool DutiesDuringHit(uint64_t hit_ns);

  // Tells the sink now.
  void Note(const ProbeNote& note);
  // Keeps `note` for the summary (ProbeRunInfo::notes), in order.
  void Keep(ProbeNote note) { notes_.push_back(std::move(note)); }
  // Both.
  void NoteAndKeep(const ProbeNote& note);
  std::vector<ProbeNote>& kept_notes() { return notes_; }

  // The stop reason for the target's end: "target exited", "target killed by SEGV".
  static std::string TargetEnded(const std::optional<core::ptrace::ExitInfo>& exit);
  // Names a code address ("run+0x2a (prog.c:12)"), or its hex without a symbol.
  static std::string NameCode(core::symbols::Symbolizer* symbolizer, core::RemoteAddr addr);
  // ProbeSessionStart's caller and locate over `symbolizer` (which outlives the session's
  // output; null: names are hex).
  static void NameWith(core::symbols::Symbolizer* symbolizer, ProbeSessionStart& start);

 private:
  // What Step does when a round fails: remembers and returns the error.
  absl::Status Fail(absl::Status s);
  // Flushes the sink; stops on `stop_signal`, the sink's failure or --duration.
  void Duties(int stop_signal);

  std::string backend_;
  ProbeSessionOptions opts_;
  const ProbeSet& set_;
  std::unique_ptr<EventLoop> loop_;
  ProbeSessionHooks hooks_;
  HitSink* sink_ = nullptr;  // from hooks_.begin
  absl::Status failed_;
  std::string stop_reason_;
  std::vector<ProbeNote> notes_;
  uint64_t start_ns_ = 0;
  uint64_t deadline_ns_ = 0;  // --duration, 0: none
  uint64_t last_duties_ns_ = 0;
  bool looping_ = false;  // the first Step ran
};

}  // namespace kwatch::watch::probe
