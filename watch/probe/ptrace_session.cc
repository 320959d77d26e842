#include "watch/probe/ptrace_session.h"

#include <sys/ptrace.h>
#include <sys/user.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/clock.h"
#include "core/base/status_macros.h"
#include "core/probe/fetch.h"
#include "core/probe/int3_engine.h"
#include "core/ptrace/guardian.h"
#include "core/ptrace/process.h"
#include "core/ptrace/process_group.h"
#include "core/symbols/symbolizer.h"
#include "core/symbols/symbols.h"
#include "watch/probe/engine_probes.h"
#include "watch/probe/hit_stacks.h"
#include "watch/probe/session_base.h"

namespace kwatch::watch::probe {

namespace {

class PtraceSession : public ProbeSessionBase {
 public:
  PtraceSession(const ProbeSessionOptions& opts, const ProbeSet& set,
                std::unique_ptr<EventLoop> loop, const ProbeSessionHooks& hooks)
      : ProbeSessionBase("ptrace", opts, set, std::move(loop), hooks) {}

  absl::StatusOr<ProbeSessionEnd> Finish() override;

 private:
  // Launches or attaches, starts the guardian, opens the recording, then Arm.
  absl::Status Start() override;
  absl::Status Arm();
  // After a failure: restores and lets go (or kills) every process, dismisses the guardians.
  void Abandon() override;
  // Polls the target and every followed child, handles what happened to each.
  absl::Status PollTarget() override;
  // No more hits are shown: the probes are disabled, and come out once the loop runs again
  // (Release).
  void OnStop() override;
  // A process of the session (the target or a followed child) and its engine.
  struct Tracee {
    std::unique_ptr<core::ptrace::Process> proc;
    std::unique_ptr<core::ptrace::Guardian> guardian;
    std::unique_ptr<core::probe::Int3Engine> engine;
    pid_t parent = 0;
    uint64_t adopt_ns = 0;  // fork event seen -> child resumed with its probes
  };
  absl::Status HandleEvents(core::ptrace::Process& proc, core::probe::Int3Engine& engine,
                            const std::vector<core::ptrace::ProcessEvent>& events);
  // -f: takes the followed child `pid` forked by thread `tid` of `parent` and resumes it
  // with an engine adopting the parent's probes.
  absl::Status AdoptChild(core::probe::Int3Engine& parent, pid_t tid, pid_t pid);
  bool AnyChildAlive() const;
  // Engines of every process, the target's first.
  std::vector<core::probe::Int3Engine*> Engines() const;
  // Restores the target and lets it go (detach, or kill with --kill-on-exit).
  absl::Status Release();
  void OnHit(const ProbeDef& def, const core::probe::ProbeContext& ctx, uint64_t bias);
  // Registers every probe in `engine` (world stopped by the caller) at the addresses of an
  // image loaded at `bias`; adds the ids to the engine's sets.
  absl::Status RegisterAll(core::probe::Int3Engine& engine, uint64_t bias);
  // -f: after `proc` exec'd, probes its new image again if the probed file is mapped in it.
  // `proc` is stopped at its exec event and held stopped by the caller (StopWorld).
  void Rearm(core::ptrace::Process& proc, core::probe::Int3Engine& engine);

  std::unique_ptr<core::ptrace::ProcessGroup> group_;  // -f; outlives every process below
  std::unique_ptr<core::ptrace::Process> proc_;
  std::unique_ptr<core::ptrace::Guardian> guardian_;
  std::unique_ptr<core::probe::Int3Engine> engine_;
  std::unique_ptr<core::symbols::Symbols> symbols_;
  std::unique_ptr<core::symbols::Symbolizer> symbolizer_;
  std::unique_ptr<HitStacks> stacks_;  // --stack
  // --stop-on: the thread left stopped, and where.
  struct Parked {
    pid_t tid = 0;
    std::string where;
  };
  std::optional<Parked> parked_;
  core::symbols::MemoryReader read_;
  uint64_t bias_ = 0;
  std::map<uint32_t, core::probe::ProbeId> ids_;  // ProbeDef::id -> engine id
  // Every engine's probe ids (ProbeDef::id -> engine id), one set per image it probed.
  std::map<const core::probe::Int3Engine*, std::vector<std::map<uint32_t, core::probe::ProbeId>>>
      id_sets_;
  bool probes_disabled_ = false;
  std::vector<std::unique_ptr<Tracee>> children_;  // -f: followed children, in fork order
};

void PtraceSession::OnStop() {
  if (engine_ != nullptr && !probes_disabled_) {
    probes_disabled_ = true;
    for (core::probe::Int3Engine* e : Engines()) {
      for (const auto& set : id_sets_[e]) {
        for (const auto& [def_id, id] : set) {
          (void)e->Disable(id);
        }
      }
    }
  }
}

void PtraceSession::OnHit(const ProbeDef& def, const core::probe::ProbeContext& ctx,
                          uint64_t bias) {
  // While the target hits probes back to back, Process::Poll keeps handling its stops and does
  // not return to the loop.
  if (DutiesDuringHit(ctx.time_ns)) {
    ProbeNote n;
    n.kind = ProbeNote::Kind::kStopping;
    n.why = stop_reason();
    Note(n);
  }
  if (!TakesHits()) {
    return;  // stopping: the probes are disabled
  }
  ProbeHit hit = EngineHit(def, ctx, bias);
  if (stacks_ != nullptr && &ctx.process == proc_.get()) {
    hit.stack = stacks_->Unwind(ctx.tid, ctx.regs, opts().stack_frames);
  }
  Deliver(hit);
  if (opts().stop_on && !parked_.has_value() && stopping() &&
      absl::StartsWith(stop_reason(), "--stop-on") && &ctx.process == proc_.get()) {
    // This hit ends the session: its thread stays where the probe stopped it.
    engine_->ParkCurrentThread();
    parked_ = Parked{
        ctx.tid, NameCode(symbolizer_.get(), def.point.is_return ? ctx.return_address : ctx.addr)};
  }
}

absl::Status PtraceSession::Start() {
  core::ptrace::LaunchOptions lo;
  lo.run_as = opts().user;
  lo.kill_on_exit = opts().kill_on_exit;
  KW_ASSIGN_OR_RETURN(proc_, core::ptrace::Process::Start(opts().pid, opts().command, lo));
  if (opts().follow_forks) {
    group_ = std::make_unique<core::ptrace::ProcessGroup>(/*follow_forks=*/true);
    group_->Add(*proc_);
  }
  KW_ASSIGN_OR_RETURN(const std::vector<core::ptrace::MapEntry> maps, proc_->Maps());
  absl::StatusOr<uint64_t> bias = set().target->LoadBias(maps);
  if (!bias.ok()) {
    return absl::NotFoundError(absl::StrCat(
        set().path, " is not mapped in process ", proc_->pid(),
        " (a library loaded later with dlopen cannot be probed yet with the ptrace backend; "
        "--backend uprobe probes it by file): ",
        bias.status().message()));
  }
  bias_ = *bias;
  const core::ptrace::Process* p = proc_.get();
  read_ = [p](core::RemoteAddr a, std::span<uint8_t> out) { return p->ReadMemory(a, out); };
  if (auto syms = core::symbols::Symbols::ForProcess(proc_->pid()); syms.ok()) {
    symbols_ = *std::move(syms);
    symbolizer_ = std::make_unique<core::symbols::Symbolizer>(*symbols_);
  }
  if (opts().stack_frames > 0) {
    KW_ASSIGN_OR_RETURN(stacks_, HitStacks::ForProcess(proc_->pid(), read_));
  }
  KW_ASSIGN_OR_RETURN(guardian_, core::ptrace::Guardian::Start(proc_->pid()));
  engine_ = std::make_unique<core::probe::Int3Engine>(*proc_);
  engine_->SetGuardian(guardian_.get());
  KW_RETURN_IF_ERROR(hooks().open_recording(proc_->pid(), bias_));
  return Arm();
}

absl::Status PtraceSession::RegisterAll(core::probe::Int3Engine& engine, uint64_t bias) {
  absl::StatusOr<std::map<uint32_t, core::probe::ProbeId>> ids =
      RegisterProbes(engine, set(), bias, opts().maxactive,
                     [this, bias](const ProbeDef& def, const core::probe::ProbeContext& ctx) {
                       OnHit(def, ctx, bias);
                     });
  if (!ids.ok()) {
    return ids.status();
  }
  id_sets_[&engine].push_back(*std::move(ids));
  return absl::OkStatus();
}

void PtraceSession::Rearm(core::ptrace::Process& proc, core::probe::Int3Engine& engine) {
  const auto bias_in_image = [this, &proc]() -> absl::StatusOr<uint64_t> {
    KW_ASSIGN_OR_RETURN(const std::vector<core::ptrace::MapEntry> maps, proc.Maps());
    return set().target->LoadBias(maps);
  };
  ProbeNote n;
  n.kind = ProbeNote::Kind::kExec;
  n.pid = proc.pid();
  n.child = &proc != proc_.get();
  absl::StatusOr<uint64_t> bias = bias_in_image();
  if (!bias.ok() && proc.alive()) {
    // At the exec stop only the program and ld.so are mapped: a library given with -x is
    // mapped by ld.so before the program's entry point, where the new image is held as at
    // launch (its own code has not run yet).
    if (absl::Status s = proc.RunToEntry(); s.ok()) {
      bias = bias_in_image();
      n.at_entry = true;
    } else {
      bias = absl::Status(s.code(), absl::StrCat(bias.status().message(), "; ", s.message()));
    }
  }
  if (!bias.ok()) {
    n.rearm = ProbeNote::Rearm::kNotMapped;
    n.path = set().path;
    n.why = std::string{bias.status().message()};
  } else {
    absl::Status s = engine.StopWorld();
    if (s.ok()) {
      s = RegisterAll(engine, *bias);
      if (!s.ok()) {
        (void)engine.RestoreAll();  // all or nothing
      }
      (void)engine.ResumeWorld();
    }
    if (s.ok()) {
      n.rearm = ProbeNote::Rearm::kDone;
      n.count = UserProbes(set());
    } else {
      n.rearm = ProbeNote::Rearm::kFailed;
      n.why = std::string{s.message()};
    }
  }
  NoteAndKeep(n);
}

absl::Status PtraceSession::Arm() {
  KW_RETURN_IF_ERROR(engine_->StopWorld());
  if (absl::Status s = RegisterAll(*engine_, bias_); !s.ok()) {
    (void)engine_->ResumeWorld();
    return s;
  }
  ids_ = id_sets_[engine_.get()].back();
  ProbeSessionStart start;
  start.main_pid = proc_->pid();
  NameWith(symbolizer_.get(), start);
  BeginOutput(std::move(start)).OnStart();
  ProbeNote armed;
  armed.kind = ProbeNote::Kind::kArmed;
  armed.backend = backend();
  armed.count = UserProbes(set());
  armed.pid = proc_->pid();
  armed.path = set().path;
  Note(armed);
  return engine_->ResumeWorld();
}

absl::Status PtraceSession::PollTarget() {
  if (proc_->alive()) {
    KW_ASSIGN_OR_RETURN(const std::vector<core::ptrace::ProcessEvent> events, proc_->Poll());
    KW_RETURN_IF_ERROR(HandleEvents(*proc_, *engine_, events));
  }
  // Children adopted meanwhile are polled in the same round (the vector may grow, so no
  // range-for: HandleEvents may push_back and invalidate its iterators).
  for (size_t i = 0; i < children_.size(); ++i) {  // NOLINT(modernize-loop-convert)
    Tracee& t = *children_[i];
    if (!t.proc->alive()) {
      continue;
    }
    KW_ASSIGN_OR_RETURN(const std::vector<core::ptrace::ProcessEvent> events, t.proc->Poll());
    KW_RETURN_IF_ERROR(HandleEvents(*t.proc, *t.engine, events));
  }
  if (group_ != nullptr && !proc_->alive() && !AnyChildAlive()) {
    Stop(children_.empty() ? "target exited" : "target and its followed children exited");
  }
  return absl::OkStatus();
}

bool PtraceSession::AnyChildAlive() const {
  for (const auto& t : children_) {
    if (t->proc->alive()) {
      return true;
    }
  }
  return false;
}

std::vector<core::probe::Int3Engine*> PtraceSession::Engines() const {
  std::vector<core::probe::Int3Engine*> out;
  if (engine_ != nullptr) {
    out.push_back(engine_.get());
  }
  for (const auto& t : children_) {
    out.push_back(t->engine.get());
  }
  return out;
}

absl::Status PtraceSession::AdoptChild(core::probe::Int3Engine& parent, pid_t tid, pid_t pid) {
  const uint64_t t0 = core::MonotonicNs();
  std::unique_ptr<core::ptrace::Process> child = group_->TakeChild(pid);
  if (child == nullptr) {
    return absl::OkStatus();
  }
  auto t = std::make_unique<Tracee>();
  t->parent = parent.process().pid();
  t->proc = std::move(child);
  const uint64_t g0 = core::MonotonicNs();
  absl::StatusOr<std::unique_ptr<core::ptrace::Guardian>> g = core::ptrace::Guardian::Start(pid);
  const uint64_t guardian_ns = core::MonotonicNs() - g0;
  if (g.ok()) {
    t->guardian = *std::move(g);
  } else {
    ProbeNote n;
    n.kind = ProbeNote::Kind::kChildUnguarded;
    n.pid = pid;
    n.why = std::string{g.status().message()};
    Keep(std::move(n));
  }
  // The engine adopted the parent's state at the fork event (OnFollowedFork), while the
  // parent was still stopped there.
  t->engine = parent.TakeForkedEngine(pid);
  if (t->engine == nullptr) {
    t->engine = parent.AdoptFork(*t->proc, tid, nullptr);
  }
  t->engine->JournalInto(t->guardian.get());
  if (const auto& sets = id_sets_[&parent]; !sets.empty()) {
    id_sets_[t->engine.get()].push_back(sets.back());
  }
  KW_RETURN_IF_ERROR(t->proc->ResumeAll());
  t->adopt_ns = core::MonotonicNs() - t0;
  if (!opts().quiet) {
    ProbeNote n;
    n.kind = ProbeNote::Kind::kChildFollowed;
    n.pid = pid;
    n.parent = t->parent;
    n.us = static_cast<double>(t->adopt_ns) / 1e3;
    n.guardian_us = static_cast<double>(guardian_ns) / 1e3;
    Note(n);
  }
  children_.push_back(std::move(t));
  return absl::OkStatus();
}

absl::Status PtraceSession::HandleEvents(core::ptrace::Process& proc,
                                         core::probe::Int3Engine& engine,
                                         const std::vector<core::ptrace::ProcessEvent>& events) {
  const bool main = &proc == proc_.get();
  for (const core::ptrace::ProcessEvent& e : events) {
    switch (e.kind) {
      case core::ptrace::ProcessEvent::Kind::kExited:
        if (main && group_ == nullptr) {
          Stop(TargetEnded(proc.exit_info()));
        } else if (!main && !opts().quiet) {
          ProbeNote n;
          n.kind = ProbeNote::Kind::kChildExited;
          n.pid = proc.pid();
          n.child = true;
          n.exit = proc.exit_info();
          Note(n);
        }
        break;
      case core::ptrace::ProcessEvent::Kind::kExec: {
        engine.OnExec();
        if (group_ != nullptr && !stopping()) {
          // The new image stays stopped at its exec event until its probes are in, and is
          // resumed once: resuming it a second time could take it out of the stop at its
          // first hit (the SIGTRAP would be lost and the thread go on inside the INT3'd
          // instruction).
          KW_RETURN_IF_ERROR(engine.StopWorld());
          Rearm(proc, engine);
          KW_RETURN_IF_ERROR(engine.ResumeWorld());
          break;
        }
        ProbeNote n;
        n.kind = ProbeNote::Kind::kExec;
        n.pid = proc.pid();
        n.child = !main;
        NoteAndKeep(n);
        KW_RETURN_IF_ERROR(proc.Resume(e.tid));
        break;
      }
      case core::ptrace::ProcessEvent::Kind::kThreadExited:
        engine.OnThreadExit(e.tid);
        break;
      case core::ptrace::ProcessEvent::Kind::kForked:
        if (e.child != 0) {
          KW_RETURN_IF_ERROR(AdoptChild(engine, e.tid, e.child));
        }
        break;
      case core::ptrace::ProcessEvent::Kind::kGroupStop: {
        if (parked_.has_value() && main) {
          break;  // --stop-on's own SIGSTOP
        }
        ProbeNote n;
        n.kind = ProbeNote::Kind::kGroupStop;
        n.pid = proc.pid();
        n.child = !main;
        n.signal = e.signal;
        Note(n);
        break;
      }
      default:
        break;
    }
  }
  return absl::OkStatus();
}

absl::Status PtraceSession::Release() {
  if (group_ != nullptr) {
    // Forks from now on are cleaned and let go; children already announced are adopted (and
    // restored below).
    group_->set_follow_forks(false);
    (void)PollTarget();
  }
  const bool kill_children = proc_->launched() && opts().kill_on_exit;
  size_t detached = 0;
  for (auto& t : children_) {
    if (t->proc->alive()) {
      KW_RETURN_IF_ERROR(t->engine->RestoreAll());
      if (kill_children) {
        KW_RETURN_IF_ERROR(t->proc->Kill());
      } else {
        KW_RETURN_IF_ERROR(t->proc->Detach());
        ++detached;
      }
    }
    if (t->guardian != nullptr) {
      if (!t->proc->alive()) {
        t->guardian->ForgetAll();
      }
      (void)t->guardian->Dismiss();
    }
  }
  if (detached > 0) {
    ProbeNote n;
    n.kind = ProbeNote::Kind::kChildrenReleased;
    n.count = detached;
    Note(n);
  }
  if (engine_ != nullptr && proc_->alive()) {
    KW_RETURN_IF_ERROR(engine_->RestoreAll());
  }
  if (proc_->alive()) {
    if (parked_.has_value()) {
      // The SIGSTOP queued at the hit stopped the process (a group stop): detached, it stays
      // stopped, its thread at the probe.
      KW_RETURN_IF_ERROR(proc_->Detach());
      ProbeNote n;
      n.kind = ProbeNote::Kind::kParked;
      n.pid = proc_->pid();
      n.count = static_cast<uint64_t>(parked_->tid);
      n.why = parked_->where;
      NoteAndKeep(n);
    } else if (proc_->launched() && opts().kill_on_exit) {
      KW_RETURN_IF_ERROR(proc_->Kill());
      AppendToStopReason("; target killed (--kill-on-exit)");
    } else {
      KW_RETURN_IF_ERROR(proc_->Detach());
      ProbeNote n;
      n.kind = ProbeNote::Kind::kReleased;
      n.backend = backend();
      n.pid = proc_->pid();
      Note(n);
    }
  }
  if (guardian_ != nullptr) {
    // Everything is restored (or the target is gone): the guardian has nothing to do.
    if (!proc_->alive()) {
      guardian_->ForgetAll();
    }
    (void)guardian_->Dismiss();
  }
  return absl::OkStatus();
}

void PtraceSession::Abandon() {
  for (auto& t : children_) {
    if (t->proc->alive()) {
      (void)t->engine->RestoreAll();
      (void)t->proc->Detach();
    }
    if (t->guardian != nullptr) {
      (void)t->guardian->Dismiss();
    }
  }
  if (proc_ != nullptr && proc_->alive()) {
    if (engine_ != nullptr) {
      (void)engine_->RestoreAll();
    }
    // A launched target that never ran its own code is not left behind.
    if (proc_->launched() && (!has_sink() || opts().kill_on_exit)) {
      (void)proc_->Kill();
    } else {
      (void)proc_->Detach();
    }
  }
  if (guardian_ != nullptr) {
    (void)guardian_->Dismiss();
  }
}

absl::StatusOr<ProbeSessionEnd> PtraceSession::Finish() {
  if (!failed().ok()) {
    Abandon();
    return failed();
  }
  std::map<uint32_t, ProbeEndStats> stats;
  for (const core::probe::Int3Engine* eng : Engines()) {  // every process and image counts
    for (const auto& set : id_sets_[eng]) {
      AddEngineStats(*eng, set, stats);
    }
  }
  ProbeRunInfo info;
  info.backend = backend();
  info.pid = proc_->pid();
  info.seconds = Elapsed();
  const absl::Status released = Release();
  info.stop_reason = stop_reason();
  if (proc_->forks() > 0) {
    ProbeNote n;
    n.kind = ProbeNote::Kind::kForksNotFollowed;
    n.backend = backend();
    n.count = static_cast<uint64_t>(proc_->forks());
    Keep(std::move(n));
  }
  if (!children_.empty()) {
    ProbeNote n;
    n.kind = ProbeNote::Kind::kChildrenFollowed;
    for (const auto& t : children_) {
      n.pids.push_back(t->proc->pid());
    }
    Keep(std::move(n));
  }
  uint64_t spurious = proc_->spurious_traps();
  for (const auto& t : children_) {
    spurious += t->proc->spurious_traps();
  }
  if (spurious > 0) {
    ProbeNote n;
    n.kind = ProbeNote::Kind::kSpuriousTraps;
    n.count = spurious;
    Keep(std::move(n));
  }
  info.notes = kept_notes();
  info.exit = proc_->exit_info();
  ProbeSessionEnd end;
  end.stats = std::move(stats);
  end.info = std::move(info);
  end.launched = proc_->launched();
  end.error = released;
  return end;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ProbeSession>> StartPtraceSession(const ProbeSessionOptions& opts,
                                                                 const ProbeSet& set,
                                                                 core::UniqueFd sigfd,
                                                                 const ProbeSessionHooks& hooks) {
  KW_ASSIGN_OR_RETURN(std::unique_ptr<EventLoop> loop, EventLoop::Create(std::move(sigfd)));
  auto session = std::make_unique<PtraceSession>(opts, set, std::move(loop), hooks);
  KW_RETURN_IF_ERROR(session->Begin());
  return session;
}

}  // namespace kwatch::watch::probe
