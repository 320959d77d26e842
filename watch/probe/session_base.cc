#include "watch/probe/session_base.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/clock.h"

namespace kwatch::watch::probe {

ProbeSessionBase::ProbeSessionBase(std::string backend, ProbeSessionOptions opts,
                                   const ProbeSet& set, std::unique_ptr<EventLoop> loop,
                                   ProbeSessionHooks hooks)
    : backend_(std::move(backend)),
      opts_(std::move(opts)),
      set_(set),
      loop_(std::move(loop)),
      hooks_(std::move(hooks)) {}

absl::Status ProbeSessionBase::Begin() {
  absl::Status s = Start();
  if (!s.ok()) {
    Abandon();
  }
  return s;
}

HitSink& ProbeSessionBase::BeginOutput(ProbeSessionStart start) {
  if (start.start_ns == 0) {
    start.start_ns = core::MonotonicNs();
  }
  start_ns_ = start.start_ns;
  last_duties_ns_ = start_ns_;
  sink_ = &hooks_.begin(start);
  return *sink_;
}

double ProbeSessionBase::Elapsed() const {
  return static_cast<double>(core::MonotonicNs() - start_ns_) / 1e9;
}

void ProbeSessionBase::Stop(std::string reason) {
  if (!stop_reason_.empty()) {
    return;
  }
  stop_reason_ = std::move(reason);
  OnStop();
}

bool ProbeSessionBase::Deliver(const ProbeHit& hit) {
  const bool taken = sink_->Add(hit);
  if (sink_->done()) {
    const std::string reason = sink_->done_reason();
    Stop(reason.empty() ? absl::StrCat("--count ", opts_.count, " reached") : reason);
  }
  return taken;
}

bool ProbeSessionBase::DutiesDuringHit(uint64_t hit_ns) {
  if (hit_ns < last_duties_ns_ + kDutyIntervalNs || !stop_reason_.empty()) {
    return false;
  }
  Duties(loop_->TakeStopSignal());
  return !stop_reason_.empty();
}

void ProbeSessionBase::Note(const ProbeNote& note) {
  sink_->OnNote(note);
}

void ProbeSessionBase::NoteAndKeep(const ProbeNote& note) {
  notes_.push_back(note);
  sink_->OnNote(note);
}

std::string ProbeSessionBase::TargetEnded(const std::optional<core::ptrace::ExitInfo>& exit) {
  return exit.has_value() && exit->signaled
             ? absl::StrCat("target killed by ", sigabbrev_np(exit->signal))
             : std::string("target exited");
}

std::string ProbeSessionBase::NameCode(core::symbols::Symbolizer* symbolizer,
                                       core::RemoteAddr addr) {
  if (symbolizer == nullptr) {
    return absl::StrFormat("0x%x", addr.value);
  }
  const core::symbols::CodeLocation& loc = symbolizer->Locate(addr);
  return loc.function.empty() ? absl::StrFormat("0x%x", addr.value)
                              : core::symbols::Symbolizer::Format(loc);
}

uint32_t StackCopyBytes(const ProbeSessionOptions& opts) {
  return std::max<uint32_t>(opts.stack_bytes, 8192);
}

void ProbeSessionBase::NameWith(core::symbols::Symbolizer* symbolizer, ProbeSessionStart& start) {
  start.caller = [symbolizer](core::RemoteAddr ra) { return NameCode(symbolizer, ra); };
  if (symbolizer != nullptr) {
    start.locate = [symbolizer](core::RemoteAddr a) { return symbolizer->Locate(a); };
  }
}

absl::Status ProbeSessionBase::Fail(absl::Status s) {
  failed_ = s;
  return s;
}

void ProbeSessionBase::Duties(int stop_signal) {
  last_duties_ns_ = core::MonotonicNs();
  sink_->Flush();
  if (stop_signal != 0) {
    Stop(absl::StrCat("interrupted by ", sigabbrev_np(stop_signal)));
  }
  if (absl::Status s = sink_->status(); !s.ok()) {
    Stop(std::string{s.message()});
  }
  if (deadline_ns_ != 0 && last_duties_ns_ >= deadline_ns_) {
    Stop(absl::StrFormat("--duration %gs elapsed", opts_.duration));
  }
}

absl::StatusOr<bool> ProbeSessionBase::Step(absl::Duration timeout) {
  if (!failed_.ok()) {
    return false;
  }
  if (!looping_) {
    looping_ = true;
    deadline_ns_ = opts_.duration > 0 ? start_ns_ + static_cast<uint64_t>(opts_.duration * 1e9) : 0;
    // Hits may have come, and the target may have ended, while its probes were being armed.
    if (absl::Status s = Collect(EventLoop::Ready{}); !s.ok()) {
      return Fail(s);
    }
    if (absl::Status s = PollTarget(); !s.ok()) {
      return Fail(s);
    }
  }
  if (!stop_reason_.empty()) {
    return false;
  }
  std::fflush(stdout);  // live lines before waiting, also into a pipe (| grep, | tee)
  absl::StatusOr<EventLoop::Ready> ready = loop_->Wait(timeout);
  if (!ready.ok()) {
    return Fail(ready.status());
  }
  if (absl::Status s = Collect(*ready); !s.ok()) {
    return Fail(s);
  }
  if (const int sig = ready->stop_signal(); sig != 0) {
    Stop(absl::StrCat("interrupted by ", sigabbrev_np(sig)));
    return false;
  }
  // SIGCHLD may merge with another one: poll on every round.
  if (absl::Status s = PollTarget(); !s.ok()) {
    return Fail(s);
  }
  if (ready->tick() || core::MonotonicNs() >= last_duties_ns_ + kDutyIntervalNs) {
    Duties(0);
  }
  return stop_reason_.empty();
}

}  // namespace kwatch::watch::probe
