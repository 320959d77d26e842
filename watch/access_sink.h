#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/event.h"
#include "core/ptrace/process.h"
#include "core/symbols/symbolizer.h"
#include "watch/call_watches.h"
#include "watch/follow.h"
#include "watch/profile/storage_profile.h"
#include "watch/session.h"
#include "watch/summary.h"

namespace kwatch::watch {

// --arm-at: the watches were armed when a thread first ran a probe point.
struct ArmedAt {
  std::string spec;    // as given
  std::string where;   // the point it hit: "setup (late_pointer.c:21)"
  pid_t tid = 0;       // the thread that ran it first
  double wait_ms = 0;  // from letting the target run to the hit
  double arm_us = 0;   // from the hit to the watches armed (every thread stopped meanwhile)
};

// What a process watch session ended with, for its summary.
struct RunInfo {
  std::string stop_reason;  // "target exited", "--count 5 reached", "interrupted by INT", ...
  uint64_t lost = 0;
  uint64_t filtered = 0;             // writes dropped by --read
  uint64_t unrelated = 0;            // page mode: faults that touched no watched byte
  uint64_t spurious_traps = 0;       // SIGTRAPs nothing explains, absorbed (core/trap_origin.h)
  std::string condition;             // --if, "" when none
  uint64_t condition_evaluated = 0;  // events tested
  uint64_t condition_matched = 0;    // ... reported
  uint64_t condition_undefined = 0;  // ... false for want of a value (or a division by 0)
  double seconds = 0;
  std::optional<core::ptrace::ExitInfo> exit;
  pid_t pid = 0;
  // -f/--follow-forks: every process watched, the target first, with its own counts.
  struct Process {
    pid_t pid = 0;
    pid_t parent = 0;                 // 0 for the target
    uint64_t events = 0;              // events delivered from this process
    std::vector<uint64_t> per_watch;  // ... by watch id
    std::optional<core::ptrace::ExitInfo> exit;
  };
  std::vector<Process> processes;   // empty without -f
  std::vector<std::string> notes;   // forks, execs and re-arms, for people
  std::optional<ArmedAt> armed_at;  // --arm-at
  // --follow: each followed watch's objects (in the order it first reached them, with the
  // accesses counted on each) and moves.
  struct FollowedObject {
    core::RemoteAddr addr;
    KindCounts counts;
  };
  struct Followed {
    uint32_t watch_id = 0;
    std::vector<std::string> pointers;  // the pointers it went through at the end
    std::vector<FollowedObject> objects;
    std::vector<FollowMove> moves;
    bool parked = false;  // at the end
    std::string why;      // ... why
  };
  std::vector<Followed> followed;
};

// Something a process watch session tells its user besides events.
struct AccessNote {
  enum class Kind : uint8_t {
    kText,              // `text`, also kept for the summary's notes (execs, re-arms, forks)
    kChildExited,       // followed child `pid` ended (`exit`)
    kTargetExec,        // the target `pid` called exec without -f: its watches ended
    kGroupStop,         // `pid` (a followed child when `parent` != 0) was stopped by `signal`
    kChildFollowed,     // -f: child `pid` of `parent` is watched (armed in `arm_us` us)
    kChildrenDetached,  // at the end: `count` followed children were let go, still running
    kDetached,          // at the end: the target `pid` was let go and keeps running
    kCallEnded,         // a per-call watch's call ended (`call`; `text`: its function), its
                        // events all delivered before
    kMoved,             // --follow: `move` of watch `display`, written at `site`
  };
  Kind kind = Kind::kText;
  std::string text;
  pid_t pid = 0;
  pid_t parent = 0;
  int signal = 0;
  std::optional<core::ptrace::ExitInfo> exit;
  double arm_us = 0;
  size_t count = 0;
  std::optional<CallRecord> call;  // kCallEnded
  std::string expr;                // kCallEnded: the watch's display name
  FollowMove move;
  std::string display;
  core::symbols::CodeLocation site;
};

// What the summary describes: the target's first session (its watches, placements and names),
// the counts of every process (fields against the first image's layout) and the profile.
struct AccessSummary {
  WatchSession& session;
  const Summary& summary;
  const profile::StorageProfile& profile;
  const RunInfo& info;
};

// Where a process watch session's events, notes and summary go (a text or JSON printer, a
// recorder in front of one). Called on the session's thread only: OnEvent and OnNote while it
// runs (BeforeWait before each wait, OnDrained after each drain of a Step), OnSummary once from
// Finish.
class AccessSink {
 public:
  virtual ~AccessSink() = default;

  // One delivered event (counted already). `session` is the one of the process that made the
  // access; `as_counted` is `ev` as `summary` counts it (its addresses rebased to the first
  // image's after an exec re-arm). An error ends the session with the error's message as its
  // stop reason (the first one only; later events still come).
  virtual absl::Status OnEvent(WatchSession& session, Summary& summary, const core::AccessEvent& ev,
                               const core::AccessEvent& as_counted) = 0;
  // The session is about to wait for events.
  virtual void BeforeWait() {}
  // A Step drained every process's rings. An error ends the session as OnEvent's does.
  virtual absl::Status OnDrained() { return absl::OkStatus(); }
  virtual void OnNote(const AccessNote& note) = 0;
  virtual void OnSummary(const AccessSummary& summary) = 0;

 protected:
  // Copied and moved only as part of an implementation (no slicing through the interface).
  AccessSink() = default;
  AccessSink(const AccessSink&) = default;
  AccessSink& operator=(const AccessSink&) = default;
  AccessSink(AccessSink&&) = default;
  AccessSink& operator=(AccessSink&&) = default;
};

}  // namespace kwatch::watch
