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
#include "core/base/status_macros.h"
#include "core/base/syscall_status.h"
#include "core/base/unique_fd.h"
#include "core/probe/fetch.h"
#include "core/probe/fetch_format.h"
#include "core/ptrace/maps.h"
#include "core/ptrace/process.h"
#include "core/symbols/symbolizer.h"
#include "core/symbols/symbols.h"
#include "watch/probe/probe_loop.h"
#include "watch/uprobe_event.h"

namespace kwatch::watch::probe {

namespace {

// How long a hit may take from its timestamp to its ring (a sample being written on another
// CPU while the rings are read).
constexpr uint64_t kOrderSlackNs = 2'000'000;

core::ExitInfo ExitFromWaitStatus(int status) {
  core::ExitInfo e;
  if (WIFSIGNALED(status)) {
    e.signaled = true;
    e.signal = WTERMSIG(status);
    e.core_dumped = WCOREDUMP(status);
  } else {
    e.code = WEXITSTATUS(status);
  }
  return e;
}

class UprobeSession : public ProbeSession {
 public:
  UprobeSession(const ProbeSessionOptions& opts, const ProbeSet& set, int sigfd,
                const ProbeSessionHooks& hooks)
      : opts_(opts), set_(set), sigfd_(sigfd), hooks_(hooks) {}
  absl::Status Start();
  absl::StatusOr<bool> Step(absl::Duration timeout) override;
  absl::StatusOr<ProbeSessionEnd> Finish() override;

 private:
  // The first Step's: epoll over the rings, the signalfd and the target's pidfd.
  absl::Status OpenLoop();
  // Reads the rings; shows the hits in time order (all of them when `final`).
  void DrainAll(bool final = false);
  // Evaluates the arguments of a sampled hit (the stack slice is valid only now).
  ProbeHit MakeHit(const ProbeDef& def, const watch::UprobeHit& h);
  uint64_t BiasOf(pid_t pid, const ProbeDef& def, const watch::UprobeHit& h);
  void Stop(std::string reason) {
    if (stop_reason_.empty()) {
      stop_reason_ = std::move(reason);
    }
  }
  void CheckExit();

  ProbeSessionOptions opts_;
  const ProbeSet& set_;
  int sigfd_;
  ProbeSessionHooks hooks_;
  std::unique_ptr<ProbeLoop> loop_;
  uint64_t deadline_ = 0;  // --duration, 0: none
  absl::Status failed_;    // a Step's failure
  pid_t pid_ = -1;         // -1: every process
  bool launched_ = false;
  std::optional<core::ExitInfo> exit_;
  bool target_gone_ = false;
  core::UniqueFd pidfd_;
  std::vector<std::unique_ptr<watch::UprobeEvent>> events_;  // parallel to set_.probes
  HitSink* sink_ = nullptr;                                  // from hooks_.begin
  std::unique_ptr<core::Symbols> symbols_;
  std::unique_ptr<core::Symbolizer> symbolizer_;
  absl::flat_hash_map<pid_t, uint64_t> bias_;  // load bias of the file per process
  uint64_t start_ns_ = 0;
  std::string stop_reason_;
  std::vector<std::string> notes_;
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
  } else if (auto maps = core::ReadMaps(pid); maps.ok()) {
    if (auto b = set_.target->LoadBias(*maps); b.ok()) {
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
  core::FetchContext fc;
  fc.regs = &h.regs;
  fc.load_bias = bias;
  fc.at_return = def.point.is_return;
  fc.tid = h.tid;
  for (const core::CompiledArg& a : def.args) {
    bool outside = false;
    absl::StatusOr<std::string> v = core::EvaluateSampled(a, fc, h.regs.rsp, h.stack, &outside);
    not_sampled_ += outside ? 1 : 0;
    hit.args.emplace_back(a.name, v.ok() ? *std::move(v) : core::FetchErrorText(v.status()));
  }
  return hit;
}

void UprobeSession::DrainAll(bool final) {
  // Rings are per CPU and per probe, read one after the other: a ring read later may hold
  // hits newer than some not yet written to a ring read earlier. Hits are shown in time
  // order up to a horizon a little before the drain began (every hit older than that is in
  // its ring by then); later ones wait for the next drain.
  const uint64_t horizon = NowNs() - kOrderSlackNs;
  for (size_t i = 0; i < events_.size(); ++i) {
    const ProbeDef& def = set_.probes[i];
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
    if ((!final && waiting_[shown].time_ns > horizon) || !sink_->Add(waiting_[shown])) {
      break;
    }
  }
  waiting_.erase(waiting_.begin(), waiting_.begin() + static_cast<std::ptrdiff_t>(shown));
  if (sink_->done()) {
    waiting_.clear();
    Stop(absl::StrCat("--count ", opts_.count, " reached"));
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
    Stop(exit_.has_value() && exit_->signaled
             ? absl::StrCat("target killed by ", sigabbrev_np(exit_->signal))
             : "target exited");
  }
}

absl::Status UprobeSession::Start() {
  std::unique_ptr<core::Process> proc;
  if (opts_.pid.has_value()) {
    pid_ = *opts_.pid;
    if (::kill(pid_, 0) != 0 && errno == ESRCH) {
      return absl::NotFoundError(absl::StrCat("no process ", pid_));
    }
  } else if (!opts_.command.empty()) {
    // Launched stopped right after exec, so that the events exist before its first
    // instruction; then let go: the uprobe backend needs no tracer.
    core::LaunchOptions lo;
    lo.run_as = opts_.user;
    lo.kill_on_exit = false;
    KW_ASSIGN_OR_RETURN(proc, core::Process::Launch(opts_.command, lo));
    pid_ = proc->pid();
    launched_ = true;
  }
  for (const ProbeDef& def : set_.probes) {
    watch::UprobeRequest req;
    req.path = set_.path;
    req.file_offset = def.point.file_offset;
    req.is_return = def.point.is_return;
    // Always on every process, filtered here by pid: an inherited per-task uprobe event makes
    // the target's clone() fail with EFAULT (Linux 6.18: the child's copy of the event reads
    // attr.uprobe_path, a pointer into kwatch, from the cloning thread's memory), so a
    // per-task event could not follow the target's threads.
    req.pid = -1;
    req.inherit = false;
    req.stack_bytes = opts_.stack_bytes;
    req.ring_pages = opts_.ring_pages;
    absl::StatusOr<std::unique_ptr<watch::UprobeEvent>> ev = watch::UprobeEvent::Open(req);
    if (!ev.ok()) {
      if (proc != nullptr) {
        (void)proc->Kill();
      }
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
      return absl::Status(ev.status().code(), msg);
    }
    events_.push_back(*std::move(ev));
    sampled_.push_back(0);
  }
  uint64_t bias = 0;
  if (pid_ > 0) {
    // Return addresses are named from the process's modules as mapped now.
    if (auto syms = core::Symbols::ForProcess(pid_); syms.ok()) {
      symbols_ = *std::move(syms);
      symbolizer_ = std::make_unique<core::Symbolizer>(*symbols_);
    }
    if (auto maps = core::ReadMaps(pid_); maps.ok()) {
      if (auto b = set_.target->LoadBias(*maps); b.ok()) {
        bias = *b;
        bias_[pid_] = bias;
      }
    }
  }
  if (absl::Status s = hooks_.open_recording(pid_ > 0 ? pid_ : 0, bias); !s.ok()) {
    if (proc != nullptr) {
      (void)proc->Kill();
    }
    return s;
  }
  start_ns_ = NowNs();
  ProbeSessionStart start;
  start.start_ns = start_ns_;
  if (symbolizer_ != nullptr) {
    start.caller = [this](core::RemoteAddr ra) {
      const core::CodeLocation& loc = symbolizer_->Locate(ra);
      return loc.function.empty() ? absl::StrFormat("0x%x", ra.value)
                                  : core::Symbolizer::Format(loc);
    };
  }
  sink_ = &hooks_.begin(start);
  sink_->OnStart();
  sink_->OnNote(absl::StrFormat("armed %zu probe%s on %s (%s), uprobe backend", set_.probes.size(),
                                set_.probes.size() == 1 ? "" : "s",
                                pid_ > 0 ? absl::StrCat("pid ", pid_) : "every process running it",
                                set_.path));
  if (proc != nullptr) {
    KW_RETURN_IF_ERROR(proc->Detach());  // runs from its first instruction, probed
  }
  if (pid_ > 0) {
    pidfd_.Reset(static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0)));
  }
  return absl::OkStatus();
}

absl::Status UprobeSession::OpenLoop() {
  KW_ASSIGN_OR_RETURN(loop_, ProbeLoop::Create(sigfd_));
  for (const auto& ev : events_) {
    for (int fd : ev->fds()) {
      KW_RETURN_IF_ERROR(loop_->Add(fd));
    }
  }
  if (pidfd_) {
    KW_RETURN_IF_ERROR(loop_->Add(pidfd_.get()));
  }
  deadline_ = opts_.duration > 0 ? start_ns_ + static_cast<uint64_t>(opts_.duration * 1e9) : 0;
  return absl::OkStatus();
}

absl::StatusOr<bool> UprobeSession::Step(absl::Duration timeout) {
  if (!failed_.ok() || !stop_reason_.empty()) {
    return false;
  }
  if (loop_ == nullptr) {
    if (absl::Status s = OpenLoop(); !s.ok()) {
      failed_ = s;
      return s;
    }
  }
  absl::StatusOr<ProbeLoop::Ready> ready =
      loop_->Wait(static_cast<int>(absl::ToInt64Milliseconds(timeout)));
  if (!ready.ok()) {
    failed_ = ready.status();
    return failed_;
  }
  const ProbeLoop::Ready& r = *ready;
  DrainAll();
  if (r.stop_signal != 0) {
    Stop(absl::StrCat("interrupted by ", sigabbrev_np(r.stop_signal)));
  }
  CheckExit();
  if (r.tick) {
    sink_->Flush();
  }
  if (absl::Status s = sink_->status(); !s.ok()) {
    Stop(std::string(s.message()));
  }
  if (deadline_ != 0 && NowNs() >= deadline_) {
    Stop(absl::StrFormat("--duration %gs elapsed", opts_.duration));
  }
  return stop_reason_.empty();
}

absl::StatusOr<ProbeSessionEnd> UprobeSession::Finish() {
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
    stats[set_.probes[i].id] = st;
  }
  events_.clear();  // closing the events removes the probes
  ProbeRunInfo info;
  info.backend = "uprobe";
  info.pid = pid_ > 0 ? pid_ : 0;
  info.seconds = static_cast<double>(NowNs() - start_ns_) / 1e9;
  if (launched_ && !target_gone_) {
    if (opts_.kill_on_exit) {
      ::kill(pid_, SIGKILL);
      int status = 0;
      if (::waitpid(pid_, &status, 0) == pid_) {
        exit_ = ExitFromWaitStatus(status);
      }
      stop_reason_ += "; target killed (--kill-on-exit)";
    } else {
      sink_->OnNote(absl::StrFormat("probes removed; target %d keeps running", pid_));
    }
  }
  info.stop_reason = stop_reason_;
  info.exit = exit_;
  notes_.push_back(absl::StrFormat(
      "uprobe backend: arguments come from the registers and the %d bytes of stack above %%sp "
      "that the kernel sampled at each hit; memory elsewhere (heap, globals, strings not on "
      "the stack) and %%xmm registers are not sampled",
      opts_.stack_bytes));
  if (not_sampled_ > 0) {
    notes_.push_back(absl::StrFormat(
        "%d argument value%s showed %s: the memory was outside the sampled stack (raise "
        "--stack-bytes, or use --backend ptrace, which reads the target's memory at the hit)",
        not_sampled_, not_sampled_ == 1 ? "" : "s", core::kNotSampled));
  }
  if (other_processes_ > 0) {
    notes_.push_back(absl::StrFormat("%d hits of other processes running %s were left out",
                                     other_processes_, set_.path));
  }
  for (const auto& [id, st] : stats) {
    if (st.lost > 0) {
      notes_.push_back(absl::StrFormat(
          "the kernel dropped %d samples of probe %d (ring full): counts are short", st.lost, id));
    }
  }
  info.notes = notes_;
  ProbeSessionEnd end;
  end.stats = std::move(stats);
  end.info = std::move(info);
  end.launched = launched_;
  end.error = failed_;
  return end;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ProbeSession>> StartUprobeSession(const ProbeSessionOptions& opts,
                                                                 const ProbeSet& set, int sigfd,
                                                                 const ProbeSessionHooks& hooks) {
  auto session = std::make_unique<UprobeSession>(opts, set, sigfd, hooks);
  KW_RETURN_IF_ERROR(session->Start());
  return session;
}

}  // namespace kwatch::watch::probe
