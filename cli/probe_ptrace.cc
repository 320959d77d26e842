// `kwatch probe --backend ptrace`: the INT3 engine (core/probe/int3_engine.h) on a launched
// or attached process, every patch journaled by a guardian process.
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
#include "cli/probe_run.h"
#include "core/guardian.h"
#include "core/probe/fetch.h"
#include "core/probe/int3_engine.h"
#include "core/process.h"
#include "core/status_macros.h"
#include "core/symbolizer.h"
#include "core/symbols.h"

#ifndef KWATCH_VERSION
#define KWATCH_VERSION "dev"
#endif

namespace kwatch::cli {

namespace {

class PtraceRunner {
 public:
  PtraceRunner(const ProbeCmdOptions& opts, ProbeSet& set, int sigfd)
      : opts_(opts), set_(set), sigfd_(sigfd) {}

  absl::StatusOr<int> Run();

 private:
  absl::Status Start();
  absl::Status Arm();
  absl::Status Loop();
  absl::Status HandleChild();
  // Restores the target and lets it go (detach, or kill with --kill-on-exit).
  absl::Status Release();
  void OnHit(const ProbeDef& def, const core::ProbeContext& ctx);
  // What the loop does every round: flush, check the stop conditions. Also run from the hit
  // handler every 50 ms: while the target hits probes back to back, Process::Poll keeps
  // handling its stops and does not return to the loop.
  void Duties(int stop_signal);
  void Stop(std::string reason);
  std::string Caller(core::RemoteAddr ra);

  const ProbeCmdOptions& opts_;
  ProbeSet& set_;
  int sigfd_;
  std::unique_ptr<core::Process> proc_;
  std::unique_ptr<core::Guardian> guardian_;
  std::unique_ptr<core::Int3Engine> engine_;
  std::unique_ptr<core::Symbols> symbols_;
  std::unique_ptr<core::Symbolizer> symbolizer_;
  std::unique_ptr<core::TraceWriter> writer_;
  std::unique_ptr<HitSink> sink_;
  core::MemoryReader read_;
  uint64_t bias_ = 0;
  uint64_t start_ns_ = 0;
  std::map<uint32_t, core::ProbeId> ids_;  // ProbeDef::id -> engine id
  std::string stop_reason_;
  std::vector<std::string> notes_;
  uint64_t deadline_ns_ = 0;  // --duration, 0: none
  uint64_t last_duties_ns_ = 0;
  bool probes_disabled_ = false;
};

constexpr uint64_t kDutyIntervalNs = 50'000'000;

void PtraceRunner::Stop(std::string reason) {
  if (!stop_reason_.empty()) {
    return;
  }
  stop_reason_ = std::move(reason);
  // No more hits are shown; the probes come out once the loop runs again (Release).
  if (engine_ != nullptr && !probes_disabled_) {
    probes_disabled_ = true;
    for (const auto& [def_id, id] : ids_) {
      (void)engine_->Disable(id);
    }
  }
}

void PtraceRunner::Duties(int stop_signal) {
  last_duties_ns_ = NowNs();
  sink_->Flush();
  if (stop_signal != 0) {
    Stop(absl::StrCat("interrupted by ", sigabbrev_np(stop_signal)));
  }
  if (!sink_->record_error().ok()) {
    Stop(absl::StrCat("recording failed: ", sink_->record_error().message()));
  }
  if (sink_->output_failed()) {
    Stop("output closed");
  }
  if (deadline_ns_ != 0 && last_duties_ns_ >= deadline_ns_) {
    Stop(absl::StrFormat("--duration %gs elapsed", opts_.duration));
  }
}

std::string PtraceRunner::Caller(core::RemoteAddr ra) {
  if (symbolizer_ == nullptr) {
    return absl::StrFormat("0x%x", ra.value);
  }
  const core::CodeLocation& loc = symbolizer_->Locate(ra);
  if (loc.function.empty()) {
    return absl::StrFormat("0x%x", ra.value);
  }
  return core::Symbolizer::Format(loc);
}

void PtraceRunner::OnHit(const ProbeDef& def, const core::ProbeContext& ctx) {
  if (ctx.time_ns >= last_duties_ns_ + kDutyIntervalNs && stop_reason_.empty()) {
    Duties(ReadStopSignal(sigfd_));
    if (!stop_reason_.empty()) {
      std::fprintf(stderr,
                   "kwatch: stopping (%s): the probes are disabled and come out as soon as the "
                   "target pauses between hits\n",
                   stop_reason_.c_str());
    }
  }
  if (!stop_reason_.empty() || sink_->done()) {
    return;  // stopping: the probes are disabled
  }
  ProbeHit hit;
  hit.time_ns = ctx.time_ns;
  hit.pid = proc_->pid();
  hit.tid = ctx.tid;
  hit.probe = &def;
  hit.ip = ctx.addr;
  hit.return_address = ctx.return_address;
  core::FetchContext fc;
  fc.regs = &ctx.regs;
  fc.load_bias = bias_;
  fc.read = read_;
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

absl::Status PtraceRunner::Start() {
  if (opts_.pid.has_value()) {
    KW_ASSIGN_OR_RETURN(proc_, core::Process::Attach(*opts_.pid));
  } else {
    core::LaunchOptions lo;
    lo.run_as = opts_.user;
    lo.kill_on_exit = opts_.kill_on_exit;
    KW_ASSIGN_OR_RETURN(proc_, core::Process::Launch(opts_.command, lo));
    KW_RETURN_IF_ERROR(proc_->RunToEntry());
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
  KW_ASSIGN_OR_RETURN(writer_, OpenRecording(opts_, set_, proc_->pid(), bias_));
  return absl::OkStatus();
}

absl::Status PtraceRunner::Arm() {
  KW_RETURN_IF_ERROR(engine_->StopWorld());
  for (const ProbeDef& def : set_.probes) {
    const core::RemoteAddr addr{def.point.vaddr.value + bias_};
    core::ProbeHandlers h;
    h.pre = [this, &def](const core::ProbeContext& ctx) { OnHit(def, ctx); };
    absl::StatusOr<core::ProbeId> id;
    if (def.point.is_return) {
      core::ReturnProbeOptions ro;
      ro.maxactive = opts_.maxactive;
      id = engine_->RegisterReturn(addr, std::move(h), ro);
    } else {
      id = engine_->Register(addr, std::move(h));
    }
    if (!id.ok()) {
      (void)engine_->ResumeWorld();
      return absl::Status(id.status().code(),
                          absl::StrCat("probe ", def.point.event, " (", def.Location(),
                                       "): ", id.status().message()));
    }
    ids_[def.id] = *id;
  }
  start_ns_ = NowNs();
  last_duties_ns_ = start_ns_;
  SinkOptions so;
  so.json = opts_.json;
  so.quiet = opts_.quiet;
  so.count = opts_.count;
  so.start_ns = start_ns_;
  so.backend = "ptrace";
  sink_ = std::make_unique<HitSink>(STDOUT_FILENO, so, set_.probes, writer_.get(),
                                    [this](core::RemoteAddr ra) { return Caller(ra); });
  sink_->PrintHeader();
  std::fprintf(stderr, "kwatch: armed %zu probe%s on pid %d (%s), ptrace backend\n",
               set_.probes.size(), set_.probes.size() == 1 ? "" : "s", proc_->pid(),
               set_.path.c_str());
  std::fflush(stderr);
  return engine_->ResumeWorld();
}

absl::Status PtraceRunner::HandleChild() {
  KW_ASSIGN_OR_RETURN(const std::vector<core::ProcessEvent> events, proc_->Poll());
  for (const core::ProcessEvent& e : events) {
    switch (e.kind) {
      case core::ProcessEvent::Kind::kExited:
        Stop(proc_->exit_info()->signaled
                 ? absl::StrCat("target killed by ", sigabbrev_np(proc_->exit_info()->signal))
                 : "target exited");
        break;
      case core::ProcessEvent::Kind::kExec:
        engine_->OnExec();
        notes_.push_back(absl::StrFormat(
            "target %d called exec: the probes of the old image ended there", proc_->pid()));
        std::fprintf(stderr, "kwatch: %s\n", notes_.back().c_str());
        KW_RETURN_IF_ERROR(proc_->Resume(e.tid));
        break;
      case core::ProcessEvent::Kind::kThreadExited:
        engine_->OnThreadExit(e.tid);
        break;
      case core::ProcessEvent::Kind::kGroupStop:
        std::fprintf(stderr, "kwatch: target %d stopped by %s (job control); still probing\n",
                     proc_->pid(), sigabbrev_np(e.signal));
        break;
      default:
        break;
    }
  }
  return absl::OkStatus();
}

absl::Status PtraceRunner::Loop() {
  KW_ASSIGN_OR_RETURN(std::unique_ptr<ProbeLoop> loop, ProbeLoop::Create(sigfd_));
  deadline_ns_ = opts_.duration > 0 ? start_ns_ + static_cast<uint64_t>(opts_.duration * 1e9) : 0;
  // The target may have ended while being armed.
  KW_RETURN_IF_ERROR(HandleChild());
  while (stop_reason_.empty()) {
    KW_ASSIGN_OR_RETURN(const ProbeLoop::Ready r, loop->Wait(1000));
    if (r.stop_signal != 0) {
      Stop(absl::StrCat("interrupted by ", sigabbrev_np(r.stop_signal)));
      break;
    }
    // SIGCHLD may merge with another one: poll on every round.
    if (proc_->alive()) {
      KW_RETURN_IF_ERROR(HandleChild());
    }
    if (r.tick || NowNs() >= last_duties_ns_ + kDutyIntervalNs) {
      Duties(0);
    }
  }
  return absl::OkStatus();
}

absl::Status PtraceRunner::Release() {
  if (engine_ != nullptr && proc_->alive()) {
    KW_RETURN_IF_ERROR(engine_->RestoreAll());
  }
  if (proc_->alive()) {
    if (proc_->launched() && opts_.kill_on_exit) {
      KW_RETURN_IF_ERROR(proc_->Kill());
      stop_reason_ += "; target killed (--kill-on-exit)";
    } else {
      KW_RETURN_IF_ERROR(proc_->Detach());
      std::fprintf(stderr, "kwatch: probes removed, detached; target %d keeps running\n",
                   proc_->pid());
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

absl::StatusOr<int> PtraceRunner::Run() {
  absl::Status s = Start();
  if (s.ok()) {
    s = Arm();
  }
  if (s.ok()) {
    s = Loop();
  }
  if (!s.ok()) {
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
    return s;
  }
  std::map<uint32_t, ProbeEndStats> stats;
  for (const auto& [def_id, id] : ids_) {
    if (absl::StatusOr<core::ProbeStats> st = engine_->Stats(id); st.ok()) {
      ProbeEndStats& e = stats[def_id];
      e.misses = st->misses;
      e.nmissed = st->nmissed;
      e.abandoned = st->abandoned;
      e.faults = st->faults;
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
  if (proc_->spurious_traps() > 0) {
    notes_.push_back(absl::StrFormat(
        "absorbed %d spurious debug trap%s (SIGTRAP with no cause: no debug-register bit, no "
        "icebp) that would have killed a target without a SIGTRAP handler",
        proc_->spurious_traps(), proc_->spurious_traps() == 1 ? "" : "s"));
  }
  info.notes = notes_;
  info.exit = proc_->exit_info();
  sink_->Flush();
  std::fflush(stdout);
  FinishRecording(writer_.get(), *sink_, info, opts_.output);
  PrintProbeSummary(stdout, opts_.json, set_.probes, *sink_, stats, info);
  std::fflush(stdout);
  KW_RETURN_IF_ERROR(released);
  if (proc_->launched() && info.exit.has_value()) {
    return info.exit->ShellStatus();
  }
  return 0;
}

}  // namespace

absl::StatusOr<int> RunPtraceProbes(const ProbeCmdOptions& opts, ProbeSet& set, int sigfd) {
  PtraceRunner runner(opts, set, sigfd);
  return runner.Run();
}

}  // namespace kwatch::cli
