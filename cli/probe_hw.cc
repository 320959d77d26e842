// `kwatch probe --hw`: probes as execute breakpoints in the debug registers (drmgr's slots,
// placed by the stop applier as perf events with sigtrap), on a launched or attached process.
// The code is never patched: no INT3, no out-of-line copies, no guardian.
#include <signal.h>
#include <sys/ptrace.h>
#include <sys/user.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "cli/probe_run.h"
#include "core/base/status_macros.h"
#include "core/probe/fetch.h"
#include "core/ptrace/maps.h"
#include "core/ptrace/process.h"
#include "core/symbols/symbolizer.h"
#include "core/symbols/symbols.h"
#include "drmgr/applier.h"
#include "drmgr/slot_allocator.h"
#include "drmgr/slot_registry.h"
#include "watch/session.h"
#include "watch/stop_backend.h"

namespace kwatch::cli {

namespace {

constexpr char kBackendName[] = "hw";

// "#3 tick"
std::string ProbeName(const ProbeDef& p) {
  return absl::StrCat("#", p.id, " ", p.point.event);
}

// What drmgr calls a probe's request (`kwatch slots` shows it as the holder).
std::string Label(const ProbeDef& p) {
  return absl::StrCat("probe ", ProbeName(p), " (", p.Location(), ")");
}

drmgr::SlotRequest RequestFor(const ProbeDef& p, uint64_t bias, pid_t pid) {
  drmgr::SlotRequest r;
  r.addr = core::RemoteAddr{p.point.vaddr.value + bias};
  r.len = 1;  // an execute breakpoint: DR7 LEN 00, at the instruction's first byte
  r.kind = drmgr::DrKind::kExec;
  r.scope = drmgr::Scope::Process(pid);
  r.priority = drmgr::DefaultPriority(drmgr::ClientKind::kExecProbe);
  r.policy = drmgr::ShortagePolicy::kFail;  // never multiplexed: a probe would miss hits
  r.label = Label(p);
  return r;
}

// "DR0-DR3" / "DR1" / "DR0, DR1"
std::string RegisterList(const std::vector<int>& regs) {
  std::vector<std::string> names;
  names.reserve(regs.size());
  bool consecutive = regs.size() > 2;
  for (size_t i = 0; i < regs.size(); ++i) {
    names.push_back(absl::StrCat("DR", regs[i]));
    consecutive = consecutive && (i == 0 || regs[i] == regs[i - 1] + 1);
  }
  if (consecutive) {
    return absl::StrCat("DR", regs.front(), "-DR", regs.back());
  }
  return absl::StrJoin(names, ", ");
}

// "#1-#4" / "#2" / "#1, #3"
std::string IdList(const std::vector<uint32_t>& ids) {
  bool consecutive = ids.size() > 2;
  for (size_t i = 1; i < ids.size(); ++i) {
    consecutive = consecutive && ids[i] == ids[i - 1] + 1;
  }
  if (consecutive) {
    return absl::StrCat("#", ids.front(), "-#", ids.back());
  }
  std::vector<std::string> names;
  names.reserve(ids.size());
  for (uint32_t id : ids) {
    names.push_back(absl::StrCat("#", id));
  }
  return absl::StrJoin(names, ", ");
}

// The refusal when some probes got no register. `reg` gives each probe's register (-1: none).
absl::Status NoRegisterError(const std::vector<ProbeDef>& probes, const std::vector<int>& reg,
                             int external, pid_t pid) {
  std::map<int, std::vector<uint32_t>> holders;  // register -> probe ids
  for (size_t i = 0; i < probes.size(); ++i) {
    if (reg[i] >= 0) {
      holders[reg[i]].push_back(probes[i].id);
    }
  }
  std::vector<int> regs;
  std::vector<uint32_t> ids;
  std::vector<std::string> got;
  for (const auto& [r, held] : holders) {
    regs.push_back(r);
    ids.insert(ids.end(), held.begin(), held.end());
    std::vector<std::string> names;
    for (uint32_t id : held) {
      names.push_back(ProbeName(probes[id - 1]));
    }
    got.push_back(absl::StrCat("DR", r, " ", absl::StrJoin(names, " + ")));
  }
  std::sort(ids.begin(), ids.end());
  std::string held_by;
  if (!regs.empty()) {
    held_by = absl::StrCat(RegisterList(regs), " held by probe", ids.size() == 1 ? " " : "s ",
                           IdList(ids));
  }
  if (external > 0) {
    absl::StrAppend(&held_by, held_by.empty() ? "" : ", ", external, " held outside kwatch",
                    pid != 0 ? absl::StrCat(" (another tool or a debugger: `kwatch slots -p ", pid,
                                            "` shows them)")
                             : "");
  }
  std::vector<std::string> refused;
  for (size_t i = 0; i < probes.size(); ++i) {
    if (reg[i] < 0) {
      refused.push_back(absl::StrCat("probe ", ProbeName(probes[i]), " (", probes[i].Location(),
                                     "): no debug register free (", held_by, ")"));
    }
  }
  std::string msg = absl::StrJoin(refused, "; ");
  absl::StrAppend(&msg, "; ",
                  got.empty() ? std::string("no probe got a debug register")
                              : absl::StrCat("placed: ", absl::StrJoin(got, ", ")),
                  ". --hw needs one debug register per probed address and x86 has 4 per "
                  "thread: drop --hw to use INT3 breakpoints, or probe fewer addresses");
  return absl::ResourceExhaustedError(msg);
}

}  // namespace

absl::Status CheckHwProbes(const std::vector<ProbeDef>& probes) {
  for (const ProbeDef& p : probes) {
    if (p.point.is_return) {
      return absl::InvalidArgumentError(absl::StrCat(
          "probe ", ProbeName(p), " (", p.Location(),
          "): --hw cannot place return probes: a return is caught at the caller's return "
          "address, a different place for each call, which the INT3 engine swaps for a "
          "trampoline on the stack at entry; drop --hw for %return probes (or probe the "
          "function's ret instruction, e.g. FUNC+OFF, with --hw)"));
    }
  }
  // drmgr's decision with every register free (link-time addresses: sharing is the same).
  drmgr::SlotAllocator dry;
  const drmgr::ClientId client = dry.AddClient(drmgr::ClientKind::kExecProbe, "kwatch probe");
  std::vector<int> reg(probes.size(), -1);
  bool all = true;
  for (size_t i = 0; i < probes.size(); ++i) {
    KW_ASSIGN_OR_RETURN(const drmgr::Grant g,
                        dry.Request(client, RequestFor(probes[i], 0, /*pid=*/1)));
    KW_ASSIGN_OR_RETURN(const drmgr::RequestView v, dry.Describe(g.id));
    if (v.state == drmgr::RequestState::kHardware && v.armed && !v.slots.empty()) {
      reg[i] = v.slots.front();
    } else {
      all = false;
    }
  }
  return all ? absl::OkStatus() : NoRegisterError(probes, reg, 0, 0);
}

// ---- HwProbes ----

HwProbes::HwProbes(core::Process& proc, core::Symbolizer& symbolizer,
                   const std::vector<ProbeDef>& probes, uint64_t load_bias, HitFn on_hit)
    : proc_(proc),
      symbolizer_(symbolizer),
      probes_(probes),
      bias_(load_bias),
      on_hit_(std::move(on_hit)) {}

HwProbes::~HwProbes() {
  backend_.reset();  // clears the registers of a live target
  proc_.RemoveInterceptor(this);
}

absl::Status HwProbes::Arm() {
  KW_RETURN_IF_ERROR(CheckHwProbes(probes_));
  alloc_ = std::make_unique<drmgr::SlotAllocator>();
  const drmgr::ClientId client = alloc_->AddClient(drmgr::ClientKind::kExecProbe, "kwatch probe");
  request_of_.clear();
  // Before the applier: the first interceptor that claims a signal handles it.
  proc_.AddInterceptor(this);
  backend_ = std::make_unique<watch::StopBackend>(proc_, no_watches_, symbolizer_,
                                                  std::map<drmgr::RequestId, uint32_t>{});
  // Every probe goes in while the target stands still.
  if (proc_.alive()) {
    KW_RETURN_IF_ERROR(proc_.StopAll());
  }
  proc_.HoldStopped();
  absl::Cleanup release = [this] { (void)proc_.ReleaseHold(); };
  KW_RETURN_IF_ERROR(backend_->Arm());
  absl::Cleanup undo = [this] {
    backend_->Disarm();
    armed_ = false;
  };
  for (size_t i = 0; i < probes_.size(); ++i) {
    const ProbeDef& p = probes_[i];
    KW_ASSIGN_OR_RETURN(drmgr::Grant g, alloc_->Request(client, RequestFor(p, bias_, proc_.pid())));
    backend_->AddOwner(g.id, static_cast<uint32_t>(i));
    request_of_[i] = g.id;
    if (absl::Status s = drmgr::ApplyWithRetry(*alloc_, *backend_, std::move(g.changes)); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("arming probe ", ProbeName(p), " (", p.Location(),
                                                 "): ", s.message()));
    }
  }
  // ENOSPC may have taken registers from probes armed before: every one must hold its own.
  std::vector<int> reg(probes_.size(), -1);
  bool all = true;
  for (size_t i = 0; i < probes_.size(); ++i) {
    reg[i] = RegisterOf(probes_[i].id);
    all = all && reg[i] >= 0;
  }
  if (!all) {
    return NoRegisterError(probes_, reg, external_slots(), proc_.pid());
  }
  armed_ = true;
  std::move(undo).Cancel();
  std::move(release).Cancel();
  return proc_.ReleaseHold();
}

void HwProbes::Disarm() {
  if (backend_ != nullptr) {
    backend_->Disarm();
  }
  armed_ = false;
}

void HwProbes::Forget() {
  if (backend_ != nullptr) {
    backend_->Forget();
  }
  armed_ = false;
}

int HwProbes::RegisterOf(uint32_t id) const {
  for (size_t i = 0; i < probes_.size(); ++i) {
    if (probes_[i].id != id) {
      continue;
    }
    auto it = request_of_.find(i);
    if (alloc_ == nullptr || it == request_of_.end()) {
      return -1;
    }
    absl::StatusOr<drmgr::RequestView> v = alloc_->Describe(it->second);
    if (!v.ok() || v->state != drmgr::RequestState::kHardware || !v->armed || v->slots.empty()) {
      return -1;
    }
    return v->slots.front();
  }
  return -1;
}

int HwProbes::external_slots() const {
  return alloc_ != nullptr ? alloc_->ExternallyHeld(drmgr::Scope::Process(proc_.pid())) : 0;
}

uint64_t HwProbes::stray_traps() const {
  return (backend_ != nullptr ? backend_->stray_traps() : 0) + off_address_;
}

bool HwProbes::Claims(pid_t /*tid*/, const siginfo_t& si) {
  return armed_ && watch::StopBackend::IsOwnTrap(si);
}

absl::Status HwProbes::Handle(pid_t tid, const siginfo_t& si) {
  KW_RETURN_IF_ERROR(backend_->Handle(tid, si));
  return Deliver(tid);
}

absl::StatusOr<bool> HwProbes::HandleInPlace(pid_t tid, const siginfo_t& si) {
  KW_ASSIGN_OR_RETURN(const bool done, backend_->HandleInPlace(tid, si));
  if (!done) {
    return false;
  }
  KW_RETURN_IF_ERROR(Deliver(tid));
  return true;
}

absl::Status HwProbes::Deliver(pid_t tid) {
  events_.clear();
  backend_->Collect(events_);
  if (events_.empty()) {
    return absl::OkStatus();  // the trap named no probe's breakpoint (counted by the applier)
  }
  absl::StatusOr<user_regs_struct> regs = proc_.GetRegs(tid);
  if (absl::IsNotFound(regs.status())) {
    return absl::OkStatus();  // the thread died under kwatch
  }
  KW_RETURN_IF_ERROR(regs.status());
  for (const core::AccessEvent& ev : events_) {
    if (ev.kind != core::AccessKind::kExec || ev.watch_id >= probes_.size()) {
      continue;
    }
    const ProbeDef& p = probes_[ev.watch_id];
    const core::RemoteAddr addr{p.point.vaddr.value + bias_};
    // An execute breakpoint is a fault: the thread stops before the instruction at its address.
    if (ev.trap_ip != addr) {
      ++off_address_;
      continue;
    }
    Hit hit;
    hit.probe = &p;
    hit.tid = tid;
    hit.time_ns = ev.time_ns;
    hit.ip = addr;
    hit.regs = &*regs;
    on_hit_(hit);
  }
  return absl::OkStatus();
}

ProbeHit EvaluateHwHit(const HwProbes::Hit& h, pid_t pid, uint64_t load_bias,
                       const core::MemoryReader& read) {
  ProbeHit hit;
  hit.time_ns = h.time_ns;
  hit.pid = pid;
  hit.tid = h.tid;
  hit.probe = h.probe;
  hit.ip = h.ip;
  // As cli/probe_ptrace.cc evaluates an entry probe's arguments.
  core::FetchContext fc;
  fc.regs = h.regs;
  fc.load_bias = load_bias;
  fc.read = read;
  fc.at_return = false;
  fc.tid = h.tid;
  user_fpregs_struct fp{};
  if (h.probe->needs_fpregs && ::ptrace(PTRACE_GETFPREGS, h.tid, nullptr, &fp) == 0) {
    fc.fpregs = &fp;
  }
  hit.args.reserve(h.probe->args.size());
  for (const core::CompiledArg& a : h.probe->args) {
    absl::StatusOr<std::string> v = core::Evaluate(a, fc);
    hit.args.emplace_back(
        a.name, v.ok() ? *std::move(v) : absl::StrCat("<error: ", v.status().message(), ">"));
  }
  return hit;
}

// ---- the session ----

namespace {

class HwRunner {
 public:
  HwRunner(const ProbeCmdOptions& opts, ProbeSet& set, int sigfd)
      : opts_(opts), set_(set), sigfd_(sigfd) {}

  absl::StatusOr<int> Run();

 private:
  absl::Status Start();
  absl::Status Arm();
  absl::Status Loop();
  absl::Status HandleChild();
  absl::Status Release();
  void OnHit(const HwProbes::Hit& h);
  void Duties(int stop_signal);
  void Stop(std::string reason);
  void Publish();
  // The placement lines ("probe #1 tick (tick): DR0 ...") for stderr and the summary.
  std::vector<std::string> Placements() const;
  // PrintProbeSummary, with each probe's debug register added to the JSON object.
  void PrintSummary(const std::map<uint32_t, ProbeEndStats>& stats, const ProbeRunInfo& info);

  const ProbeCmdOptions& opts_;
  ProbeSet& set_;
  int sigfd_;
  std::unique_ptr<core::Process> proc_;
  std::unique_ptr<core::Symbols> symbols_;
  std::unique_ptr<core::Symbolizer> symbolizer_;
  std::unique_ptr<core::TraceWriter> writer_;
  std::unique_ptr<HitPrinter> sink_;
  std::unique_ptr<HwProbes> hw_;
  core::MemoryReader read_;
  uint64_t bias_ = 0;
  uint64_t start_ns_ = 0;
  uint64_t deadline_ns_ = 0;
  uint64_t last_duties_ns_ = 0;
  // Hits after --count or a stop, while the registers were still armed, per probe id.
  std::map<uint32_t, uint64_t> misses_of_;
  std::map<uint32_t, int> placed_;  // probe id -> debug register, as armed
  std::string stop_reason_;
  std::vector<std::string> notes_;
  bool armed_ = false;  // the target ran with the probes in place
  bool published_ = false;
};

constexpr uint64_t kDutyIntervalNs = 50'000'000;

void HwRunner::Stop(std::string reason) {
  if (stop_reason_.empty()) {
    stop_reason_ = std::move(reason);
  }
}

void HwRunner::Duties(int stop_signal) {
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

void HwRunner::OnHit(const HwProbes::Hit& h) {
  if (h.time_ns >= last_duties_ns_ + kDutyIntervalNs && stop_reason_.empty()) {
    Duties(ReadStopSignal(sigfd_));
  }
  if (!stop_reason_.empty() || sink_->done()) {
    ++misses_of_[h.probe->id];  // the registers come out once the loop runs again
    return;
  }
  sink_->Add(EvaluateHwHit(h, proc_->pid(), bias_, read_));
  if (sink_->done()) {
    Stop(absl::StrCat("--count ", opts_.count, " reached"));
  }
}

absl::Status HwRunner::Start() {
  core::LaunchOptions lo;
  lo.run_as = opts_.user;
  lo.kill_on_exit = opts_.kill_on_exit;
  KW_ASSIGN_OR_RETURN(proc_, core::Process::Start(opts_.pid, opts_.command, lo));
  KW_ASSIGN_OR_RETURN(const std::vector<core::MapEntry> maps, proc_->Maps());
  absl::StatusOr<uint64_t> bias = set_.target->LoadBias(maps);
  if (!bias.ok()) {
    return absl::NotFoundError(
        absl::StrCat(set_.path, " is not mapped in process ", proc_->pid(),
                     " (a library loaded later with dlopen cannot be probed yet with --hw): ",
                     bias.status().message()));
  }
  bias_ = *bias;
  // An execute breakpoint outside executable code would never fire: refuse it, as the INT3
  // engine does.
  for (const ProbeDef& p : set_.probes) {
    const uint64_t addr = p.point.vaddr.value + bias_;
    const std::optional<core::MapEntry> m = core::FindMapping(maps, core::RemoteAddr{addr});
    if (!m.has_value() || !m->exec) {
      return absl::InvalidArgumentError(
          absl::StrFormat("probe %s (%s): 0x%x is not in executable code of pid %d", ProbeName(p),
                          p.Location(), addr, proc_->pid()));
    }
  }
  const core::Process* proc = proc_.get();
  read_ = [proc](core::RemoteAddr a, std::span<uint8_t> out) { return proc->ReadMemory(a, out); };
  KW_ASSIGN_OR_RETURN(symbols_, core::Symbols::ForProcess(proc_->pid()));
  symbolizer_ = std::make_unique<core::Symbolizer>(*symbols_);
  ProbeCmdOptions rec = opts_;
  rec.backend = kBackendName;
  KW_ASSIGN_OR_RETURN(writer_, OpenRecording(rec, set_, proc_->pid(), bias_));
  return absl::OkStatus();
}

std::vector<std::string> HwRunner::Placements() const {
  std::vector<std::string> lines;
  std::map<int, std::vector<uint32_t>> sharing;
  for (const auto& [id, reg] : placed_) {
    sharing[reg].push_back(id);
  }
  for (const ProbeDef& p : set_.probes) {
    auto it = placed_.find(p.id);
    if (it == placed_.end()) {
      continue;
    }
    std::string line = absl::StrFormat(
        "probe %s (%s): debug register DR%d, execute breakpoint at 0x%x in every thread",
        ProbeName(p), p.Location(), it->second, p.point.vaddr.value + bias_);
    const std::vector<uint32_t>& with = sharing[it->second];
    if (with.size() > 1) {
      std::vector<uint32_t> others;
      for (uint32_t id : with) {
        if (id != p.id) {
          others.push_back(id);
        }
      }
      absl::StrAppend(&line, " (shared with probe", others.size() == 1 ? " " : "s ", IdList(others),
                      ": same address)");
    }
    lines.push_back(std::move(line));
  }
  return lines;
}

void HwRunner::Publish() {
  if (hw_ == nullptr || hw_->allocator() == nullptr) {
    return;
  }
  if (absl::Status s =
          drmgr::PublishSlots(proc_->pid(), hw_->allocator()->Snapshot(), opts_.command_line);
      !s.ok()) {
    std::fprintf(stderr, "kwatch: note: `kwatch slots` will not see this session: %s\n",
                 std::string(s.message()).c_str());
    return;
  }
  published_ = true;
}

absl::Status HwRunner::Arm() {
  hw_ = std::make_unique<HwProbes>(*proc_, *symbolizer_, set_.probes, bias_,
                                   [this](const HwProbes::Hit& h) { OnHit(h); });
  start_ns_ = NowNs();
  last_duties_ns_ = start_ns_;
  SinkOptions so;
  so.json = opts_.json;
  so.quiet = opts_.quiet;
  so.count = opts_.count;
  so.start_ns = start_ns_;
  so.backend = kBackendName;
  // No return probes under --hw: nothing to name a caller for.
  sink_ = std::make_unique<HitPrinter>(STDOUT_FILENO, so, set_.probes, writer_.get(), nullptr);
  const uint64_t arm_start = NowNs();
  KW_RETURN_IF_ERROR(hw_->Arm());
  const uint64_t arm_ns = NowNs() - arm_start;
  armed_ = true;
  for (const ProbeDef& p : set_.probes) {
    placed_[p.id] = hw_->RegisterOf(p.id);
  }
  sink_->PrintHeader();
  std::fprintf(stderr,
               "kwatch: armed %zu probe%s on pid %d (%s), hw backend: execute breakpoints in "
               "debug registers through ptrace, the code is not modified (%.2f ms)\n",
               set_.probes.size(), set_.probes.size() == 1 ? "" : "s", proc_->pid(),
               set_.path.c_str(), static_cast<double>(arm_ns) / 1e6);
  for (const std::string& line : Placements()) {
    std::fprintf(stderr, "kwatch:   %s\n", line.c_str());
  }
  if (const int ext = hw_->external_slots(); ext > 0) {
    std::fprintf(stderr,
                 "kwatch: %d debug register%s of pid %d %s held outside kwatch (a debugger's "
                 "hardware breakpoints, or another tool); the probes use the rest (`kwatch slots "
                 "-p %d` shows them)\n",
                 ext, ext == 1 ? "" : "s", proc_->pid(), ext == 1 ? "is" : "are", proc_->pid());
  }
  std::fflush(stderr);
  Publish();
  return absl::OkStatus();
}

absl::Status HwRunner::HandleChild() {
  KW_ASSIGN_OR_RETURN(const std::vector<core::ProcessEvent> events, proc_->Poll());
  for (const core::ProcessEvent& e : events) {
    switch (e.kind) {
      case core::ProcessEvent::Kind::kExited:
        Stop(proc_->exit_info()->signaled
                 ? absl::StrCat("target killed by ", sigabbrev_np(proc_->exit_info()->signal))
                 : "target exited");
        break;
      case core::ProcessEvent::Kind::kExec:
        hw_->Forget();
        notes_.push_back(absl::StrFormat(
            "target %d called exec: the probes of the old image ended there", proc_->pid()));
        std::fprintf(stderr, "kwatch: %s\n", notes_.back().c_str());
        KW_RETURN_IF_ERROR(proc_->Resume(e.tid));
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

absl::Status HwRunner::Loop() {
  KW_ASSIGN_OR_RETURN(std::unique_ptr<ProbeLoop> loop, ProbeLoop::Create(sigfd_));
  deadline_ns_ = opts_.duration > 0 ? start_ns_ + static_cast<uint64_t>(opts_.duration * 1e9) : 0;
  KW_RETURN_IF_ERROR(HandleChild());  // the target may have ended while being armed
  while (stop_reason_.empty()) {
    KW_ASSIGN_OR_RETURN(const ProbeLoop::Ready r, loop->Wait(1000));
    if (r.stop_signal != 0) {
      Stop(absl::StrCat("interrupted by ", sigabbrev_np(r.stop_signal)));
      break;
    }
    if (proc_->alive()) {
      KW_RETURN_IF_ERROR(HandleChild());
    }
    if (r.tick || NowNs() >= last_duties_ns_ + kDutyIntervalNs) {
      Duties(0);
    }
  }
  return absl::OkStatus();
}

absl::Status HwRunner::Release() {
  if (hw_ != nullptr && proc_->alive()) {
    hw_->Disarm();  // every thread's breakpoints closed
  }
  if (proc_->alive()) {
    if (proc_->launched() && opts_.kill_on_exit) {
      KW_RETURN_IF_ERROR(proc_->Kill());
      stop_reason_ += "; target killed (--kill-on-exit)";
    } else {
      KW_RETURN_IF_ERROR(proc_->Detach());
      std::fprintf(stderr, "kwatch: debug registers cleared, detached; target %d keeps running\n",
                   proc_->pid());
    }
  }
  return absl::OkStatus();
}

void HwRunner::PrintSummary(const std::map<uint32_t, ProbeEndStats>& stats,
                            const ProbeRunInfo& info) {
  if (!opts_.json) {
    PrintProbeSummary(stdout, false, set_.probes, *sink_, stats, info);
    return;
  }
  // The common summary object, plus where each probe was in the registers.
  char* buf = nullptr;
  size_t len = 0;
  FILE* mem = open_memstream(&buf, &len);
  if (mem == nullptr) {
    PrintProbeSummary(stdout, true, set_.probes, *sink_, stats, info);
    return;
  }
  PrintProbeSummary(mem, true, set_.probes, *sink_, stats, info);
  std::fclose(mem);
  const std::string text(buf, len);
  std::free(buf);  // NOLINT(cppcoreguidelines-no-malloc): open_memstream's buffer
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.contains("probes")) {
    std::fputs(text.c_str(), stdout);
    return;
  }
  for (nlohmann::ordered_json& pj : j["probes"]) {
    const auto it = placed_.find(pj.value("id", 0U));
    if (it != placed_.end() && it->second >= 0) {
      pj["debug_register"] = it->second;
    } else {
      pj["debug_register"] = nullptr;
    }
  }
  j["external_slots"] = hw_ != nullptr ? hw_->external_slots() : 0;
  j["stray_traps"] = hw_ != nullptr ? hw_->stray_traps() : 0;
  std::fputs(j.dump().c_str(), stdout);
  std::fputc('\n', stdout);
}

absl::StatusOr<int> HwRunner::Run() {
  absl::Status s = Start();
  if (s.ok()) {
    s = Arm();
  }
  if (s.ok()) {
    s = Loop();
  }
  absl::Cleanup unpublish = [this] {
    if (published_) {
      drmgr::UnpublishSlots();
    }
  };
  if (!s.ok()) {
    if (proc_ != nullptr && proc_->alive()) {
      if (hw_ != nullptr) {
        hw_->Disarm();
      }
      // A launched target that never ran its own code is not left behind.
      if (proc_->launched() && (!armed_ || opts_.kill_on_exit)) {
        (void)proc_->Kill();
      } else {
        (void)proc_->Detach();
      }
    }
    return s;
  }
  std::map<uint32_t, ProbeEndStats> stats;
  for (const auto& [id, n] : misses_of_) {
    stats[id].misses = n;
  }
  ProbeRunInfo info;
  info.backend = kBackendName;
  info.pid = proc_->pid();
  info.seconds = static_cast<double>(NowNs() - start_ns_) / 1e9;
  const absl::Status released = Release();
  info.stop_reason = stop_reason_;
  std::vector<std::string> notes = Placements();
  for (std::string& n : notes) {
    n = absl::StrCat("hw: ", n);
  }
  if (const int ext = hw_->external_slots(); ext > 0) {
    notes.push_back(absl::StrFormat("hw: %d debug register%s held outside kwatch", ext,
                                    ext == 1 ? " was" : "s were"));
  }
  if (const uint64_t stray = hw_->stray_traps(); stray > 0) {
    notes.push_back(absl::StrFormat("hw: %d debug trap%s named no probe's register (dropped)",
                                    stray, stray == 1 ? "" : "s"));
  }
  if (proc_->forks() > 0) {
    notes.push_back(absl::StrFormat(
        "the target forked %d child%s: not followed, their debug registers were cleared",
        proc_->forks(), proc_->forks() == 1 ? "" : "ren"));
  }
  if (proc_->spurious_traps() > 0) {
    notes.push_back(absl::StrFormat(
        "absorbed %d spurious debug trap%s (SIGTRAP with no cause: no debug-register bit, no "
        "icebp) that would have killed a target without a SIGTRAP handler",
        proc_->spurious_traps(), proc_->spurious_traps() == 1 ? "" : "s"));
  }
  notes.insert(notes.end(), notes_.begin(), notes_.end());
  info.notes = std::move(notes);
  info.exit = proc_->exit_info();
  sink_->Flush();
  std::fflush(stdout);
  const bool recorded = FinishRecording(writer_.get(), *sink_, info, opts_.output);
  PrintSummary(stats, info);
  std::fflush(stdout);
  KW_RETURN_IF_ERROR(released);
  if (!recorded) {
    return 1;  // -o was not honoured (docs/recording.md)
  }
  if (proc_->launched() && info.exit.has_value()) {
    return info.exit->ShellStatus();
  }
  return 0;
}

}  // namespace

absl::StatusOr<int> RunHwProbes(const ProbeCmdOptions& opts, ProbeSet& set, int sigfd) {
  // Refusals come before any target is started or touched.
  KW_RETURN_IF_ERROR(CheckHwProbes(set.probes));
  HwRunner runner(opts, set, sigfd);
  return runner.Run();
}

}  // namespace kwatch::cli
