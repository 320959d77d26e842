#include "watch/process_setup.h"

#include <utility>

#include "absl/cleanup/cleanup.h"
#include "core/base/status_macros.h"
#include "watch/bitfield_value.h"
#include "watch/event_loop.h"

namespace kwatch::watch {

absl::StatusOr<ProcessSetup> SetUpProcessWatch(ProcessSetupOptions opts) {
  ProcessSetup s;
  // Signals are blocked before the launch, so that no SIGCHLD is lost.
  KW_ASSIGN_OR_RETURN(s.sigfd, BlockSessionSignals());
  if (opts.follow_forks) {
    s.group = std::make_unique<core::ptrace::ProcessGroup>(/*follow_forks=*/true);
  }
  KW_ASSIGN_OR_RETURN(s.proc, core::ptrace::Process::Start(opts.pid, opts.command, opts.launch));
  if (s.group != nullptr) {
    s.group->Add(*s.proc);
  }
  absl::Cleanup abandon = [&s] { s.Abandon(); };
  if (opts.hold_stopped) {
    KW_RETURN_IF_ERROR(s.proc->StopAll());
    s.proc->HoldStopped();
  }
  s.session_options = opts.session;
  if (!opts.condition.empty()) {
    // Parsed once up front for its errors and for whether it needs exact values.
    KW_ASSIGN_OR_RETURN(const Condition c, Condition::Parse(opts.condition));
    s.session_options.exact_values = c.uses_new() || c.uses_old();
  }
  KW_ASSIGN_OR_RETURN(s.session,
                      WatchSession::Create(*s.proc, std::move(opts.requests), s.session_options));
  KW_RETURN_IF_ERROR(s.session->Arm());
  if (!opts.condition.empty()) {
    for (const Watch& w : s.session->watches()) {
      KW_ASSIGN_OR_RETURN(Condition c, Condition::Parse(opts.condition, WatchConditionOptions(w)));
      s.conditions.push_back(std::move(c));
    }
  }
  std::move(abandon).Cancel();
  return s;
}

ConditionOptions WatchConditionOptions(const Watch& w) {
  ConditionOptions co;
  co.bitfield = WatchedBitfield(w.target);
  co.signed_values =
      co.bitfield.has_value() ? co.bitfield->is_signed : IsSignedType(w.target.type_name);
  return co;
}

}  // namespace kwatch::watch
