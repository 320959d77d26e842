#include "watch/process_setup.h"

#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "core/base/clock.h"
#include "core/base/status_macros.h"
#include "core/symbols/expr.h"
#include "core/symbols/symbols.h"
#include "watch/bitfield_value.h"
#include "watch/event_loop.h"
#include "watch/follow.h"

namespace kwatch::watch {

namespace {

// --arm-at: the watches' mistakes (unknown symbols, members) show before the target runs:
// each expression is resolved now with every pointer it follows taken as pointing somewhere
// (the pointers are read for real at the point).
// Returns the symbols read for it, for the session at the point.
absl::StatusOr<std::shared_ptr<core::symbols::Symbols>> CheckDeferred(
    pid_t pid, const std::vector<WatchRequest>& requests) {
  KW_ASSIGN_OR_RETURN(std::shared_ptr<core::symbols::Symbols> symbols,
                      core::symbols::Symbols::ForProcess(pid));
  const core::symbols::MemoryReader anywhere = AnywhereReader();
  for (const WatchRequest& req : requests) {
    if (req.kind == drmgr::DrKind::kExec) {
      continue;  // code: resolved at the point like the rest, it needs no pointer
    }
    KW_ASSIGN_OR_RETURN(const core::symbols::Expr expr, core::symbols::ParseExpr(req.expr));
    if (absl::StatusOr<core::symbols::ResolvedExpr> r = symbols->Resolve(expr, anywhere); !r.ok()) {
      return absl::Status(r.status().code(),
                          absl::StrCat("'", req.expr, "': ", r.status().message()));
    }
  }
  return symbols;
}

// --arm-at: lets the target run to the point. True when it got there (every thread stopped,
// held); false when it never did (`d.never` says why; the target was let go).
absl::StatusOr<bool> RunToArmPoint(const ProcessSetupOptions& opts, ProcessSetup& s,
                                   std::shared_ptr<core::symbols::Symbols>& symbols) {
  KW_ASSIGN_OR_RETURN(symbols, CheckDeferred(s.proc->pid(), opts.requests));
  KW_ASSIGN_OR_RETURN(std::unique_ptr<ArmPoint> point, ArmPoint::Plant(*s.proc, opts.arm_at));
  DeferredArming& d = s.deferred.emplace();
  d.spec = opts.arm_at;
  d.point = point->description();
  if (opts.on_planted) {
    opts.on_planted(d.point);
  }
  d.start_ns = core::MonotonicNs();
  KW_ASSIGN_OR_RETURN(const ArmWait w, point->Wait(s.sigfd.get()));
  if (w.hit.has_value()) {
    d.hit = w.hit;
    return true;
  }
  d.never = w.why_not;
  if (s.proc->alive()) {
    // Let go as a session's end would: killed with --kill-on-exit, else detached (the point's
    // late traps dropped while the point still intercepts them).
    if (opts.launch.kill_on_exit && s.proc->launched()) {
      KW_RETURN_IF_ERROR(s.proc->Kill());
    } else {
      KW_RETURN_IF_ERROR(s.proc->Detach());
    }
  }
  d.exit = s.proc->exit_info();
  return false;
}

}  // namespace

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
  KW_RETURN_IF_ERROR(TakeScopedRequests(s.proc->pid(), opts.requests, opts.calls));
  s.session_options.per_call = !opts.calls.empty();
  if (!opts.calls.empty() && opts.session.debugger_shares) {
    return absl::InvalidArgumentError(
        "kwatch gdbserver does not take watches per call yet (--in FUNC, FUNC::EXPR): gdb's "
        "breakpoints and steps would have to share their probes");
  }
  if (!opts.calls.empty() && opts.follow_forks) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", opts.calls.front().function, "::", opts.calls.front().request.expr,
                     "': watches per call do not follow forks yet (-f): each child would need the "
                     "function's probes of its own"));
  }
  if (!opts.calls.empty() && !opts.arm_at.empty()) {
    return absl::InvalidArgumentError(
        "--in and --arm-at do not go together yet: a watch per call is armed at each call");
  }
  if (!opts.condition.empty()) {
    // Parsed once up front for its errors and for whether it needs exact values.
    KW_ASSIGN_OR_RETURN(const Condition c, Condition::Parse(opts.condition));
    s.session_options.exact_values = c.uses_new() || c.uses_old();
  }
  // --arm-at: read before the point (the libraries a launched target links are mapped at its
  // entry); a library it loads later with dlopen is not seen by the expressions.
  std::shared_ptr<core::symbols::Symbols> symbols;
  if (!opts.arm_at.empty()) {
    KW_ASSIGN_OR_RETURN(const bool reached, RunToArmPoint(opts, s, symbols));
    if (!reached) {
      std::move(abandon).Cancel();  // already let go
      return s;
    }
  }
  // --arm-at: every thread is stopped at (or before) the point until the watches are armed.
  bool held = !opts.arm_at.empty();
  absl::Cleanup release = [&s, &held] {
    if (held && s.proc != nullptr && s.proc->alive()) {
      (void)s.proc->ReleaseHold();
    }
  };
  absl::StatusOr<std::unique_ptr<WatchSession>> created =
      WatchSession::Create(*s.proc, std::move(opts.requests), s.session_options, symbols);
  if (!created.ok() && s.deferred.has_value()) {
    return absl::Status(created.status().code(),
                        absl::StrCat("at --arm-at ", s.deferred->hit->where, " (tid ",
                                     s.deferred->hit->tid, "): ", created.status().message()));
  }
  KW_ASSIGN_OR_RETURN(s.session, std::move(created));
  if (!opts.calls.empty()) {
    KW_ASSIGN_OR_RETURN(std::unique_ptr<CallWatches> calls,
                        CallWatches::Create(*s.proc, *s.session, opts.calls));
    s.session->SetCalls(std::move(calls));
    // No thread runs between the session's arming and the calls' probes.
    KW_RETURN_IF_ERROR(s.proc->StopAll());
    s.proc->HoldStopped();
    held = true;
  }
  s.armed_ns = core::MonotonicNs();
  KW_RETURN_IF_ERROR(s.session->Arm());
  if (s.session->calls() != nullptr) {
    KW_RETURN_IF_ERROR(s.session->calls()->Start(opts.call_agent, opts.calls_why_not_agent));
    if (opts.calls_need_agent && !s.session->calls()->in_process()) {
      return absl::FailedPreconditionError(
          absl::StrCat("--calls-by agent: ", s.session->calls()->path_note()));
    }
  }
  if (s.deferred.has_value()) {
    s.deferred->armed_ns = core::MonotonicNs();
  }
  if (!opts.condition.empty()) {
    for (const Watch& w : s.session->watches()) {
      KW_ASSIGN_OR_RETURN(Condition c, Condition::Parse(opts.condition, WatchConditionOptions(w)));
      s.conditions.push_back(std::move(c));
    }
  }
  if (held) {
    held = false;
    KW_RETURN_IF_ERROR(s.proc->ReleaseHold());
  }
  std::move(abandon).Cancel();
  return s;
}

std::optional<ArmedAt> DeferredArming::Armed() const {
  if (!hit.has_value()) {
    return std::nullopt;
  }
  ArmedAt at;
  at.spec = spec;
  at.where = hit->where;
  at.tid = hit->tid;
  at.wait_ms = static_cast<double>(hit->hit_ns - start_ns) / 1e6;
  at.arm_us = static_cast<double>(armed_ns - hit->hit_ns) / 1e3;
  return at;
}

ConditionOptions WatchConditionOptions(const Watch& w) {
  ConditionOptions co;
  co.bitfield = WatchedBitfield(w.target);
  co.signed_values =
      co.bitfield.has_value() ? co.bitfield->is_signed : IsSignedType(w.target.type_name);
  return co;
}

}  // namespace kwatch::watch
