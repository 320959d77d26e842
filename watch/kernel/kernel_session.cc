#include "watch/kernel/kernel_session.h"

#include <algorithm>
#include <csignal>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/clock.h"
#include "core/base/status_macros.h"
#include "core/base/syscall_status.h"
#include "watch/perf_util.h"

namespace kwatch::watch::kernel {

namespace {

bool Contains(const std::vector<int>& v, int x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

void Erase(std::vector<int>& v, int x) {
  v.erase(std::remove(v.begin(), v.end(), x), v.end());
}

}  // namespace

KernelWatchSession::KernelWatchSession(const KernelSessionOptions& opts,
                                       std::vector<KernelWatch> watches,
                                       std::unique_ptr<KernelRegisters> registers,
                                       std::unique_ptr<DrainValues> values,
                                       core::ptrace::Process* target, KernelEventSink& sink)
    : opts_(opts),
      watches_(std::move(watches)),
      registers_(std::move(registers)),
      values_(std::move(values)),
      target_(target),
      sink_(sink) {}

absl::StatusOr<std::unique_ptr<KernelWatchSession>> KernelWatchSession::Create(
    const KernelSessionOptions& opts, std::vector<KernelWatch> watches,
    std::unique_ptr<KernelRegisters> registers, std::unique_ptr<DrainValues> values,
    core::ptrace::Process* target, KernelEventSink& sink) {
  std::unique_ptr<KernelWatchSession> s(new KernelWatchSession(
      opts, std::move(watches), std::move(registers), std::move(values), target, sink));
  KW_RETURN_IF_ERROR(s->Init());
  return s;
}

absl::Status KernelWatchSession::Watch(int fd) {
  return loop_->Add(fd);
}

absl::Status KernelWatchSession::Init() {
  KW_ASSIGN_OR_RETURN(core::UniqueFd sigfd, BlockSessionSignals());
  KW_ASSIGN_OR_RETURN(loop_, EventLoop::Create(std::move(sigfd)));
  for (const ArmedBreakpoint& k : registers_->Armed()) {
    for (const int fd : k.bp->fds()) {
      KW_RETURN_IF_ERROR(Watch(fd));
    }
  }
  registers_->Changed();
  StartAccessValues();
  if (target_ != nullptr && target_->alive()) {
    KW_RETURN_IF_ERROR(target_->ResumeAll());  // left stopped by SetUpKernelAccesses
  }
  if (FollowsHotplug()) {
    hotplug_ = CpuHotplugMonitor::Open();
    if (hotplug_->fd() >= 0) {
      KW_RETURN_IF_ERROR(Watch(hotplug_->fd()));
    }
  }
  start_ns_ = core::MonotonicNs();
  deadline_ns_ = opts_.duration > 0 ? start_ns_ + static_cast<uint64_t>(opts_.duration * 1e9) : 0;
  return absl::OkStatus();
}

void KernelWatchSession::Stop(absl::string_view reason) {
  if (stop_reason_.empty()) {
    stop_reason_.assign(reason.data(), reason.size());
  }
}

void KernelWatchSession::StartAccessValues() {
  if (!opts_.access_values) {
    return;
  }
  std::vector<core::kernel::BpfAccessValues::Range> ranges;
  for (size_t i = 0; i < watches_.size(); ++i) {
    const KernelWatch& w = watches_[i];
    size_t first = i;
    for (size_t j = 0; j < i; ++j) {
      if (watches_[j].addr == w.addr && watches_[j].len == w.len) {
        first = j;
        break;
      }
    }
    range_of_.push_back(first);
    ranges.push_back({.addr = w.addr, .len = std::min<uint32_t>(w.len, 8)});
  }
  auto opened = core::kernel::BpfAccessValues::Open(ranges);
  KernelNote note;
  note.kind = KernelNote::Kind::kAccessValues;
  if (!opened.ok()) {
    note.why = opened.status();
    sink_.OnNote(note);
    return;
  }
  access_ = *std::move(opened);
  AttachAccessValues();
  if (access_ != nullptr) {
    sink_.OnNote(note);
  }
}

void KernelWatchSession::AttachAccessValues() {
  if (access_ == nullptr) {
    return;
  }
  for (const ArmedBreakpoint& k : registers_->Armed()) {
    if (k.watches.empty()) {
      continue;
    }
    for (const int fd : k.bp->fds()) {
      if (attached_.contains(fd)) {
        continue;
      }
      if (absl::Status st = access_->Attach(range_of_[k.watches.front()], fd); !st.ok()) {
        access_.reset();
        attached_.clear();
        KernelNote note;
        note.kind = KernelNote::Kind::kAccessValues;
        note.why = st;
        sink_.OnNote(note);
        return;
      }
      attached_.insert(fd);
    }
  }
}

void KernelWatchSession::Drain() {
  AttachAccessValues();  // breakpoints armed since (a CPU that came online)
  const bool show_values = values_shown();
  const bool drain_values = values_ != nullptr && values_->Enabled();
  if (drain_values) {
    values_->NewBatch();
  }
  std::vector<KernelEvent> evs;
  for (const ArmedBreakpoint& k : registers_->Armed()) {
    PerfRing* ring = k.bp->ring();
    if (ring == nullptr) {
      continue;
    }
    // A register shared between watches of equal ranges gives each of them the event.
    if (opts_.callchains) {
      ring->DrainRecords([&](std::span<const uint8_t> record) {
        KernelEvent ev;
        if (ParseCallchainSample(record, ev.s, ev.chain)) {
          for (const size_t i : k.watches) {
            ev.watch = i;
            evs.push_back(ev);
          }
        }
      });
    } else {
      ring->Drain([&](const PerfSample& s) {
        for (const size_t i : k.watches) {
          evs.push_back({s, i, {}, std::nullopt});
        }
      });
    }
  }
  std::sort(evs.begin(), evs.end(),
            [](const KernelEvent& a, const KernelEvent& b) { return a.s.time < b.s.time; });
  if (access_ != nullptr) {
    access_->Consume();  // after the samples: each one's record was written before it
  }
  for (KernelEvent& ev : evs) {
    if (opts_.count > 0 && delivered_ >= opts_.count) {
      break;
    }
    ++delivered_;
    KernelWatch& w = watches_[ev.watch];
    ++w.events;
    w.sites.Add(ev.s);
    if (access_ != nullptr) {
      ev.value = access_->Take(range_of_[ev.watch], ev.s.cpu, ev.s.time);
      ev.value_at_access = ev.value.has_value();
    }
    if (show_values && drain_values && !ev.value_at_access) {
      DrainValues::Value v = values_->Get(ev.watch, w);
      if (!v.first_failure.ok()) {
        KernelNote note;
        note.kind = KernelNote::Kind::kValueUnreadable;
        note.watch = ev.watch;
        note.why = std::move(v.first_failure);
        sink_.OnNote(note);
      }
      ev.value = v.value;
    }
    if (absl::Status st = sink_.OnEvent(ev, w); !st.ok()) {
      Stop(st.message());
    }
  }
  sink_.OnDrained();
  if (opts_.count > 0 && delivered_ >= opts_.count) {
    Stop(absl::StrCat("--count ", opts_.count, " reached"));
  }
}

void KernelWatchSession::RetireCpu(int cpu) {
  if (!FollowsHotplug()) {
    return;
  }
  Drain();  // what its rings hold
  const std::vector<ClosedBreakpoint> gone = registers_->ReleaseCpu(cpu);
  for (const ClosedBreakpoint& k : gone) {
    for (const size_t i : k.watches) {
      watches_[i].closed_count += k.count;
    }
    closed_lost_ += k.lost;
  }
  for (KernelWatch& w : watches_) {
    Erase(w.cpus, cpu);
  }
  if (!gone.empty()) {  // closing them leaves epoll
    KernelNote note;
    note.kind = KernelNote::Kind::kCpuOffline;
    note.cpu = cpu;
    sink_.OnNote(note);
    registers_->Changed();
  }
}

absl::Status KernelWatchSession::SyncCpus() {
  if (!FollowsHotplug() || watches_.empty()) {  // CPU scopes only
    return absl::OkStatus();
  }
  const std::vector<int> online = OnlineCpus();
  std::set<int> held;
  for (const KernelWatch& w : watches_) {
    held.insert(w.cpus.begin(), w.cpus.end());
  }
  for (const int cpu : held) {
    if (!Contains(online, cpu)) {
      RetireCpu(cpu);
    }
  }
  for (const int cpu : online) {
    if (refused_cpus_.contains(cpu)) {
      continue;
    }
    size_t armed_here = 0;
    const size_t before = registers_->Armed().size();
    for (size_t i = 0; i < watches_.size(); ++i) {
      KernelWatch& w = watches_[i];
      if (Contains(w.cpus, cpu)) {
        continue;
      }
      if (absl::Status st = registers_->Request(i, w.addr, w.len, cpu); !st.ok()) {
        // The CPU may be listed before perf has brought its context up: try again at the
        // next ticks, for about a second. (drmgr refusals do not change by waiting.)
        (void)registers_->ReleaseCpu(cpu);
        for (KernelWatch& v : watches_) {
          Erase(v.cpus, cpu);
        }
        if (++cpu_tries_[cpu] < 20 && !absl::IsResourceExhausted(st)) {
          armed_here = 0;
          break;
        }
        KernelNote note;
        note.kind = KernelNote::Kind::kCpuRefused;
        note.cpu = cpu;
        note.why = std::move(st);
        sink_.OnNote(note);
        refused_cpus_.insert(cpu);
        armed_here = 0;
        break;
      }
      w.cpus.push_back(cpu);
      ++armed_here;
    }
    const std::vector<ArmedBreakpoint> armed = registers_->Armed();
    for (size_t j = before; j < armed.size(); ++j) {
      for (const int fd : armed[j].bp->fds()) {
        KW_RETURN_IF_ERROR(Watch(fd));
      }
    }
    if (armed_here > 0) {
      cpu_tries_.erase(cpu);
      KernelNote note;
      note.kind = KernelNote::Kind::kCpuArmed;
      note.cpu = cpu;
      note.count = armed_here;
      sink_.OnNote(note);
      registers_->Changed();
    }
  }
  return absl::OkStatus();
}

absl::Status KernelWatchSession::PollTarget() {
  if (target_ == nullptr || !target_->alive()) {
    return absl::OkStatus();
  }
  KW_ASSIGN_OR_RETURN(const std::vector<core::ptrace::ProcessEvent> pevs, target_->Poll());
  for (const auto& e : pevs) {
    if (e.kind == core::ptrace::ProcessEvent::Kind::kExited) {
      return absl::CancelledError(
          target_->exit_info()->signaled
              ? absl::StrCat("target killed by ", sigabbrev_np(target_->exit_info()->signal))
              : std::string("target exited"));
    }
    if (e.kind == core::ptrace::ProcessEvent::Kind::kExec) {
      KW_RETURN_IF_ERROR(target_->Resume(e.tid));
      return absl::CancelledError(
          "target called exec (the watched addresses mean nothing in the new image)");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> KernelWatchSession::Step(absl::Duration timeout) {
  if (!stop_reason_.empty()) {
    return false;
  }
  KW_ASSIGN_OR_RETURN(const EventLoop::Ready ready, loop_->Wait(timeout));
  for (const EventLoop::Event& e : ready.events) {
    if (e.kind == EventLoop::Event::Kind::kSignal) {
      if (e.value != SIGCHLD) {
        stop_reason_ = absl::StrCat("interrupted by ", sigabbrev_np(e.value));
      }
    } else if (e.kind == EventLoop::Event::Kind::kFd && hotplug_.has_value() &&
               hotplug_->fd() >= 0 && e.value == hotplug_->fd()) {
      // CPUs that went offline are retired at once, in order.
      const CpuHotplugMonitor::Uevents u = hotplug_->Read();
      for (const int cpu : u.offline) {
        RetireCpu(cpu);
      }
      if (u.online) {
        KW_RETURN_IF_ERROR(SyncCpus());
      }
    }
  }
  Drain();
  // Also at every tick: hotplug that sends no uevent.
  KW_RETURN_IF_ERROR(SyncCpus());
  if (absl::Status st = sink_.OnStepEnd(); !st.ok()) {
    Stop(st.message());
  }
  if (absl::Status st = PollTarget(); !st.ok()) {
    if (!absl::IsCancelled(st)) {
      return st;
    }
    Stop(st.message());
  }
  if (deadline_ns_ != 0 && core::MonotonicNs() >= deadline_ns_) {
    Stop(absl::StrFormat("--duration %gs elapsed", opts_.duration));
  }
  return stop_reason_.empty();
}

absl::StatusOr<KernelSessionEnd> KernelWatchSession::Finish() {
  Drain();
  KernelSummary summary;
  summary.lost = closed_lost_;
  const std::vector<ArmedBreakpoint> armed = registers_->Armed();
  for (const ArmedBreakpoint& k : armed) {
    (void)k.bp->Disable();
    summary.lost += k.bp->ring() != nullptr ? k.bp->ring()->lost() : 0;
  }
  summary.events = delivered_;
  summary.stop_reason = stop_reason_;
  for (size_t i = 0; i < watches_.size(); ++i) {
    uint64_t counted = watches_[i].closed_count;
    for (const ArmedBreakpoint& k : armed) {
      if (std::find(k.watches.begin(), k.watches.end(), i) != k.watches.end()) {
        auto c = k.bp->Count();
        counted += c.ok() ? *c : 0;
      }
    }
    summary.counted.push_back(counted);
  }
  sink_.OnSummary(summary, watches_);
  // CPU hotplug: a CPU that came online after arming had no breakpoint.
  if (FollowsHotplug() && !watches_.empty()) {
    const std::vector<int>& cpus = watches_.front().cpus;
    for (const int cpu : OnlineCpus()) {
      if (!Contains(cpus, cpu)) {
        KernelNote note;
        note.kind = KernelNote::Kind::kCpuUnwatched;
        note.cpu = cpu;
        sink_.OnNote(note);
      }
    }
  }
  registers_->CloseAll();  // closes every event before the target is let go
  KernelSessionEnd end;
  end.stop_reason = stop_reason_;
  end.lost = summary.lost;
  if (target_ != nullptr) {
    if (target_->alive()) {
      if (target_->launched() && opts_.kill_on_exit) {
        KW_RETURN_IF_ERROR(target_->Kill());
      } else {
        KW_RETURN_IF_ERROR(target_->Detach());
        KernelNote note;
        note.kind = KernelNote::Kind::kDetached;
        note.pid = target_->pid();
        sink_.OnNote(note);
      }
    }
    if (target_->launched() && target_->exit_info().has_value()) {
      end.exit_status = target_->exit_info()->ShellStatus();
    }
  }
  return end;
}

}  // namespace kwatch::watch::kernel
