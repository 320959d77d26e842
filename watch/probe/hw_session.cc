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
#include "core/base/clock.h"
#include "core/base/status_macros.h"
#include "core/ptrace/maps.h"
#include "core/ptrace/process.h"
#include "core/symbols/symbolizer.h"
#include "core/symbols/symbols.h"
#include "drmgr/slot_allocator.h"
#include "drmgr/slot_registry.h"
#include "watch/probe/hit_stacks.h"
#include "watch/probe/hw_probes.h"
#include "watch/probe/session_base.h"

namespace kwatch::watch::probe {

namespace {

class HwSession : public ProbeSessionBase {
 public:
  HwSession(const ProbeSessionOptions& opts, const ProbeSet& set, std::unique_ptr<EventLoop> loop,
            const ProbeSessionHooks& hooks)
      : ProbeSessionBase("hw", opts, set, std::move(loop), hooks) {}
  ~HwSession() override;
  HwSession(const HwSession&) = delete;
  HwSession& operator=(const HwSession&) = delete;
  HwSession(HwSession&&) = delete;
  HwSession& operator=(HwSession&&) = delete;

  absl::StatusOr<ProbeSessionEnd> Finish() override;

 private:
  // Launches or attaches, checks the probed addresses, opens the recording, then Arm.
  absl::Status Start() override;
  absl::Status Arm();
  // After a failure: clears the registers and lets the target go (or kills it).
  void Abandon() override;
  absl::Status PollTarget() override;
  absl::Status Release();
  void OnHit(const HwProbes::Hit& h);
  void Publish();
  // Where each probe is in the registers, as notes.
  std::vector<ProbeNote> Placements() const;

  std::unique_ptr<core::ptrace::Process> proc_;
  std::unique_ptr<core::symbols::Symbols> symbols_;
  std::unique_ptr<core::symbols::Symbolizer> symbolizer_;
  std::unique_ptr<HitStacks> stacks_;  // --stack
  std::unique_ptr<HwProbes> hw_;
  core::symbols::MemoryReader read_;
  uint64_t bias_ = 0;
  // Hits after --count or a stop, while the registers were still armed, per probe id.
  std::map<uint32_t, uint64_t> misses_of_;
  std::map<uint32_t, int> placed_;  // probe id -> debug register, as armed
  bool armed_ = false;              // the target ran with the probes in place
  bool published_ = false;
};

void HwSession::OnHit(const HwProbes::Hit& h) {
  DutiesDuringHit(h.time_ns);
  if (!TakesHits()) {
    ++misses_of_[h.probe->id];  // the registers come out once the loop runs again
    return;
  }
  ProbeHit hit = EvaluateHwHit(h, proc_->pid(), bias_, read_);
  if (stacks_ != nullptr && h.regs != nullptr) {
    hit.stack = stacks_->Unwind(h.tid, *h.regs, opts().stack_frames);
  }
  Deliver(hit);
}

absl::Status HwSession::Start() {
  core::ptrace::LaunchOptions lo;
  lo.run_as = opts().user;
  lo.kill_on_exit = opts().kill_on_exit;
  KW_ASSIGN_OR_RETURN(proc_, core::ptrace::Process::Start(opts().pid, opts().command, lo));
  KW_ASSIGN_OR_RETURN(const std::vector<core::ptrace::MapEntry> maps, proc_->Maps());
  absl::StatusOr<uint64_t> bias = set().target->LoadBias(maps);
  if (!bias.ok()) {
    return absl::NotFoundError(
        absl::StrCat(set().path, " is not mapped in process ", proc_->pid(),
                     " (a library loaded later with dlopen cannot be probed yet with --hw): ",
                     bias.status().message()));
  }
  bias_ = *bias;
  // An execute breakpoint outside executable code would never fire: refuse it, as the INT3
  // engine does.
  for (const ProbeDef& p : set().probes) {
    const uint64_t addr = p.point.vaddr.value + bias_;
    const std::optional<core::ptrace::MapEntry> m =
        core::ptrace::FindMapping(maps, core::RemoteAddr{addr});
    if (!m.has_value() || !m->exec) {
      return absl::InvalidArgumentError(
          absl::StrFormat("probe %s (%s): 0x%x is not in executable code of pid %d", HwProbeName(p),
                          p.Location(), addr, proc_->pid()));
    }
  }
  const core::ptrace::Process* proc = proc_.get();
  read_ = [proc](core::RemoteAddr a, std::span<uint8_t> out) { return proc->ReadMemory(a, out); };
  KW_ASSIGN_OR_RETURN(symbols_, core::symbols::Symbols::ForProcess(proc_->pid()));
  symbolizer_ = std::make_unique<core::symbols::Symbolizer>(*symbols_);
  if (opts().stack_frames > 0) {
    KW_ASSIGN_OR_RETURN(stacks_, HitStacks::ForProcess(proc_->pid(), read_));
  }
  KW_RETURN_IF_ERROR(hooks().open_recording(proc_->pid(), bias_));
  return Arm();
}

std::vector<ProbeNote> HwSession::Placements() const {
  std::vector<ProbeNote> notes;
  std::map<int, std::vector<uint32_t>> sharing;
  for (const auto& [id, reg] : placed_) {
    sharing[reg].push_back(id);
  }
  for (const ProbeDef& p : set().probes) {
    auto it = placed_.find(p.id);
    if (it == placed_.end()) {
      continue;
    }
    ProbeNote n;
    n.kind = ProbeNote::Kind::kHwPlacement;
    n.probe = &p;
    n.reg = it->second;
    n.address = p.point.vaddr.value + bias_;
    for (uint32_t id : sharing[it->second]) {
      if (id != p.id) {
        n.shared_with.push_back(id);
      }
    }
    notes.push_back(std::move(n));
  }
  return notes;
}

void HwSession::Publish() {
  if (hw_ == nullptr || hw_->allocator() == nullptr) {
    return;
  }
  if (absl::Status s =
          drmgr::PublishSlots(proc_->pid(), hw_->allocator()->Snapshot(), opts().command_line);
      !s.ok()) {
    ProbeNote n;
    n.kind = ProbeNote::Kind::kNotPublished;
    n.why = std::string{s.message()};
    Note(n);
    return;
  }
  published_ = true;
}

absl::Status HwSession::Arm() {
  hw_ = std::make_unique<HwProbes>(*proc_, *symbolizer_, set().probes, bias_,
                                   [this](const HwProbes::Hit& h) { OnHit(h); });
  // No return probes under --hw: the names are for --stack frames.
  ProbeSessionStart start;
  NameWith(symbolizer_.get(), start);
  BeginOutput(std::move(start));
  const uint64_t arm_start = core::MonotonicNs();
  KW_RETURN_IF_ERROR(hw_->Arm());
  const uint64_t arm_ns = core::MonotonicNs() - arm_start;
  armed_ = true;
  for (const ProbeDef& p : set().probes) {
    placed_[p.id] = hw_->RegisterOf(p.id);
  }
  sink().OnStart();
  ProbeNote armed;
  armed.kind = ProbeNote::Kind::kArmed;
  armed.backend = backend();
  armed.count = UserProbes(set());
  armed.pid = proc_->pid();
  armed.path = set().path;
  armed.ms = static_cast<double>(arm_ns) / 1e6;
  Note(armed);
  for (const ProbeNote& n : Placements()) {
    Note(n);
  }
  if (const int ext = hw_->external_slots(); ext > 0) {
    ProbeNote n;
    n.kind = ProbeNote::Kind::kExternalRegisters;
    n.count = static_cast<uint64_t>(ext);
    n.pid = proc_->pid();
    Note(n);
  }
  Publish();
  return absl::OkStatus();
}

absl::Status HwSession::PollTarget() {
  KW_ASSIGN_OR_RETURN(const std::vector<core::ptrace::ProcessEvent> events, proc_->Poll());
  for (const core::ptrace::ProcessEvent& e : events) {
    switch (e.kind) {
      case core::ptrace::ProcessEvent::Kind::kExited:
        Stop(TargetEnded(proc_->exit_info()));
        break;
      case core::ptrace::ProcessEvent::Kind::kExec: {
        hw_->Forget();
        ProbeNote n;
        n.kind = ProbeNote::Kind::kExec;
        n.pid = proc_->pid();
        NoteAndKeep(n);
        KW_RETURN_IF_ERROR(proc_->Resume(e.tid));
        break;
      }
      case core::ptrace::ProcessEvent::Kind::kGroupStop: {
        ProbeNote n;
        n.kind = ProbeNote::Kind::kGroupStop;
        n.pid = proc_->pid();
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

absl::Status HwSession::Release() {
  if (hw_ != nullptr && proc_->alive()) {
    hw_->Disarm();  // every thread's breakpoints closed
  }
  if (proc_->alive()) {
    if (proc_->launched() && opts().kill_on_exit) {
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
  return absl::OkStatus();
}

HwSession::~HwSession() {
  if (published_) {
    drmgr::UnpublishSlots();
  }
}

void HwSession::Abandon() {
  if (proc_ != nullptr && proc_->alive()) {
    if (hw_ != nullptr) {
      hw_->Disarm();
    }
    // A launched target that never ran its own code is not left behind.
    if (proc_->launched() && (!armed_ || opts().kill_on_exit)) {
      (void)proc_->Kill();
    } else {
      (void)proc_->Detach();
    }
  }
}

absl::StatusOr<ProbeSessionEnd> HwSession::Finish() {
  if (!failed().ok()) {
    Abandon();
    return failed();
  }
  std::map<uint32_t, ProbeEndStats> stats;
  for (const auto& [id, n] : misses_of_) {
    stats[id].misses = n;
  }
  ProbeRunInfo info;
  info.backend = backend();
  info.pid = proc_->pid();
  info.seconds = Elapsed();
  const absl::Status released = Release();
  info.stop_reason = stop_reason();
  std::vector<ProbeNote> notes = Placements();
  if (const int ext = hw_->external_slots(); ext > 0) {
    ProbeNote n;
    n.kind = ProbeNote::Kind::kExternalRegisters;
    n.count = static_cast<uint64_t>(ext);
    n.pid = proc_->pid();
    notes.push_back(std::move(n));
  }
  if (const uint64_t stray = hw_->stray_traps(); stray > 0) {
    ProbeNote n;
    n.kind = ProbeNote::Kind::kStrayTraps;
    n.count = stray;
    notes.push_back(std::move(n));
  }
  if (proc_->forks() > 0) {
    ProbeNote n;
    n.kind = ProbeNote::Kind::kForksNotFollowed;
    n.backend = backend();
    n.count = static_cast<uint64_t>(proc_->forks());
    notes.push_back(std::move(n));
  }
  if (proc_->spurious_traps() > 0) {
    ProbeNote n;
    n.kind = ProbeNote::Kind::kSpuriousTraps;
    n.count = static_cast<uint64_t>(proc_->spurious_traps());
    notes.push_back(std::move(n));
  }
  const std::vector<ProbeNote>& kept = kept_notes();
  notes.insert(notes.end(), kept.begin(), kept.end());
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
                                                             const ProbeSet& set,
                                                             core::UniqueFd sigfd,
                                                             const ProbeSessionHooks& hooks) {
  // Refusals come before any target is started or touched.
  KW_RETURN_IF_ERROR(CheckHwProbes(set.probes));
  KW_ASSIGN_OR_RETURN(std::unique_ptr<EventLoop> loop, EventLoop::Create(std::move(sigfd)));
  auto session = std::make_unique<HwSession>(opts, set, std::move(loop), hooks);
  KW_RETURN_IF_ERROR(session->Begin());
  return session;
}

}  // namespace kwatch::watch::probe
