#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/base/unique_fd.h"
#include "core/ptrace/process.h"
#include "core/ptrace/process_group.h"
#include "watch/access_sink.h"
#include "watch/arm_point.h"
#include "watch/call_watches.h"
#include "watch/condition.h"
#include "watch/session.h"

namespace kwatch::watch {

// What a process watch session is set up from (the command's options).
struct ProcessSetupOptions {
  std::optional<pid_t> pid;          // attach to this process, or
  std::vector<std::string> command;  // launch this one (with `launch`)
  core::ptrace::LaunchOptions launch;
  bool follow_forks = false;  // -f: the target and its children share one tracer
  std::vector<WatchRequest> requests;
  std::vector<CallWatchRequest> calls;  // --in FUNC: watches armed per call (watch/call_watches.h)
  // How the calls are armed in the target (the in-process agent), when it can; null: ptrace.
  CallAgentFactory call_agent;
  std::string calls_why_not_agent;  // why call_agent is null, for the start's note ("": asked)
  bool calls_need_agent = false;    // --calls-by agent: an error when the agent cannot
  SessionOptions session;           // exact_values follows from `condition`
  std::string condition;            // --if EXPR ("": none)
  // The target stays stopped once armed (Process::HoldStopped, every thread stopped): the
  // caller resumes it with Process::ReleaseHold (`kwatch gdbserver`: when gdb says so).
  bool hold_stopped = false;
  // --arm-at SPEC: the watches are resolved and armed when a thread first runs this probe
  // point (watch/arm_point.h), not at the start. "": at the start.
  std::string arm_at;
  // --arm-at: called once the point is planted, before the target is let run to it, with
  // what the point resolved to.
  std::function<void(const std::string& point)> on_planted;
};

// --arm-at: how arming went.
struct DeferredArming {
  std::string spec;           // as given
  std::string point;          // what it resolved to ("setup (late_pointer.c:21)")
  std::optional<ArmHit> hit;  // the thread and point that armed the watches
  uint64_t start_ns = 0;      // CLOCK_MONOTONIC when the target was let run to the point
  uint64_t armed_ns = 0;      // when the watches were armed (0: never)
  std::string never;          // why the watches were never armed ("": they were)
  std::optional<core::ptrace::ExitInfo> exit;  // the target's end, when it ended first

  // Where and when the watches were armed, for the session's output; nullopt when never.
  std::optional<ArmedAt> Armed() const;
};

// A process watch session's pieces, armed and ready for TargetSet::Create. Until they are
// handed over, Abandon() lets the target go (a launched one is killed: it has not run its
// own code yet; an attached one is detached and runs on).
struct ProcessSetup {
  core::UniqueFd sigfd;  // the session's signals (BlockSessionSignals, before the launch)
  std::unique_ptr<core::ptrace::ProcessGroup> group;  // -f only
  std::unique_ptr<core::ptrace::Process> proc;
  std::unique_ptr<WatchSession> session;
  std::vector<Condition> conditions;  // one per watch (by id), typed by its watch; or none
  // CLOCK_MONOTONIC just before the watches were armed (the target may run from then on):
  // TargetSetOptions::start_ns.
  uint64_t armed_ns = 0;
  SessionOptions session_options;  // as the session was created with
  // --arm-at: where and when the watches were armed; or, with `session` null, why never (the
  // target was then let go: detached, or killed with kill_on_exit).
  std::optional<DeferredArming> deferred;

  // Not const: it lets the target go, through `proc`.
  void Abandon() {  // NOLINT(readability-make-member-function-const)
    if (proc != nullptr) {
      proc->Abandon();
    }
  }
};

// Blocks the session's signals, attaches to or launches the target (with -f, in a process
// group that follows its forks), resolves the watches against its symbols, picks the backend,
// arms the watches (with arm_at: first lets the target run to that point; if it never gets
// there the watches are never armed and the result says why), and parses the condition once per
// watch (signed comparisons for signed types). On error the target is let go as Abandon() does.
absl::StatusOr<ProcessSetup> SetUpProcessWatch(ProcessSetupOptions opts);

// How an --if condition reads watch `w`'s values: signed for a signed C type, the bits of a
// bitfield.
ConditionOptions WatchConditionOptions(const Watch& w);

}  // namespace kwatch::watch
