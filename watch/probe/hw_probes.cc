#include "watch/probe/hw_probes.h"

#include <sys/ptrace.h>
#include <sys/user.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/base/status_macros.h"
#include "core/probe/fetch.h"
#include "core/ptrace/maps.h"
#include "core/ptrace/process.h"
#include "core/symbols/symbolizer.h"
#include "core/symbols/symbols.h"
#include "drmgr/applier.h"
#include "drmgr/slot_allocator.h"
#include "drmgr/slot_registry.h"
#include "watch/probe/engine_probes.h"
#include "watch/session.h"
#include "watch/stop_backend.h"

namespace kwatch::watch::probe {

namespace {

// What drmgr calls a probe's request (`kwatch slots` shows it as the holder).
std::string Label(const ProbeDef& p) {
  return absl::StrCat("probe ", HwProbeName(p), " (", p.Location(), ")");
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
      names.push_back(HwProbeName(probes[id - 1]));
    }
    got.push_back(absl::StrCat("DR", r, " ", absl::StrJoin(names, " + ")));
  }
  std::sort(ids.begin(), ids.end());
  std::string held_by;
  if (!regs.empty()) {
    held_by = absl::StrCat(RegisterList(regs), " held by probe", ids.size() == 1 ? " " : "s ",
                           HwIdList(ids));
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
      refused.push_back(absl::StrCat("probe ", HwProbeName(probes[i]), " (", probes[i].Location(),
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

std::string HwProbeName(const ProbeDef& p) {
  return absl::StrCat("#", p.id, " ", p.point.event);
}

std::string HwIdList(const std::vector<uint32_t>& ids) {
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

absl::Status CheckHwProbes(const std::vector<ProbeDef>& probes) {
  for (const ProbeDef& p : probes) {
    if (p.point.is_return) {
      return absl::InvalidArgumentError(absl::StrCat(
          "probe ", HwProbeName(p), " (", p.Location(),
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

HwProbes::HwProbes(core::ptrace::Process& proc, core::symbols::Symbolizer& symbolizer,
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
      return {s.code(), absl::StrCat("arming probe ", HwProbeName(p), " (", p.Location(),
                                     "): ", s.message())};
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
                       const core::symbols::MemoryReader& read) {
  ProbeHit hit;
  hit.time_ns = h.time_ns;
  hit.pid = pid;
  hit.tid = h.tid;
  hit.probe = h.probe;
  hit.ip = h.ip;
  core::probe::FetchContext fc;
  fc.regs = h.regs;
  fc.load_bias = load_bias;
  fc.read = read;
  fc.at_return = false;
  fc.tid = h.tid;
  hit.args = FetchProbeArgs(*h.probe, std::move(fc));
  return hit;
}

}  // namespace kwatch::watch::probe
