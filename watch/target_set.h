#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "core/base/unique_fd.h"
#include "core/event.h"
#include "core/ptrace/process.h"
#include "core/ptrace/process_group.h"
#include "watch/access_sink.h"
#include "watch/condition.h"
#include "watch/event_loop.h"
#include "watch/guests.h"
#include "watch/profile/storage_profile.h"
#include "watch/session.h"
#include "watch/summary.h"

namespace kwatch::watch {

struct TargetSetOptions {
  uint64_t count = 0;               // stop after this many delivered events (0: no limit)
  double duration = 0;              // stop after this many seconds (0: no limit)
  bool kill_on_exit = false;        // Finish kills a launched target (else detaches from it)
  bool recording = false;           // -o: an exec re-arm refuses watches that moved
  std::string condition;            // --if as typed, for the summary ("" when none)
  std::optional<ArmedAt> armed_at;  // --arm-at: for the summary
  // CLOCK_MONOTONIC when the armed target was let run (ProcessSetup::armed_ns): the session's
  // start, so that no event comes before it. 0: when the set is created.
  uint64_t start_ns = 0;
};

// How a session ended (Finish).
struct TargetSetEnd {
  RunInfo info;
  // A launched target's shell status, when it ended.
  std::optional<int> exit_status;
};

// A process watch session: the target process and, with a process group (-f), the children
// it forks and theirs, each with its own WatchSession (a child's armed before it runs; after an
// exec, the watches armed again by expression in the new image). Drains every process's rings
// into the sink (filtered by the --if conditions, counted per process, in the summary and in
// the storage profile, against the first image's layout), and stops on the event count, the
// duration, SIGINT/SIGTERM/SIGHUP (read from `sigfd`, made by BlockSessionSignals before the
// target was launched) or the end of the target and every followed child. Finish removes the
// watches and lets every process go (killed with kill_on_exit on a launched target, else
// detached).
//
// Owns the processes, their sessions, the group and an EventLoop (with the signalfd); the sink
// is the caller's and outlives the set. Not thread-safe: one thread calls Step, Finish and
// Abandon.
class TargetSet {
 public:
  // `session` is the target's, armed; `conditions` are one per watch (by id), or none. On
  // error, the processes are let go as Abandon does.
  static absl::StatusOr<std::unique_ptr<TargetSet>> Create(
      const TargetSetOptions& opts, const SessionOptions& session_opts, core::UniqueFd sigfd,
      std::unique_ptr<core::ptrace::ProcessGroup> group,
      std::unique_ptr<core::ptrace::Process> target, std::unique_ptr<WatchSession> session,
      std::vector<Condition> conditions, AccessSink& sink);

  TargetSet(const TargetSet&) = delete;
  TargetSet& operator=(const TargetSet&) = delete;
  ~TargetSet();

  // One iteration: waits up to `timeout` (at most one 50 ms tick, less when multiplexing) for
  // events and signals, drains every ring, rotates multiplexed watches, and polls every
  // process (adopting forked children, re-arming after exec). The first Step polls before it
  // waits (the target may have ended while arming). Returns false once the session should end
  // (then call Finish); an error when it cannot go on (then call Abandon).
  absl::StatusOr<bool> Step(absl::Duration timeout = absl::Seconds(1));

  // Drains what is left, removes the watches, lets the processes go and sends the summary to
  // the sink. On error, call Abandon.
  absl::StatusOr<TargetSetEnd> Finish();

  // After an error: every watch removed, followed children detached, the target killed if it
  // was launched (it may never have run its own code), else detached.
  void Abandon();

  // CLOCK_MONOTONIC at the session's start, in ns (events carry the same clock).
  uint64_t start_ns() const { return start_ns_; }
  core::ptrace::Process& target_process() const;
  // The target's watches now; nullptr once they ended (exec without -f, or not re-armed).
  const WatchSession* target_session() const;
  // The target's first session: what the summary describes.
  WatchSession& first_session();
  bool follows_forks() const { return group_ != nullptr; }
  // --arm-at: where and when the watches were armed; nullopt without --arm-at.
  const std::optional<ArmedAt>& armed_at() const { return opts_.armed_at; }
  // How many times multiplexed watches rotated through the debug registers.
  uint64_t rotations() const { return rotations_; }
  // Other kwatch commands that joined the target's session (cli/join_server.h): their events
  // go to `guests`, which outlives the set, and it serves them at every Step. nullptr: none.
  void SetGuests(GuestRouter* guests) { guests_ = guests; }
  // --follow: how many times a followed watch moved (its registers changed).
  uint64_t moves() const { return moves_; }
  // How many times joined kwatch commands came or went (their watches changed drmgr's state).
  uint64_t guest_changes() const { return guest_changes_; }
  // A line for the event stream (AccessNote::kText), kept for the summary's notes.
  void Note(std::string text);

 private:
  struct Tracee;

  TargetSet(TargetSetOptions opts, const SessionOptions& session_opts, core::UniqueFd sigfd,
            std::unique_ptr<core::ptrace::ProcessGroup> group, std::vector<Condition> conditions,
            AccessSink& sink);

  absl::Status Init();
  absl::Status AddFds(const WatchSession& session);
  Tracee& target() { return *tracees_.front(); }
  const Tracee& target() const { return *tracees_.front(); }
  void DrainAll();
  void DrainTracee(Tracee& t);
  // Polls the target and every followed child, and handles what happened to each.
  absl::Status PollAll();
  absl::Status HandleEvents(Tracee& t, const std::vector<core::ptrace::ProcessEvent>& events);
  // -f: takes followed child `pid`, arms its session and resumes it.
  absl::Status AdoptChild(Tracee& parent, pid_t pid);
  // -f: `t` called exec (stopped at its exec event): its watches are armed again by expression
  // in the new image when they resolve to the same types; says what happened.
  void Rearm(Tracee& t);
  bool AnyChildAlive() const;
  static std::string Who(const Tracee& t);
  // Ends the session with `reason` unless it already ends.
  void Stop(absl::string_view reason);
  // Removes the watches from every process, then lets each go.
  absl::Status Release(RunInfo& info);

  TargetSetOptions opts_;
  SessionOptions session_opts_;
  core::UniqueFd sigfd_;  // from Create until Init hands it to the loop
  std::unique_ptr<core::ptrace::ProcessGroup> group_;  // -f; outlives every process below
  std::vector<std::unique_ptr<Tracee>> tracees_;       // the target first, then children by fork
  std::vector<Condition> conditions_;                  // --if, one per watch (by id), or none
  AccessSink& sink_;
  std::vector<Watch> watches_;  // the target's first image's: what the summary counts
  std::optional<Summary> summary_;
  std::optional<profile::StorageProfile> profile_;
  std::unique_ptr<EventLoop> loop_;
  uint64_t start_ns_ = 0;
  uint64_t deadline_ns_ = 0;  // 0: none
  bool started_ = false;      // the first Step polled
  bool stopped_ = false;
  std::string stop_reason_;
  uint64_t delivered_ = 0;
  uint64_t rotations_ = 0;
  bool exec_seen_ = false;  // the target's watches ended at an exec (not re-armed)
  std::vector<std::string> notes_;
  // --follow: by watch id, the objects counted and moves (for the summary), and the index in
  // `objects` of the one watched now (-1: parked).
  std::map<uint32_t, RunInfo::Followed> followed_;
  std::map<uint32_t, int> current_object_;
  uint64_t moves_ = 0;
  // Takes a move in time order: counts from now on go to its object; tells the sink.
  void OnMove(WatchSession& session, const FollowMove& m);
  GuestRouter* guests_ = nullptr;
  uint64_t guest_changes_ = 0;
};

}  // namespace kwatch::watch
