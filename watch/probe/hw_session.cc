#include "watch/probe/hw_session.h"

#include <sys/types.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"
#include "core/ptrace/maps.h"
#include "core/ptrace/process.h"
#include "core/symbols/symbolizer.h"
#include "core/symbols/symbols.h"
#include "drmgr/slot_allocator.h"
#include "drmgr/slot_registry.h"
#include "watch/probe/hw_probes.h"
#include "watch/probe/probe_loop.h"

namespace kwatch::watch::probe {

namespace {

constexpr char kBackendName[] = "hw";

class HwSession : public ProbeSession {
 public:
  HwSession(const ProbeSessionOptions& opts, const ProbeSet& set, int sigfd,
            const ProbeSessionHooks& hooks)
      : opts_(opts), set_(set), sigfd_(sigfd), hooks_(hooks) {}
  ~HwSession() override;
  HwSession(const HwSession&) = delete;
  HwSession& operator=(const HwSession&) = delete;

  // Start and Arm; on error, cleans up (Abandon).
  absl::Status Begin();
  absl::StatusOr<bool> Step(absl::Duration timeout) override;
  absl::StatusOr<ProbeSessionEnd> Finish() override;

 private:
  absl::Status Start();
  absl::Status Arm();
  // The first Step's: the loop, the deadline, and the target's end while it was armed.
  absl::Status OpenLoop();
  // After a failure: clears the registers and lets the target go (or kills it).
  void Abandon();
  absl::Status HandleChild();
  absl::Status Release();
  void OnHit(const HwProbes::Hit& h);
  void Duties(int stop_signal);
  void Stop(std::string reason);
  void Publish();
  // The placement lines ("probe #1 tick (tick): DR0 ...") for stderr and the summary.
  std::vector<std::string> Placements() const;

  ProbeSessionOptions opts_;
  const ProbeSet& set_;
  int sigfd_;
  ProbeSessionHooks hooks_;
  std::unique_ptr<ProbeLoop> loop_;
  absl::Status failed_;  // a Step's failure
  std::unique_ptr<core::Process> proc_;
  std::unique_ptr<core::Symbols> symbols_;
  std::unique_ptr<core::Symbolizer> symbolizer_;
  HitSink* sink_ = nullptr;  // from hooks_.begin
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

void HwSession::Stop(std::string reason) {
  if (stop_reason_.empty()) {
    stop_reason_ = std::move(reason);
  }
}

void HwSession::Duties(int stop_signal) {
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

void HwSession::OnHit(const HwProbes::Hit& h) {
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

absl::Status HwSession::Start() {
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
          absl::StrFormat("probe %s (%s): 0x%x is not in executable code of pid %d", HwProbeName(p),
                          p.Location(), addr, proc_->pid()));
    }
  }
  const core::Process* proc = proc_.get();
  read_ = [proc](core::RemoteAddr a, std::span<uint8_t> out) { return proc->ReadMemory(a, out); };
  KW_ASSIGN_OR_RETURN(symbols_, core::Symbols::ForProcess(proc_->pid()));
  symbolizer_ = std::make_unique<core::Symbolizer>(*symbols_);
  return hooks_.open_recording(proc_->pid(), bias_);
}

std::vector<std::string> HwSession::Placements() const {
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
        HwProbeName(p), p.Location(), it->second, p.point.vaddr.value + bias_);
    const std::vector<uint32_t>& with = sharing[it->second];
    if (with.size() > 1) {
      std::vector<uint32_t> others;
      for (uint32_t id : with) {
        if (id != p.id) {
          others.push_back(id);
        }
      }
      absl::StrAppend(&line, " (shared with probe", others.size() == 1 ? " " : "s ",
                      HwIdList(others), ": same address)");
    }
    lines.push_back(std::move(line));
  }
  return lines;
}

void HwSession::Publish() {
  if (hw_ == nullptr || hw_->allocator() == nullptr) {
    return;
  }
  if (absl::Status s =
          drmgr::PublishSlots(proc_->pid(), hw_->allocator()->Snapshot(), opts_.command_line);
      !s.ok()) {
    sink_->OnNote(absl::StrCat("note: `kwatch slots` will not see this session: ", s.message()));
    return;
  }
  published_ = true;
}

absl::Status HwSession::Arm() {
  hw_ = std::make_unique<HwProbes>(*proc_, *symbolizer_, set_.probes, bias_,
                                   [this](const HwProbes::Hit& h) { OnHit(h); });
  start_ns_ = NowNs();
  last_duties_ns_ = start_ns_;
  ProbeSessionStart start;
  start.start_ns = start_ns_;
  // No return probes under --hw: nothing to name a caller for.
  sink_ = &hooks_.begin(start);
  const uint64_t arm_start = NowNs();
  KW_RETURN_IF_ERROR(hw_->Arm());
  const uint64_t arm_ns = NowNs() - arm_start;
  armed_ = true;
  for (const ProbeDef& p : set_.probes) {
    placed_[p.id] = hw_->RegisterOf(p.id);
  }
  sink_->OnStart();
  sink_->OnNote(
      absl::StrFormat("armed %zu probe%s on pid %d (%s), hw backend: execute breakpoints in "
                      "debug registers through ptrace, the code is not modified (%.2f ms)",
                      set_.probes.size(), set_.probes.size() == 1 ? "" : "s", proc_->pid(),
                      set_.path, static_cast<double>(arm_ns) / 1e6));
  for (const std::string& line : Placements()) {
    sink_->OnNote(absl::StrCat("  ", line));
  }
  if (const int ext = hw_->external_slots(); ext > 0) {
    sink_->OnNote(absl::StrFormat(
        "%d debug register%s of pid %d %s held outside kwatch (a debugger's hardware "
        "breakpoints, or another tool); the probes use the rest (`kwatch slots -p %d` shows "
        "them)",
        ext, ext == 1 ? "" : "s", proc_->pid(), ext == 1 ? "is" : "are", proc_->pid()));
  }
  Publish();
  return absl::OkStatus();
}

absl::Status HwSession::HandleChild() {
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
        sink_->OnNote(notes_.back());
        KW_RETURN_IF_ERROR(proc_->Resume(e.tid));
        break;
      case core::ProcessEvent::Kind::kGroupStop:
        sink_->OnNote(absl::StrFormat("target %d stopped by %s (job control); still probing",
                                      proc_->pid(), sigabbrev_np(e.signal)));
        break;
      default:
        break;
    }
  }
  return absl::OkStatus();
}

absl::Status HwSession::OpenLoop() {
  KW_ASSIGN_OR_RETURN(loop_, ProbeLoop::Create(sigfd_));
  deadline_ns_ = opts_.duration > 0 ? start_ns_ + static_cast<uint64_t>(opts_.duration * 1e9) : 0;
  return HandleChild();  // the target may have ended while being armed
}

absl::StatusOr<bool> HwSession::Step(absl::Duration timeout) {
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
  if (proc_->alive()) {
    if (absl::Status s = HandleChild(); !s.ok()) {
      failed_ = s;
      return s;
    }
  }
  if (r.tick || NowNs() >= last_duties_ns_ + kDutyIntervalNs) {
    Duties(0);
  }
  return stop_reason_.empty();
}

absl::Status HwSession::Release() {
  if (hw_ != nullptr && proc_->alive()) {
    hw_->Disarm();  // every thread's breakpoints closed
  }
  if (proc_->alive()) {
    if (proc_->launched() && opts_.kill_on_exit) {
      KW_RETURN_IF_ERROR(proc_->Kill());
      stop_reason_ += "; target killed (--kill-on-exit)";
    } else {
      KW_RETURN_IF_ERROR(proc_->Detach());
      sink_->OnNote(absl::StrFormat("debug registers cleared, detached; target %d keeps running",
                                    proc_->pid()));
    }
  }
  return absl::OkStatus();
}

HwSession::~HwSession() {
  if (published_) {
    drmgr::UnpublishSlots();
  }
}

absl::Status HwSession::Begin() {
  absl::Status s = Start();
  if (s.ok()) {
    s = Arm();
  }
  if (!s.ok()) {
    Abandon();
  }
  return s;
}

void HwSession::Abandon() {
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
}

absl::StatusOr<ProbeSessionEnd> HwSession::Finish() {
  if (!failed_.ok()) {
    Abandon();
    return failed_;
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
  ProbeSessionEnd end;
  end.stats = std::move(stats);
  end.info = std::move(info);
  end.launched = proc_->launched();
  end.error = released;
  ProbeSessionEnd::Hw& hw = end.hw.emplace();
  hw.registers = placed_;
  hw.external_slots = hw_->external_slots();
  hw.stray_traps = hw_->stray_traps();
  return end;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ProbeSession>> StartHwSession(const ProbeSessionOptions& opts,
                                                             const ProbeSet& set, int sigfd,
                                                             const ProbeSessionHooks& hooks) {
  // Refusals come before any target is started or touched.
  KW_RETURN_IF_ERROR(CheckHwProbes(set.probes));
  auto session = std::make_unique<HwSession>(opts, set, sigfd, hooks);
  KW_RETURN_IF_ERROR(session->Begin());
  return session;
}

}  // namespace kwatch::watch::probe
