#pragma once

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/base/unique_fd.h"
#include "core/ptrace/process.h"
#include "core/ptrace/process_group.h"
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
  SessionOptions session;  // exact_values follows from `condition`
  std::string condition;   // --if EXPR ("": none)
  // The target stays stopped once armed (Process::HoldStopped, every thread stopped): the
  // caller resumes it with Process::ReleaseHold (`kwatch gdbserver`: when gdb says so).
  bool hold_stopped = false;
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
  SessionOptions session_options;     // as the session was created with

  // Not const: it lets the target go, through `proc`.
  void Abandon() {  // NOLINT(readability-make-member-function-const)
    if (proc != nullptr) {
      proc->Abandon();
    }
  }
};

// Blocks the session's signals, attaches to or launches the target (with -f, in a process
// group that follows its forks), resolves the watches against its symbols, picks the backend,
// arms the watches, and parses the condition once per watch (signed comparisons for signed
// types). On error the target is let go as Abandon() does.
absl::StatusOr<ProcessSetup> SetUpProcessWatch(ProcessSetupOptions opts);

// How an --if condition reads watch `w`'s values: signed for a signed C type, the bits of a
// bitfield.
ConditionOptions WatchConditionOptions(const Watch& w);

}  // namespace kwatch::watch
