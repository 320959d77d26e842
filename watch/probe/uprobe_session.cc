#include "watch/probe/uprobe_session.h"

#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "core/base/clock.h"
#include "core/base/status_macros.h"
#include "core/base/syscall_status.h"
#include "core/base/unique_fd.h"
#include "core/probe/fetch.h"
#include "core/probe/fetch_format.h"
#include "core/ptrace/maps.h"
#include "core/ptrace/process.h"
#include "core/symbols/symbolizer.h"
#include "core/symbols/symbols.h"
#include "watch/probe/hit_stacks.h"
#include "watch/probe/session_base.h"
#include "watch/uprobe_event.h"

namespace kwatch::watch::probe {

namespace {

// How long a hit may take from its timestamp to its ring (a sample being written on another
// CPU while the rings are read).
constexpr uint64_t kOrderSlackNs = 2'000'000;

core::ptrace::ExitInfo ExitFromWaitStatus(int status) {
  core::ptrace::ExitInfo e;
  if (WIFSIGNALED(status)) {
    e.signaled = true;
    e.signal = WTERMSIG(status);
    e.core_dumped = WCOREDUMP(status);
  } else {
    e.code = WEXITSTATUS(status);
  }
  return e;
}

class UprobeSession : public ProbeSessionBase {
 public:
  UprobeSession(const ProbeSessionOptions& opts, const ProbeSet& set,
                std::unique_ptr<EventLoop> loop, const ProbeSessionHooks& hooks)
      : ProbeSessionBase("uprobe", opts, set, std::move(loop), hooks) {}

  absl::StatusOr<ProbeSessionEnd> Finish() override;

 private:
  // Launches or checks the target, opens the events (their fds join the loop), the recording
  // and the output. On error nothing is left (a launched target is killed).
  absl::Status Start() override;
  // Reads the rings.
  absl::Status Collect(const EventLoop::Ready& /*ready*/) override {
    DrainAll();
    return absl::OkStatus();
  }
  absl::Status PollTarget() override {
    CheckExit();
    return absl::OkStatus();
  }
  // Reads the rings; shows the hits in time order (all of them when `final`).
  void DrainAll(bool final = false);
  // Evaluates the arguments of a sampled hit (the stack slice is valid only now).
  ProbeHit MakeHit(const ProbeDef& def, const watch::UprobeHit& h);
  uint64_t BiasOf(pid_t pid, const ProbeDef& def, const watch::UprobeHit& h);
  void CheckExit();

  pid_t pid_ = -1;  // -1: every process
  bool launched_ = false;
  std::optional<core::ptrace::ExitInfo> exit_;
  bool target_gone_ = false;
  core::UniqueFd pidfd_;
  std::vector<std::unique_ptr<watch::UprobeEvent>> events_;  // parallel to set().probes
  std::unique_ptr<core::symbols::Symbols> symbols_;
  std::unique_ptr<core::symbols::Symbolizer> symbolizer_;
  std::unique_ptr<HitStacks> stacks_;          // --stack (one target process)
  absl::flat_hash_map<pid_t, uint64_t> bias_;  // load bias of the file per process
  uint64_t not_sampled_ = 0;
  uint64_t other_processes_ = 0;   // hits of other processes running the file (dropped)
  std::vector<uint64_t> sampled_;  // per event: samples read, of every process
  std::vector<ProbeHit> waiting_;  // read, newer than the last drain's horizon
};

uint64_t UprobeSession::BiasOf(pid_t pid, const ProbeDef& def, const watch::UprobeHit& h) {
  if (auto it = bias_.find(pid); it != bias_.end()) {
    return it->second;
  }
  uint64_t bias = 0;
  if (!def.point.is_return) {
    bias = h.ip.value - def.point.vaddr.value;  // an entry's ip is the probed instruction
  } else if (auto maps = core::ptrace::ReadMaps(pid); maps.ok()) {
    if (auto b = set().target->LoadBias(*maps); b.ok()) {
      bias = *b;
    }
  }
  bias_[pid] = bias;
  return bias;
}

ProbeHit UprobeSession::MakeHit(const ProbeDef& def, const watch::UprobeHit& h) {
  ProbeHit hit;
  hit.time_ns = h.time_ns;
  hit.pid = h.pid;
  hit.tid = h.tid;
  hit.cpu = h.cpu;
  hit.probe = &def;
  const uint64_t bias = BiasOf(h.pid, def, h);
  hit.ip = core::RemoteAddr{def.point.vaddr.value + bias};
  if (def.point.is_return) {
    hit.return_address = h.ip;  // the kernel samples the return address as the ip
  }
  // Memory is what the kernel copied from the stack pointer up; nothing else is known.
  core::probe::FetchContext fc;
  fc.regs = &h.regs;
  fc.load_bias = bias;
  fc.at_return = def.point.is_return;
  fc.tid = h.tid;
  for (const core::probe::CompiledArg& a : def.args) {
    bool outside = false;
    absl::StatusOr<std::string> v =
        core::probe::EvaluateSampled(a, fc, h.regs.rsp, h.stack, &outside);
    not_sampled_ += outside ? 1 : 0;
    hit.args.emplace_back(a.name, v.ok() ? *std::move(v) : core::probe::FetchErrorText(v.status()));
  }
  if (stacks_ != nullptr && h.pid == pid_) {
    hit.stack = stacks_->UnwindCopy(h.tid, h.regs, h.stack, opts().stack_frames);
  }
  return hit;
}

void UprobeSession::DrainAll(bool final) {
  // Rings are per CPU and per probe, read one after the other: a ring read later may hold
  // hits newer than some not yet written to a ring read earlier. Hits are shown in time
  // order up to a horizon a little before the drain began (every hit older than that is in
  // its ring by then); later ones wait for the next drain.
  const uint64_t horizon = core::MonotonicNs() - kOrderSlackNs;
  for (size_t i = 0; i < events_.size(); ++i) {
    const ProbeDef& def = set().probes[i];
    events_[i]->Drain([&](const watch::UprobeHit& h) {
      ++sampled_[i];
      if (pid_ > 0 && h.pid != pid_) {
        ++other_processes_;  // the same file run by another process
        return;
      }
      waiting_.push_back(MakeHit(def, h));
    });
  }
  std::stable_sort(waiting_.begin(), waiting_.end(),
                   [](const ProbeHit& a, const ProbeHit& b) { return a.time_ns < b.time_ns; });
  size_t shown = 0;
  for (; shown < waiting_.size(); ++shown) {
    if ((!final && waiting_[shown].time_ns > horizon) || !Deliver(waiting_[shown])) {
      break;
    }
  }
  waiting_.erase(waiting_.begin(), waiting_.begin() + static_cast<std::ptrdiff_t>(shown));
  if (sink().done()) {
    waiting_.clear();  // --count reached: the session stops
  }
}

void UprobeSession::CheckExit() {
  if (target_gone_ || pid_ <= 0) {
    return;
  }
  if (launched_) {
    int status = 0;
    const pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      exit_ = ExitFromWaitStatus(status);
      target_gone_ = true;
    }
  } else if (::kill(pid_, 0) != 0 && errno == ESRCH) {
    target_gone_ = true;
  }
  if (target_gone_) {
    Stop(TargetEnded(exit_));
  }
}

absl::Status UprobeSession::Start() {
  std::unique_ptr<core::ptrace::Process> proc;
  if (opts().pid.has_value()) {
    pid_ = *opts().pid;
    if (::kill(pid_, 0) != 0 && errno == ESRCH) {
      return absl::NotFoundError(absl::StrCat("no process ", pid_));
    }
  } else if (!opts().command.empty()) {
    // Launched stopped right after exec, so that the events exist before its first
    // instruction; then let go: the uprobe backend needs no tracer.
    core::ptrace::LaunchOptions lo;
    lo.run_as = opts().user;
    lo.kill_on_exit = false;
    KW_ASSIGN_OR_RETURN(proc, core::ptrace::Process::Launch(opts().command, lo));
    pid_ = proc->pid();
    launched_ = true;
  }
  // Until the target runs with its probes, an error kills a launched target.
  const auto fail = [&proc](absl::Status s) {
    if (proc != nullptr) {
      (void)proc->Kill();
    }
    return s;
  };
  for (const ProbeDef& def : set().probes) {
    watch::UprobeRequest req;
    req.path = set().path;
    req.file_offset = def.point.file_offset;
    req.is_return = def.point.is_return;
    // Always on every process, filtered here by pid: an inherited per-task uprobe event makes
    // the target's clone() fail with EFAULT (Linux 6.18: the child's copy of the event reads
    // attr.uprobe_path, a pointer into kwatch, from the cloning thread's memory), so a
    // per-task event could not follow the target's threads.
    req.pid = -1;
    req.inherit = false;
    req.stack_bytes = opts().stack_frames > 0 ? StackCopyBytes(opts()) : opts().stack_bytes;
    req.ring_pages = opts().ring_pages;
    absl::StatusOr<std::unique_ptr<watch::UprobeEvent>> ev = watch::UprobeEvent::Open(req);
    if (!ev.ok()) {
      std::string msg = absl::StrCat("probe ", def.point.event, " (", def.Location(),
                                     "): ", ev.status().message());
      if (absl::IsPermissionDenied(ev.status())) {
        // perf_uprobe_event_init() checks capable(CAP_SYS_ADMIN) (perfmon_capable() before a
        // 2025 fix, also in stable kernels), whatever perf_event_paranoid says.
        absl::StrAppend(&msg,
                        "; note: the kernel's uprobe PMU needs root (CAP_SYS_ADMIN; CAP_PERFMON "
                        "on older kernels) whatever perf_event_paranoid says: --backend ptrace "
                        "probes your own processes without privileges");
      }
      return fail(absl::Status(ev.status().code(), msg));
    }
    for (const int fd : (*ev)->fds()) {
      if (absl::Status s = loop().Add(fd); !s.ok()) {
        return fail(s);
      }
    }
    events_.push_back(*std::move(ev));
    sampled_.push_back(0);
  }
  uint64_t bias = 0;
  if (pid_ > 0) {
    // Return addresses are named from the process's modules as mapped now.
    if (auto syms = core::symbols::Symbols::ForProcess(pid_); syms.ok()) {
      symbols_ = *std::move(syms);
      symbolizer_ = std::make_unique<core::symbols::Symbolizer>(*symbols_);
    }
    if (auto maps = core::ptrace::ReadMaps(pid_); maps.ok()) {
      if (auto b = set().target->LoadBias(*maps); b.ok()) {
        bias = *b;
        bias_[pid_] = bias;
      }
    }
  }
  if (absl::Status s = hooks().open_recording(pid_ > 0 ? pid_ : 0, bias); !s.ok()) {
    return fail(s);
  }
  ProbeSessionStart start;
  if (symbolizer_ != nullptr) {
    NameWith(symbolizer_.get(), start);
  }
  if (opts().stack_frames > 0 && pid_ > 0) {
    KW_ASSIGN_OR_RETURN(stacks_, HitStacks::ForProcess(pid_, nullptr));
  }
  BeginOutput(std::move(start)).OnStart();
  ProbeNote armed;
  armed.kind = ProbeNote::Kind::kArmed;
  armed.backend = backend();
  armed.count = UserProbes(set());
  armed.pid = pid_ > 0 ? pid_ : 0;
  armed.path = set().path;
  Note(armed);
  if (proc != nullptr) {
    KW_RETURN_IF_ERROR(proc->Detach());  // runs from its first instruction, probed
  }
  if (pid_ > 0) {
    pidfd_.Reset(static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0)));
    if (pidfd_) {
      KW_RETURN_IF_ERROR(loop().Add(pidfd_.get()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ProbeSessionEnd> UprobeSession::Finish() {
  CheckExit();  // a stop signal ended the last Step before it looked
  // The kernel's counts first, then the last samples (what the target did up to its exit
  // is in the rings already): a sample counted but never read was dropped. The ring's own
  // lost records miss drops at the very end (their record is written only once space frees).
  std::vector<std::optional<uint64_t>> counts;
  for (const auto& ev : events_) {
    absl::StatusOr<uint64_t> c = ev->Count();
    counts.push_back(c.ok() ? std::optional<uint64_t>(*c) : std::nullopt);
  }
  DrainAll(/*final=*/true);
  std::map<uint32_t, ProbeEndStats> stats;
  for (size_t i = 0; i < events_.size(); ++i) {
    ProbeEndStats st;
    st.lost = events_[i]->lost();
    st.kernel_count = counts[i];
    if (counts[i].has_value() && *counts[i] > sampled_[i]) {
      st.lost = std::max(st.lost, *counts[i] - sampled_[i]);
    }
    stats[set().probes[i].id] = st;
  }
  events_.clear();  // closing the events removes the probes
  ProbeRunInfo info;
  info.backend = backend();
  info.pid = pid_ > 0 ? pid_ : 0;
  info.seconds = Elapsed();
  if (launched_ && !target_gone_) {
    if (opts().kill_on_exit) {
      ::kill(pid_, SIGKILL);
      int status = 0;
      if (::waitpid(pid_, &status, 0) == pid_) {
        exit_ = ExitFromWaitStatus(status);
      }
      AppendToStopReason("; target killed (--kill-on-exit)");
    } else {
      ProbeNote n;
      n.kind = ProbeNote::Kind::kReleased;
      n.backend = backend();
      n.pid = pid_;
      Note(n);
    }
  }
  info.stop_reason = stop_reason();
  info.exit = exit_;
  ProbeNote sampling;
  sampling.kind = ProbeNote::Kind::kUprobeSampling;
  sampling.count = opts().stack_bytes;
  Keep(std::move(sampling));
  if (not_sampled_ > 0) {
    ProbeNote n;
    n.kind = ProbeNote::Kind::kNotSampled;
    n.count = not_sampled_;
    Keep(std::move(n));
  }
  if (other_processes_ > 0) {
    ProbeNote n;
    n.kind = ProbeNote::Kind::kOtherProcesses;
    n.count = other_processes_;
    n.path = set().path;
    Keep(std::move(n));
  }
  for (const ProbeDef& p : set().probes) {
    if (const ProbeEndStats& st = stats[p.id]; st.lost > 0) {
      ProbeNote n;
      n.kind = ProbeNote::Kind::kSamplesDropped;
      n.count = st.lost;
      n.probe = &p;
      Keep(std::move(n));
    }
  }
  info.notes = kept_notes();
  ProbeSessionEnd end;
  end.stats = std::move(stats);
  end.info = std::move(info);
  end.launched = launched_;
  end.error = failed();
  return end;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ProbeSession>> StartUprobeSession(const ProbeSessionOptions& opts,
                                                                 const ProbeSet& set,
                                                                 core::UniqueFd sigfd,
                                                                 const ProbeSessionHooks& hooks) {
  KW_ASSIGN_OR_RETURN(std::unique_ptr<EventLoop> loop, EventLoop::Create(std::move(sigfd)));
  auto session = std::make_unique<UprobeSession>(opts, set, std::move(loop), hooks);
  KW_RETURN_IF_ERROR(session->Begin());
  return session;
}

}  // namespace kwatch::watch::probe
