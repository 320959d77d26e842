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
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"
#include "core/probe/fetch.h"
#include "core/probe/int3_engine.h"
#include "core/ptrace/guardian.h"
#include "core/ptrace/process.h"
#include "core/ptrace/process_group.h"
#include "core/symbols/symbolizer.h"
#include "core/symbols/symbols.h"
#include "watch/probe/probe_loop.h"

namespace kwatch::watch::probe {

namespace {

class PtraceSession : public ProbeSession {
 public:
  PtraceSession(const ProbeSessionOptions& opts, const ProbeSet& set, int sigfd,
                const ProbeSessionHooks& hooks)
      : opts_(opts), set_(set), sigfd_(sigfd), hooks_(hooks) {}

  // Start and Arm; on error, cleans up (Abandon).
  absl::Status Begin();
  absl::StatusOr<bool> Step(absl::Duration timeout) override;
  absl::StatusOr<ProbeSessionEnd> Finish() override;

 private:
  absl::Status Start();
  absl::Status Arm();
  // The first Step's: the loop, the deadline, and the target's end while it was armed.
  absl::Status OpenLoop();
  // After a failure: restores and lets go (or kills) every process, dismisses the guardians.
  void Abandon();
  // Polls the target and every followed child, handles what happened to each.
  absl::Status HandleChild();
  // A process of the session (the target or a followed child) and its engine.
  struct Tracee {
    std::unique_ptr<core::Process> proc;
    std::unique_ptr<core::Guardian> guardian;
    std::unique_ptr<core::Int3Engine> engine;
    pid_t parent = 0;
    uint64_t adopt_ns = 0;  // fork event seen -> child resumed with its probes
  };
  absl::Status HandleEvents(core::Process& proc, core::Int3Engine& engine,
                            const std::vector<core::ProcessEvent>& events);
  // -f: takes the followed child `pid` forked by thread `tid` of `parent` and resumes it
  // with an engine adopting the parent's probes.
  absl::Status AdoptChild(core::Int3Engine& parent, pid_t tid, pid_t pid);
  bool AnyChildAlive() const;
  // Engines of every process, the target's first.
  std::vector<core::Int3Engine*> Engines() const;
  // Restores the target and lets it go (detach, or kill with --kill-on-exit).
  absl::Status Release();
  void OnHit(const ProbeDef& def, const core::ProbeContext& ctx, uint64_t bias);
  // Registers every probe in `engine` (world stopped by the caller) at the addresses of an
  // image loaded at `bias`; adds the ids to the engine's sets.
  absl::Status RegisterAll(core::Int3Engine& engine, uint64_t bias);
  // -f: after `proc` exec'd, probes its new image again if the probed file is mapped in it.
  // `proc` is stopped at its exec event and held stopped by the caller (StopWorld).
  void Rearm(core::Process& proc, core::Int3Engine& engine);
  // What the loop does every round: flush, check the stop conditions. Also run from the hit
  // handler every 50 ms: while the target hits probes back to back, Process::Poll keeps
  // handling its stops and does not return to the loop.
  void Duties(int stop_signal);
  void Stop(std::string reason);
  std::string Caller(core::RemoteAddr ra);

  ProbeSessionOptions opts_;
  const ProbeSet& set_;
  int sigfd_;
  ProbeSessionHooks hooks_;
  std::unique_ptr<ProbeLoop> loop_;
  absl::Status failed_;                        // a Step's failure
  std::unique_ptr<core::ProcessGroup> group_;  // -f; outlives every process below
  std::unique_ptr<core::Process> proc_;
  std::unique_ptr<core::Guardian> guardian_;
  std::unique_ptr<core::Int3Engine> engine_;
  std::unique_ptr<core::Symbols> symbols_;
  std::unique_ptr<core::Symbolizer> symbolizer_;
  HitSink* sink_ = nullptr;  // from hooks_.begin
  core::MemoryReader read_;
  uint64_t bias_ = 0;
  uint64_t start_ns_ = 0;
  std::map<uint32_t, core::ProbeId> ids_;  // ProbeDef::id -> engine id
  // Every engine's probe ids (ProbeDef::id -> engine id), one set per image it probed.
  std::map<const core::Int3Engine*, std::vector<std::map<uint32_t, core::ProbeId>>> id_sets_;
  std::string stop_reason_;
  std::vector<std::string> notes_;
  uint64_t deadline_ns_ = 0;  // --duration, 0: none
  uint64_t last_duties_ns_ = 0;
  bool probes_disabled_ = false;
  std::vector<std::unique_ptr<Tracee>> children_;  // -f: followed children, in fork order
};

constexpr uint64_t kDutyIntervalNs = 50'000'000;

void PtraceSession::Stop(std::string reason) {
  if (!stop_reason_.empty()) {
    return;
  }
  stop_reason_ = std::move(reason);
  // No more hits are shown; the probes come out once the loop runs again (Release).
  if (engine_ != nullptr && !probes_disabled_) {
    probes_disabled_ = true;
    for (core::Int3Engine* e : Engines()) {
      for (const auto& set : id_sets_[e]) {
        for (const auto& [def_id, id] : set) {
          (void)e->Disable(id);
        }
      }
    }
  }
}

void PtraceSession::Duties(int stop_signal) {
  last_duties_ns_ = NowNs();
  sink_->Flush();
  if (stop_signal != 0) {
    Stop(absl::StrCat("interrupted by ", sigabbrev_np(stop_signal)));
  }
  if (absl::Status s = sink_->status(); !s.ok()) {
    Stop(std::string(s.message()));
  }
  if (deadline_ns_ != 0 && last_duties_ns_ >= deadline_ns_) {
    Stop(absl::StrFormat("--duration %gs elapsed", opts_.duration));
  }
}

std::string PtraceSession::Caller(core::RemoteAddr ra) {
  if (symbolizer_ == nullptr) {
    return absl::StrFormat("0x%x", ra.value);
  }
  const core::CodeLocation& loc = symbolizer_->Locate(ra);
  if (loc.function.empty()) {
    return absl::StrFormat("0x%x", ra.value);
  }
  return core::Symbolizer::Format(loc);
}

void PtraceSession::OnHit(const ProbeDef& def, const core::ProbeContext& ctx, uint64_t bias) {
  if (ctx.time_ns >= last_duties_ns_ + kDutyIntervalNs && stop_reason_.empty()) {
    Duties(ReadStopSignal(sigfd_));
    if (!stop_reason_.empty()) {
      sink_->OnNote(
          absl::StrFormat("stopping (%s): the probes are disabled and come out as soon as the "
                          "target pauses between hits",
                          stop_reason_));
    }
  }
  if (!stop_reason_.empty() || sink_->done()) {
    return;  // stopping: the probes are disabled
  }
  ProbeHit hit;
  hit.time_ns = ctx.time_ns;
  hit.pid = ctx.process.pid();
  hit.tid = ctx.tid;
  hit.probe = &def;
  hit.ip = ctx.addr;
  hit.return_address = ctx.return_address;
  core::FetchContext fc;
  fc.regs = &ctx.regs;
  fc.load_bias = bias;
  fc.read = read_;
  if (&ctx.process != proc_.get()) {  // a followed child
    const core::Process& p = ctx.process;
    fc.read = [&p](core::RemoteAddr a, std::span<uint8_t> out) { return p.ReadMemory(a, out); };
  }
  fc.at_return = ctx.is_return;
  fc.tid = ctx.tid;
  user_fpregs_struct fp{};
  if (def.needs_fpregs && ::ptrace(PTRACE_GETFPREGS, ctx.tid, nullptr, &fp) == 0) {
    fc.fpregs = &fp;
  }
  hit.args.reserve(def.args.size());
  for (const core::CompiledArg& a : def.args) {
    absl::StatusOr<std::string> v = core::Evaluate(a, fc);
    hit.args.emplace_back(
        a.name, v.ok() ? *std::move(v) : absl::StrCat("<error: ", v.status().message(), ">"));
  }
  sink_->Add(hit);
  if (sink_->done()) {
    Stop(absl::StrCat("--count ", opts_.count, " reached"));
  }
}

absl::Status PtraceSession::Start() {
  core::LaunchOptions lo;
  lo.run_as = opts_.user;
  lo.kill_on_exit = opts_.kill_on_exit;
  KW_ASSIGN_OR_RETURN(proc_, core::Process::Start(opts_.pid, opts_.command, lo));
  if (opts_.follow_forks) {
    group_ = std::make_unique<core::ProcessGroup>(/*follow_forks=*/true);
    group_->Add(*proc_);
  }
  KW_ASSIGN_OR_RETURN(const std::vector<core::MapEntry> maps, proc_->Maps());
  absl::StatusOr<uint64_t> bias = set_.target->LoadBias(maps);
  if (!bias.ok()) {
    return absl::NotFoundError(absl::StrCat(
        set_.path, " is not mapped in process ", proc_->pid(),
        " (a library loaded later with dlopen cannot be probed yet with the ptrace backend; "
        "--backend uprobe probes it by file): ",
        bias.status().message()));
  }
  bias_ = *bias;
  const core::Process* p = proc_.get();
  read_ = [p](core::RemoteAddr a, std::span<uint8_t> out) { return p->ReadMemory(a, out); };
  if (auto syms = core::Symbols::ForProcess(proc_->pid()); syms.ok()) {
    symbols_ = *std::move(syms);
    symbolizer_ = std::make_unique<core::Symbolizer>(*symbols_);
  }
  KW_ASSIGN_OR_RETURN(guardian_, core::Guardian::Start(proc_->pid()));
  engine_ = std::make_unique<core::Int3Engine>(*proc_);
  engine_->SetGuardian(guardian_.get());
  return hooks_.open_recording(proc_->pid(), bias_);
}

absl::Status PtraceSession::RegisterAll(core::Int3Engine& engine, uint64_t bias) {
  std::map<uint32_t, core::ProbeId> ids;
  for (const ProbeDef& def : set_.probes) {
    const core::RemoteAddr addr{def.point.vaddr.value + bias};
    core::ProbeHandlers h;
    h.pre = [this, &def, bias](const core::ProbeContext& ctx) { OnHit(def, ctx, bias); };
    absl::StatusOr<core::ProbeId> id;
    if (def.point.is_return) {
      core::ReturnProbeOptions ro;
      ro.maxactive = opts_.maxactive;
      id = engine.RegisterReturn(addr, std::move(h), ro);
    } else {
      id = engine.Register(addr, std::move(h));
    }
    if (!id.ok()) {
      return absl::Status(id.status().code(),
                          absl::StrCat("probe ", def.point.event, " (", def.Location(),
                                       "): ", id.status().message()));
    }
    ids[def.id] = *id;
  }
  id_sets_[&engine].push_back(ids);
  return absl::OkStatus();
}

void PtraceSession::Rearm(core::Process& proc, core::Int3Engine& engine) {
  const auto bias_in_image = [this, &proc]() -> absl::StatusOr<uint64_t> {
    KW_ASSIGN_OR_RETURN(const std::vector<core::MapEntry> maps, proc.Maps());
    return set_.target->LoadBias(maps);
  };
  absl::StatusOr<uint64_t> bias = bias_in_image();
  std::string when;
  if (!bias.ok() && proc.alive()) {
    // At the exec stop only the program and ld.so are mapped: a library given with -x is
    // mapped by ld.so before the program's entry point, where the new image is held as at
    // launch (its own code has not run yet).
    if (absl::Status s = proc.RunToEntry(); s.ok()) {
      bias = bias_in_image();
      when = " at its entry point";
    } else {
      bias = absl::Status(s.code(), absl::StrCat(bias.status().message(), "; ", s.message()));
    }
  }
  std::string what;
  if (!bias.ok()) {
    what = absl::StrFormat("not re-armed: %s is not mapped in the new image (%s)", set_.path,
                           bias.status().message());
  } else {
    absl::Status s = engine.StopWorld();
    if (s.ok()) {
      s = RegisterAll(engine, *bias);
      if (!s.ok()) {
        (void)engine.RestoreAll();  // all or nothing
      }
      (void)engine.ResumeWorld();
    }
    what = s.ok() ? absl::StrFormat("%d probe%s re-armed in the new image%s (-f)",
                                    set_.probes.size(), set_.probes.size() == 1 ? "" : "s", when)
                  : absl::StrCat("not re-armed: ", s.message());
  }
  notes_.push_back(absl::StrFormat("%s %d called exec: the probes of the old image ended there; %s",
                                   &proc == proc_.get() ? "target" : "followed child", proc.pid(),
                                   what));
  sink_->OnNote(notes_.back());
}

absl::Status PtraceSession::Arm() {
  KW_RETURN_IF_ERROR(engine_->StopWorld());
  if (absl::Status s = RegisterAll(*engine_, bias_); !s.ok()) {
    (void)engine_->ResumeWorld();
    return s;
  }
  ids_ = id_sets_[engine_.get()].back();
  start_ns_ = NowNs();
  last_duties_ns_ = start_ns_;
  ProbeSessionStart start;
  start.start_ns = start_ns_;
  start.main_pid = proc_->pid();
  start.caller = [this](core::RemoteAddr ra) { return Caller(ra); };
  sink_ = &hooks_.begin(start);
  sink_->OnStart();
  sink_->OnNote(absl::StrFormat("armed %zu probe%s on pid %d (%s), ptrace backend",
                                set_.probes.size(), set_.probes.size() == 1 ? "" : "s",
                                proc_->pid(), set_.path));
  return engine_->ResumeWorld();
}

absl::Status PtraceSession::HandleChild() {
  if (proc_->alive()) {
    KW_ASSIGN_OR_RETURN(const std::vector<core::ProcessEvent> events, proc_->Poll());
    KW_RETURN_IF_ERROR(HandleEvents(*proc_, *engine_, events));
  }
  // Children adopted meanwhile are polled in the same round (the vector may grow).
  for (size_t i = 0; i < children_.size(); ++i) {
    Tracee& t = *children_[i];
    if (!t.proc->alive()) {
      continue;
    }
    KW_ASSIGN_OR_RETURN(const std::vector<core::ProcessEvent> events, t.proc->Poll());
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

std::vector<core::Int3Engine*> PtraceSession::Engines() const {
  std::vector<core::Int3Engine*> out;
  if (engine_ != nullptr) {
    out.push_back(engine_.get());
  }
  for (const auto& t : children_) {
    out.push_back(t->engine.get());
  }
  return out;
}

absl::Status PtraceSession::AdoptChild(core::Int3Engine& parent, pid_t tid, pid_t pid) {
  const uint64_t t0 = NowNs();
  std::unique_ptr<core::Process> child = group_->TakeChild(pid);
  if (child == nullptr) {
    return absl::OkStatus();
  }
  auto t = std::make_unique<Tracee>();
  t->parent = parent.process().pid();
  t->proc = std::move(child);
  const uint64_t g0 = NowNs();
  absl::StatusOr<std::unique_ptr<core::Guardian>> g = core::Guardian::Start(pid);
  const uint64_t guardian_ns = NowNs() - g0;
  if (g.ok()) {
    t->guardian = *std::move(g);
  } else {
    notes_.push_back(absl::StrFormat("child %d is not guarded (the guardian did not start: %s)",
                                     pid, g.status().message()));
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
  t->adopt_ns = NowNs() - t0;
  if (!opts_.quiet) {
    sink_->OnNote(absl::StrFormat(
        "following child %d of %d (probes adopted in %.0f us, %.0f us of it starting its "
        "guardian)",
        pid, t->parent, static_cast<double>(t->adopt_ns) / 1e3,
        static_cast<double>(guardian_ns) / 1e3));
  }
  children_.push_back(std::move(t));
  return absl::OkStatus();
}

absl::Status PtraceSession::HandleEvents(core::Process& proc, core::Int3Engine& engine,
                                         const std::vector<core::ProcessEvent>& events) {
  const bool main = &proc == proc_.get();
  for (const core::ProcessEvent& e : events) {
    switch (e.kind) {
      case core::ProcessEvent::Kind::kExited:
        if (main && group_ == nullptr) {
          Stop(proc.exit_info()->signaled
                   ? absl::StrCat("target killed by ", sigabbrev_np(proc.exit_info()->signal))
                   : "target exited");
        } else if (!main && !opts_.quiet) {
          sink_->OnNote(absl::StrFormat(
              "followed child %d %s %d", proc.pid(),
              proc.exit_info()->signaled ? "killed by signal" : "exited with status",
              proc.exit_info()->signaled ? proc.exit_info()->signal : proc.exit_info()->code));
        }
        break;
      case core::ProcessEvent::Kind::kExec:
        engine.OnExec();
        if (group_ != nullptr && stop_reason_.empty()) {
          // The new image stays stopped at its exec event until its probes are in, and is
          // resumed once: resuming it a second time could take it out of the stop at its
          // first hit (the SIGTRAP would be lost and the thread go on inside the INT3'd
          // instruction).
          KW_RETURN_IF_ERROR(engine.StopWorld());
          Rearm(proc, engine);
          KW_RETURN_IF_ERROR(engine.ResumeWorld());
          break;
        }
        notes_.push_back(
            absl::StrFormat("%s %d called exec: the probes of the old image ended there",
                            main ? "target" : "followed child", proc.pid()));
        sink_->OnNote(notes_.back());
        KW_RETURN_IF_ERROR(proc.Resume(e.tid));
        break;
      case core::ProcessEvent::Kind::kThreadExited:
        engine.OnThreadExit(e.tid);
        break;
      case core::ProcessEvent::Kind::kForked:
        if (e.child != 0) {
          KW_RETURN_IF_ERROR(AdoptChild(engine, e.tid, e.child));
        }
        break;
      case core::ProcessEvent::Kind::kGroupStop:
        sink_->OnNote(absl::StrFormat("%s %d stopped by %s (job control); still probing",
                                      main ? "target" : "followed child", proc.pid(),
                                      sigabbrev_np(e.signal)));
        break;
      default:
        break;
    }
  }
  return absl::OkStatus();
}

absl::Status PtraceSession::OpenLoop() {
  KW_ASSIGN_OR_RETURN(loop_, ProbeLoop::Create(sigfd_));
  deadline_ns_ = opts_.duration > 0 ? start_ns_ + static_cast<uint64_t>(opts_.duration * 1e9) : 0;
  // The target may have ended while being armed.
  return HandleChild();
}

absl::StatusOr<bool> PtraceSession::Step(absl::Duration timeout) {
  if (!failed_.ok()) {
    return false;
  }
  if (loop_ == nullptr) {
    if (absl::Status s = OpenLoop(); !s.ok()) {
      failed_ = s;
      return s;
    }
  }
  if (!stop_reason_.empty()) {
    return false;
  }
  absl::StatusOr<ProbeLoop::Ready> ready =
      loop_->Wait(static_cast<int>(absl::ToInt64Milliseconds(timeout)));
  if (!ready.ok()) {
    failed_ = ready.status();
    return failed_;
  }
  const ProbeLoop::Ready& r = *ready;
  if (r.stop_signal != 0) {
    Stop(absl::StrCat("interrupted by ", sigabbrev_np(r.stop_signal)));
    return false;
  }
  // SIGCHLD may merge with another one: poll on every round.
  if (absl::Status s = HandleChild(); !s.ok()) {
    failed_ = s;
    return s;
  }
  if (r.tick || NowNs() >= last_duties_ns_ + kDutyIntervalNs) {
    Duties(0);
  }
  return stop_reason_.empty();
}

absl::Status PtraceSession::Release() {
  if (group_ != nullptr) {
    // Forks from now on are cleaned and let go; children already announced are adopted (and
    // restored below).
    group_->set_follow_forks(false);
    (void)HandleChild();
  }
  const bool kill_children = proc_->launched() && opts_.kill_on_exit;
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
    sink_->OnNote(absl::StrFormat("probes removed from %zu followed child%s, detached; %s running",
                                  detached, detached == 1 ? "" : "ren",
                                  detached == 1 ? "it keeps" : "they keep"));
  }
  if (engine_ != nullptr && proc_->alive()) {
    KW_RETURN_IF_ERROR(engine_->RestoreAll());
  }
  if (proc_->alive()) {
    if (proc_->launched() && opts_.kill_on_exit) {
      KW_RETURN_IF_ERROR(proc_->Kill());
      stop_reason_ += "; target killed (--kill-on-exit)";
    } else {
      KW_RETURN_IF_ERROR(proc_->Detach());
      sink_->OnNote(
          absl::StrFormat("probes removed, detached; target %d keeps running", proc_->pid()));
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

absl::Status PtraceSession::Begin() {
  absl::Status s = Start();
  if (s.ok()) {
    s = Arm();
  }
  if (!s.ok()) {
    Abandon();
  }
  return s;
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
    if (proc_->launched() && (sink_ == nullptr || opts_.kill_on_exit)) {
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
  if (!failed_.ok()) {
    Abandon();
    return failed_;
  }
  std::map<uint32_t, ProbeEndStats> stats;
  for (const core::Int3Engine* eng : Engines()) {  // every process and image counts
    for (const auto& set : id_sets_[eng]) {
      for (const auto& [def_id, id] : set) {
        if (absl::StatusOr<core::ProbeStats> st = eng->Stats(id); st.ok()) {
          ProbeEndStats& e = stats[def_id];
          e.misses += st->misses;
          e.nmissed += st->nmissed;
          e.abandoned += st->abandoned;
          e.faults += st->faults;
        }
      }
    }
  }
  ProbeRunInfo info;
  info.backend = "ptrace";
  info.pid = proc_->pid();
  info.seconds = static_cast<double>(NowNs() - start_ns_) / 1e9;
  const absl::Status released = Release();
  info.stop_reason = stop_reason_;
  if (proc_->forks() > 0) {
    notes_.push_back(absl::StrFormat(
        "the target forked %d child%s: not followed, their copy of the code was restored",
        proc_->forks(), proc_->forks() == 1 ? "" : "ren"));
  }
  if (!children_.empty()) {
    std::string pids;
    for (const auto& t : children_) {
      absl::StrAppend(&pids, pids.empty() ? "" : " ", t->proc->pid());
    }
    notes_.push_back(absl::StrFormat(
        "followed %d forked child%s (-f; pids %s): their hits are counted above and labelled "
        "with their pid",
        children_.size(), children_.size() == 1 ? "" : "ren", pids));
  }
  uint64_t spurious = proc_->spurious_traps();
  for (const auto& t : children_) {
    spurious += t->proc->spurious_traps();
  }
  if (spurious > 0) {
    notes_.push_back(absl::StrFormat(
        "absorbed %d spurious debug trap%s (SIGTRAP with no cause: no debug-register bit, no "
        "icebp) that would have killed a target without a SIGTRAP handler",
        spurious, spurious == 1 ? "" : "s"));
  }
  info.notes = notes_;
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
                                                                 const ProbeSet& set, int sigfd,
                                                                 const ProbeSessionHooks& hooks) {
  auto session = std::make_unique<PtraceSession>(opts, set, sigfd, hooks);
  KW_RETURN_IF_ERROR(session->Begin());
  return session;
}

}  // namespace kwatch::watch::probe
