#include "cli/probe_join.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "cli/probe_join_wire.h"
#include "core/base/clock.h"
#include "core/base/status_macros.h"
#include "core/base/syscall_status.h"
#include "core/ptrace/maps.h"
#include "core/symbols/symbolizer.h"
#include "core/symbols/symbols.h"
#include "watch/event_loop.h"
#include "watch/probe/session_base.h"

namespace kwatch::cli {

namespace {

using watch::probe::ProbeNote;

// How long the joiner waits for the session to answer (placing probes stops its target's
// threads; a session busy with a hit answers at its next round).
constexpr int kAnswerMs = 10'000;

class JoinedSession : public watch::probe::ProbeSessionBase {
 public:
  JoinedSession(const ProbeCmdOptions& opts, const watch::probe::ProbeSet& set,
                std::unique_ptr<watch::EventLoop> loop,
                const watch::probe::ProbeSessionHooks& hooks, const KwatchTracer& tracer)
      : ProbeSessionBase("ptrace", opts.session, set, std::move(loop), hooks),
        cmd_(opts),
        tracer_(tracer) {}

  absl::StatusOr<watch::probe::ProbeSessionEnd> Finish() override;

 private:
  absl::Status Start() override;
  void Abandon() override { AskEnd("ended"); }
  absl::Status Collect(const watch::EventLoop::Ready& ready) override;
  absl::Status PollTarget() override { return absl::OkStatus(); }
  void OnStop() override { AskEnd(stop_reason()); }

  // What this kwatch asks the session for.
  absl::StatusOr<std::string> Request() const;
  // Reads what the socket holds (waiting up to `wait_ms` for the first bytes; 0: not at all)
  // and acts on every whole frame. False once the session closed the connection.
  absl::StatusOr<bool> Read(int wait_ms);
  absl::Status OnFrame(const JoinFrame& f);
  // Asks the session to take the probes out (once).
  void AskEnd(const std::string& why);
  // The session is gone, or said why the probes ended.
  std::string Joined() const {
    return absl::StrCat("the session this kwatch joined (kwatch pid ", tracer_.pid, ")");
  }

  const ProbeCmdOptions& cmd_;
  KwatchTracer tracer_;
  pid_t pid_ = 0;
  uint64_t bias_ = 0;
  core::UniqueFd fd_;
  std::string in_;
  std::string errors_;  // 'E' frames before the probes were placed
  std::optional<ProbeJoinArmed> armed_;
  std::optional<ProbeJoinEnd> end_;
  bool finished_ = false;  // 'X' came
  bool gone_ = false;      // the session closed the connection
  bool asked_end_ = false;
  std::unique_ptr<core::symbols::Symbols> symbols_;
  std::unique_ptr<core::symbols::Symbolizer> symbolizer_;
};

absl::StatusOr<std::string> JoinedSession::Request() const {
  std::string r = absl::StrCat("kwatch-join 1\nprobe-file ", set().path, "\n");
  if (absl::StrContains(set().path, '\n')) {
    return absl::InvalidArgumentError(absl::StrCat(set().path, ": not a path to pass on"));
  }
  for (const std::string& spec : cmd_.specs) {
    if (absl::StrContains(spec, '\n')) {
      return absl::InvalidArgumentError(absl::StrCat("'", spec, "': a spec has no newline"));
    }
    absl::StrAppend(&r, "spec ", spec, "\n");
  }
  // The names --agg reads: fetched by the session as this kwatch resolved them.
  for (const watch::probe::FetchFor& f : watch::probe::NamesToFetch(cmd_.aggs)) {
    absl::StrAppend(&r, "fetch ", f.event, "\t", f.name, "\n");
  }
  absl::StrAppend(&r, "maxactive ", opts().maxactive, "\nstack ", opts().stack_frames, "\ngo\n");
  return r;
}

absl::Status JoinedSession::Start() {
  pid_ = *opts().pid;
  KW_ASSIGN_OR_RETURN(const std::vector<core::ptrace::MapEntry> maps, core::ptrace::ReadMaps(pid_));
  absl::StatusOr<uint64_t> bias = set().target->LoadBias(maps);
  if (!bias.ok()) {
    return absl::NotFoundError(absl::StrCat(set().path, " is not mapped in process ", pid_, ": ",
                                            bias.status().message()));
  }
  bias_ = *bias;
  if (auto syms = core::symbols::Symbols::ForProcess(pid_); syms.ok()) {
    symbols_ = *std::move(syms);
    symbolizer_ = std::make_unique<core::symbols::Symbolizer>(*symbols_);
  }
  KW_ASSIGN_OR_RETURN(const std::string request, Request());
  KW_RETURN_IF_ERROR(hooks().open_recording(pid_, bias_));
  KW_ASSIGN_OR_RETURN(fd_, ConnectJoinSocket(tracer_, pid_));
  KW_RETURN_IF_ERROR(SendAll(fd_.get(), request));
  const uint64_t deadline = core::MonotonicNs() + uint64_t{kAnswerMs} * 1'000'000;
  while (!armed_.has_value()) {
    const uint64_t now = core::MonotonicNs();
    if (finished_ || gone_ || now >= deadline) {
      std::string why(absl::StripSuffix(absl::StripPrefix(errors_, "kwatch: error: "), "\n"));
      if (why.empty()) {
        why = absl::StrCat(Joined(), gone_ ? " went away" : " did not answer",
                           " before placing the probes");
      }
      return absl::FailedPreconditionError(why);
    }
    KW_ASSIGN_OR_RETURN(const bool open, Read(static_cast<int>((deadline - now) / 1'000'000) + 1));
    gone_ = !open;
  }
  // The session resolved the same specs in the same file: the same probes, at the same places.
  if (armed_->text() != ArmedOf(set(), bias_).text()) {
    AskEnd("its probes differ from this kwatch's");
    return absl::InternalError(
        absl::StrCat(Joined(), " placed the probes at other addresses than this kwatch resolved (",
                     set().path, " changed?); they were taken out"));
  }
  KW_RETURN_IF_ERROR(loop().Add(fd_.get()));
  watch::probe::ProbeSessionStart start;
  start.main_pid = pid_;
  NameWith(symbolizer_.get(), start);
  BeginOutput(std::move(start)).OnStart();
  ProbeNote armed;
  armed.kind = ProbeNote::Kind::kArmed;
  armed.backend = backend();
  armed.count = watch::probe::UserProbes(set());
  armed.pid = pid_;
  armed.path = set().path;
  armed.why = absl::StrCat(
      "joined the session of kwatch pid ", tracer_.pid,
      ", which traces it: its INT3 engine runs them (ptrace, a stop of the thread per hit); the "
      "agent's jump and int3 paths need kwatch to be the target's only tracer (it loads the agent "
      "with a remote dlopen and lets the target run untraced; a traced target's SIGTRAPs stop in "
      "its tracer first)");
  Note(armed);
  return absl::OkStatus();
}

absl::Status JoinedSession::OnFrame(const JoinFrame& f) {
  switch (f.channel) {
    case 'A': {
      KW_ASSIGN_OR_RETURN(armed_, ParseProbeJoinArmed(f.payload));
      return absl::OkStatus();
    }
    case 'H': {
      KW_ASSIGN_OR_RETURN(std::vector<watch::probe::ProbeHit> hits, DecodeHits(f.payload, set()));
      for (const watch::probe::ProbeHit& h : hits) {
        if (!has_sink() || !TakesHits()) {
          break;
        }
        Deliver(h);
      }
      return absl::OkStatus();
    }
    case 'E':
      if (!armed_.has_value()) {
        errors_ += f.payload;
      } else {
        std::fflush(stdout);
        std::fwrite(f.payload.data(), 1, f.payload.size(), stderr);
        std::fflush(stderr);
      }
      return absl::OkStatus();
    case 'S': {
      KW_ASSIGN_OR_RETURN(end_, ParseProbeJoinEnd(f.payload));
      asked_end_ = true;  // the probes are out already
      if (end_->exit.has_value()) {
        Stop(TargetEnded(end_->exit));
      } else if (!end_->stop_reason.empty()) {
        Stop(absl::StrCat(Joined(), " ended: ", end_->stop_reason));
      }
      return absl::OkStatus();
    }
    case 'X':
      finished_ = true;
      asked_end_ = true;  // nothing more to ask
      Stop(absl::StrCat(Joined(), " ended its probes"));
      return absl::OkStatus();
    default:
      return absl::InternalError(
          absl::StrCat("an unknown frame '", std::string(1, f.channel), "' from ", Joined()));
  }
}

absl::StatusOr<bool> JoinedSession::Read(int wait_ms) {
  if (wait_ms > 0) {
    pollfd p{fd_.get(), POLLIN, 0};
    if (::poll(&p, 1, wait_ms) < 0 && errno != EINTR) {
      const int err = errno;
      return core::SyscallError(err, "poll (kwatch control socket)");
    }
  }
  std::array<char, 65536> buf{};
  bool open = true;
  while (true) {
    const ssize_t n = ::recv(fd_.get(), buf.data(), buf.size(), MSG_DONTWAIT);
    if (n > 0) {
      in_.append(buf.data(), static_cast<size_t>(n));
      continue;
    }
    const int err = errno;
    if (n < 0 && err == EINTR) {
      continue;
    }
    open = n < 0 && (err == EAGAIN || err == EWOULDBLOCK);
    break;
  }
  while (std::optional<JoinFrame> f = TakeFrame(in_)) {
    KW_RETURN_IF_ERROR(OnFrame(*f));
  }
  return open;
}

void JoinedSession::AskEnd(const std::string& why) {
  if (asked_end_ || gone_ || !fd_.valid()) {
    return;
  }
  asked_end_ = true;
  (void)SendAll(fd_.get(), absl::StrCat("end ", absl::StrReplaceAll(why, {{"\n", " "}}), "\n"));
}

absl::Status JoinedSession::Collect(const watch::EventLoop::Ready& /*ready*/) {
  if (gone_ || finished_) {
    return absl::OkStatus();
  }
  KW_ASSIGN_OR_RETURN(const bool open, Read(0));
  if (!open) {
    gone_ = true;
    (void)loop().Remove(fd_.get());
    Stop(absl::StrCat(Joined(), " went away without ending its probes (killed?)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<watch::probe::ProbeSessionEnd> JoinedSession::Finish() {
  if (!failed().ok()) {
    AskEnd("ended");
    return failed();
  }
  AskEnd(stop_reason());
  // The session takes the probes out, then sends their counters and the end.
  const uint64_t deadline = core::MonotonicNs() + uint64_t{kAnswerMs} * 1'000'000;
  absl::Status error;
  while (!finished_ && !gone_) {
    const uint64_t now = core::MonotonicNs();
    if (now >= deadline) {
      error = absl::DeadlineExceededError(
          absl::StrCat(Joined(), " did not say that it took the probes out"));
      break;
    }
    absl::StatusOr<bool> open = Read(static_cast<int>((deadline - now) / 1'000'000) + 1);
    if (!open.ok()) {
      error = open.status();
      break;
    }
    gone_ = !*open;
  }
  watch::probe::ProbeSessionEnd end;
  if (end_.has_value()) {
    end.stats = end_->stats;
    end.info.exit = end_->exit;
  }
  end.info.backend = backend();
  end.info.pid = pid_;
  end.info.seconds = Elapsed();
  end.info.stop_reason = stop_reason();
  end.info.notes = kept_notes();
  end.launched = false;
  end.error = error;
  if (gone_ && !finished_ && error.ok()) {
    // After the summary, as an error (exit status 1), as a joined watch's kwatch says it.
    end.error = absl::UnavailableError(
        absl::StrCat(Joined(),
                     " went away without taking the probes out (killed?); its guardian puts the "
                     "original code back"));
  } else if (error.ok() && !end.info.exit.has_value()) {
    std::fprintf(stderr, "kwatch: probes removed by %s; target %d keeps running\n",
                 Joined().c_str(), pid_);
  }
  return end;
}

}  // namespace

const char* ProbeOptionThatCannotJoin(const ProbeCmdOptions& opts) {
  if (opts.hw) {
    return "--hw (the session's debug registers are its watches' and gdb's)";
  }
  if (opts.backend == "agent" || opts.backend == "uprobe") {
    return "--backend agent/uprobe (a joined probe runs in the session's INT3 engine: the ptrace "
           "path)";
  }
  if (opts.no_jump) {
    return "--no-jump (an agent option; a joined probe runs in the session's INT3 engine)";
  }
  if (opts.session.follow_forks) {
    return "-f/--follow-forks (the session joined decides which processes it follows)";
  }
  if (opts.filter.stop_on) {
    return "--stop-on (it would leave the session's target stopped)";
  }
  return nullptr;
}

absl::StatusOr<std::unique_ptr<watch::probe::ProbeSession>> StartJoinedProbeSession(
    const ProbeCmdOptions& opts, const watch::probe::ProbeSet& set, core::UniqueFd sigfd,
    const watch::probe::ProbeSessionHooks& hooks, const KwatchTracer& tracer) {
  KW_ASSIGN_OR_RETURN(std::unique_ptr<watch::EventLoop> loop,
                      watch::EventLoop::Create(std::move(sigfd)));
  auto session = std::make_unique<JoinedSession>(opts, set, std::move(loop), hooks, tracer);
  KW_RETURN_IF_ERROR(session->Begin());
  return session;
}

}  // namespace kwatch::cli
