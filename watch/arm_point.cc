#include "watch/arm_point.h"

#include <poll.h>
#include <sys/signalfd.h>
#include <sys/user.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/base/clock.h"
#include "core/base/status_macros.h"
#include "core/base/syscall_status.h"
#include "core/base/target_files.h"
#include "core/probe/probe_spec.h"
#include "core/probe/probe_target.h"
#include "watch/event_loop.h"

namespace kwatch::watch {

namespace {

constexpr uint8_t kInt3 = 0xcc;

absl::Status OnOption(const absl::Status& s, const std::string& spec) {
  return {s.code(), absl::StrCat("--arm-at '", spec, "': ", s.message())};
}

}  // namespace

ArmPoint::ArmPoint(core::ptrace::Process& proc, std::string spec, std::vector<Site> sites)
    : proc_(proc), spec_(std::move(spec)), sites_(std::move(sites)) {
  std::vector<std::string> where;
  where.reserve(sites_.size());
  for (const Site& s : sites_) {
    where.push_back(s.where);
  }
  description_ = absl::StrJoin(where, ", ");
}

absl::StatusOr<std::unique_ptr<ArmPoint>> ArmPoint::Plant(core::ptrace::Process& proc,
                                                          const std::string& spec) {
  absl::StatusOr<core::probe::ProbePoint> point = core::probe::ParseProbePoint(spec);
  if (!point.ok()) {
    return OnOption(point.status(), spec);
  }
  if (point->is_return) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--arm-at '", spec,
        "': a return probe is not a point where code starts running; give FUNC, FUNC+OFF, "
        "FUNC:RELLINE or FILE:LINE (e.g. the line after the call)"));
  }
  KW_ASSIGN_OR_RETURN(const std::string exe, core::OpenableExecutable(proc.pid()));
  absl::StatusOr<std::unique_ptr<core::probe::ProbeTarget>> target =
      core::probe::ProbeTarget::Open(exe);
  if (!target.ok()) {
    return OnOption(target.status(), spec);
  }
  absl::StatusOr<std::vector<core::probe::ResolvedPoint>> resolved = (*target)->Resolve(*point);
  if (!resolved.ok()) {
    return OnOption(resolved.status(), spec);
  }
  KW_ASSIGN_OR_RETURN(const std::vector<core::ptrace::MapEntry> maps, proc.Maps());
  absl::StatusOr<uint64_t> bias = (*target)->LoadBias(maps);
  if (!bias.ok()) {
    return OnOption(bias.status(), spec);
  }
  std::vector<Site> sites;
  for (const core::probe::ResolvedPoint& r : *resolved) {
    Site s;
    s.addr = core::RemoteAddr{r.vaddr.value + *bias};
    s.where = r.Where();
    if (!r.file.empty()) {
      const size_t slash = r.file.rfind('/');
      absl::StrAppend(&s.where, " (",
                      slash == std::string::npos ? r.file : r.file.substr(slash + 1), ":", r.line,
                      ")");
    }
    sites.push_back(std::move(s));
  }
  std::unique_ptr<ArmPoint> ap(new ArmPoint(proc, spec, std::move(sites)));
  KW_ASSIGN_OR_RETURN(ap->guardian_,
                      core::ptrace::Guardian::Start(proc.pid(), ap->sites_.size() + 1));
  // Written with the world stopped: no thread runs a half-patched instruction.
  KW_RETURN_IF_ERROR(proc.StopAll());
  if (absl::Status s = ap->Patch(); !s.ok()) {
    (void)ap->Restore();
    return OnOption(s, spec);
  }
  proc.AddInterceptor(ap.get());
  return ap;
}

ArmPoint::~ArmPoint() {
  const bool patched =
      std::any_of(sites_.begin(), sites_.end(), [](const Site& s) { return s.patched; });
  if (patched && proc_.alive()) {
    if (proc_.StopAll().ok()) {
      (void)Restore();
      (void)proc_.ResumeAll();
    }
  }
  proc_.RemoveInterceptor(this);
}

absl::Status ArmPoint::Patch() {
  for (Site& s : sites_) {
    std::array<uint8_t, 1> b{};
    KW_RETURN_IF_ERROR(proc_.ReadMemory(s.addr, b));
    s.original = b[0];
    const std::array<uint8_t, 1> int3{kInt3};
    KW_ASSIGN_OR_RETURN(s.journal, guardian_->Record(s.addr, b, int3));
    if (absl::Status w = proc_.WriteMemory(s.addr, int3); !w.ok()) {
      guardian_->Forget(s.journal);
      return w;
    }
    s.patched = true;
  }
  return absl::OkStatus();
}

absl::Status ArmPoint::Restore() {
  absl::Status first;
  for (Site& s : sites_) {
    if (!s.patched) {
      continue;
    }
    const std::array<uint8_t, 1> b{s.original};
    if (absl::Status w = proc_.WriteMemory(s.addr, b); !w.ok()) {
      first.Update(w);
      continue;
    }
    guardian_->Forget(s.journal);
    s.patched = false;
  }
  return first;
}

const ArmPoint::Site* ArmPoint::SiteAt(core::RemoteAddr addr) const {
  for (const Site& s : sites_) {
    if (s.addr.value == addr.value) {
      return &s;
    }
  }
  return nullptr;
}

absl::Status ArmPoint::Rewind(pid_t tid) const {
  KW_ASSIGN_OR_RETURN(user_regs_struct regs, proc_.GetRegs(tid));
  if (SiteAt(core::RemoteAddr{regs.rip - 1}) == nullptr) {
    return absl::OkStatus();
  }
  regs.rip -= 1;
  return proc_.SetRegs(tid, regs);
}

bool ArmPoint::Claims(pid_t tid, const siginfo_t& si) {
  if (si.si_signo != SIGTRAP || si.si_code != SI_KERNEL) {
    return false;
  }
  const absl::StatusOr<user_regs_struct> regs = proc_.GetRegs(tid);
  return regs.ok() && SiteAt(core::RemoteAddr{regs->rip - 1}) != nullptr;
}

absl::Status ArmPoint::Handle(pid_t tid, const siginfo_t& /*si*/) {
  KW_ASSIGN_OR_RETURN(const user_regs_struct regs, proc_.GetRegs(tid));
  const Site* site = SiteAt(core::RemoteAddr{regs.rip - 1});
  if (site == nullptr) {
    return absl::OkStatus();
  }
  if (!hit_.has_value()) {
    ArmHit h;
    h.tid = tid;
    h.addr = site->addr;
    h.where = site->where;
    h.hit_ns = core::MonotonicNs();
    hit_ = std::move(h);
    KW_RETURN_IF_ERROR(Restore());
    proc_.HoldStopped();  // the world stays stopped until the caller has armed
  }
  return Rewind(tid);
}

void ArmPoint::Drop(pid_t tid, const siginfo_t& /*si*/) {
  (void)Rewind(tid);
}

absl::Status ArmPoint::OnFork(core::ptrace::Process& child) {
  for (const Site& s : sites_) {
    if (s.patched) {
      const std::array<uint8_t, 1> b{s.original};
      KW_RETURN_IF_ERROR(child.WriteMemory(s.addr, b));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ArmWait> ArmPoint::Wait(int sigfd) {
  ArmWait out;
  KW_RETURN_IF_ERROR(proc_.ResumeAll());
  // Unless it was hit: the point is taken out with the world stopped.
  auto give_up = [this, &out](std::string why) -> absl::Status {
    out.why_not = std::move(why);
    if (!proc_.alive()) {
      return absl::OkStatus();
    }
    KW_RETURN_IF_ERROR(proc_.StopAll());
    // A trap that arrives while the world stops stays claimed: Drop sends its thread back
    // to the restored instruction as kwatch lets the target go.
    return Restore();
  };
  while (!hit_.has_value()) {
    if (!proc_.alive()) {
      const core::ptrace::ExitInfo& e = *proc_.exit_info();
      out.why_not = e.signaled
                        ? absl::StrCat("the target was killed by SIG", sigabbrev_np(e.signal))
                        : absl::StrCat("the target exited with status ", e.code);
      return out;
    }
    std::array<pollfd, 1> fds{pollfd{sigfd, POLLIN, 0}};
    if (::poll(fds.data(), fds.size(), 200) < 0 && errno != EINTR) {
      const int err = errno;
      return core::SyscallError(err, "poll(signalfd)");
    }
    signalfd_siginfo info{};
    while (::read(sigfd, &info, sizeof(info)) == static_cast<ssize_t>(sizeof(info))) {
      const int sig = static_cast<int>(info.ssi_signo);
      if (IsStopSignal(sig)) {
        KW_RETURN_IF_ERROR(give_up(absl::StrCat("interrupted by SIG", sigabbrev_np(sig))));
        return out;
      }
    }
    KW_ASSIGN_OR_RETURN(const std::vector<core::ptrace::ProcessEvent> events, proc_.Poll());
    for (const core::ptrace::ProcessEvent& e : events) {
      if (e.kind == core::ptrace::ProcessEvent::Kind::kExec) {
        // The new image has none of the INT3s: nothing to restore.
        for (Site& s : sites_) {
          s.patched = false;
        }
        guardian_->ForgetAll();
        out.why_not = "the target called exec first (the point was in the old image)";
        KW_RETURN_IF_ERROR(proc_.StopAll());
        return out;
      }
    }
  }
  out.hit = hit_;
  return out;
}

}  // namespace kwatch::watch
