#include "cli/probe_run.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cli/probe_join.h"
#include "cli/probe_output.h"
#include "cli/watch_recording.h"
#include "core/base/status_macros.h"
#include "core/base/target_files.h"
#include "core/store/trace_records.h"
#include "core/store/trace_writer.h"
#include "version/version.h"
#include "watch/event_loop.h"
#include "watch/probe/agent_session.h"
#include "watch/probe/aggregate_output.h"
#include "watch/probe/hit_fanout.h"
#include "watch/probe/hit_recorder.h"
#include "watch/probe/hit_tally.h"
#include "watch/probe/hw_session.h"
#include "watch/probe/probe_session.h"
#include "watch/probe/ptrace_session.h"
#include "watch/probe/uprobe_session.h"

namespace kwatch::cli {

namespace {

using watch::probe::HitRecorder;
using watch::probe::HitTally;

// The recording for -o (nullptr without -o), holding the probes.
absl::StatusOr<std::unique_ptr<core::store::TraceWriter>> OpenRecording(const ProbeCmdOptions& opts,
                                                                        const std::string& backend,
                                                                        const ProbeSet& set,
                                                                        pid_t pid,
                                                                        uint64_t load_bias) {
  if (opts.output.empty()) {
    return std::unique_ptr<core::store::TraceWriter>();
  }
  core::store::SessionRecord rec = core::store::SessionRecordForThisHost();
  rec.command_line = opts.session.command_line;
  rec.pid = pid;
  if (const pid_t own = core::OwnPid(pid); own != pid) {
    rec.ns_pid = own;
  }
  rec.kwatch_version = version::Full();
  rec.mode = "probe";
  rec.backend = backend;
  KW_ASSIGN_OR_RETURN(std::unique_ptr<core::store::TraceWriter> w,
                      core::store::TraceWriter::Create(opts.output, rec));
  KW_RETURN_IF_ERROR(watch::probe::AddProbes(*w, set.probes, load_bias));
  return w;
}

// Finishes the recording (after the aggregations' results, with --agg) and says so on stderr.
// False when recording failed (the caller exits 1 after its summary).
bool FinishRecording(core::store::TraceWriter* writer, const HitRecorder* recorder,
                     const watch::probe::Aggregator* aggregator, const ProbeRunInfo& info) {
  if (writer == nullptr) {
    return true;
  }
  absl::Status error = recorder != nullptr ? recorder->error() : absl::OkStatus();
  if (error.ok() && aggregator != nullptr) {
    error = writer->AddAggregates(watch::probe::AggregateResults(*aggregator));
  }
  core::store::SessionEnd end;
  if (info.exit.has_value()) {
    end.exit_status = info.exit->ShellStatus();
  }
  end.exit_reason = info.stop_reason;
  return SayRecordingEnd(watch::FinishRecording(*writer, error, end), /*hits=*/true);
}

// The output of one session, made through Hooks() as the session starts: the recording (-o),
// then the tally, the recorder and the printer behind one fan-out. Outlives the session; not
// movable once Hooks() was called.
class SessionOutput {
 public:
  SessionOutput(const ProbeCmdOptions& opts, const ProbeSet& set, std::string backend,
                std::unique_ptr<watch::probe::HitFilter> filter,
                std::unique_ptr<watch::probe::Aggregator> aggregator)
      : opts_(opts),
        set_(set),
        backend_(std::move(backend)),
        filter_(std::move(filter)),
        aggregator_(std::move(aggregator)) {}

  // --interval: the aggregations so far, `elapsed` seconds into the session.
  void PrintAggregates(double elapsed);

  watch::probe::ProbeSessionHooks Hooks();
  // The aggregator the agent may accumulate in the target: none when kwatch decides which hits
  // are taken (--skip, -c, --count, --stop-on), since the target would count the others too.
  watch::probe::Aggregator* AggregatorForTarget() const {
    const bool kwatch_takes =
        opts_.session.count > 0 || opts_.filter.stop_on || opts_.filter.skip.every.has_value() ||
        !opts_.filter.skip.event.empty() || opts_.filter.count.every.has_value() ||
        !opts_.filter.count.event.empty();
    return kwatch_takes ? nullptr : aggregator_.get();
  }

  // After the session's Finish: writes what is pending, closes the recording, prints the
  // summary. False when -o was not honoured.
  bool End(const watch::probe::ProbeSessionEnd& end);

 private:
  const ProbeCmdOptions& opts_;
  const ProbeSet& set_;
  std::string backend_;  // "agent", "ptrace", "uprobe", "hw": in the recording
  std::unique_ptr<core::store::TraceWriter> writer_;
  std::unique_ptr<HitTally> tally_;
  std::unique_ptr<HitRecorder> recorder_;
  std::unique_ptr<ProbePrinter> printer_;
  std::unique_ptr<watch::probe::HitFanout> sink_;
  std::unique_ptr<watch::probe::HitFilter> filter_;       // in front of sink_
  std::unique_ptr<watch::probe::Aggregator> aggregator_;  // --agg (null without)
};

void SessionOutput::PrintAggregates(double elapsed) {
  if (aggregator_ == nullptr || sink_ == nullptr) {
    return;
  }
  filter_->Flush();
  std::fflush(stdout);
  aggregator_->Refresh();  // the target's rows so far
  if (opts_.json) {
    PrintAggregatesJson(stdout, *aggregator_, elapsed);
  } else {
    PrintAggregatesText(stdout, *aggregator_, elapsed);
  }
  std::fflush(stdout);
}

watch::probe::ProbeSessionHooks SessionOutput::Hooks() {
  watch::probe::ProbeSessionHooks hooks;
  hooks.open_recording = [this](pid_t pid, uint64_t load_bias) -> absl::Status {
    KW_ASSIGN_OR_RETURN(writer_, OpenRecording(opts_, backend_, set_, pid, load_bias));
    return absl::OkStatus();
  };
  hooks.begin = [this](const watch::probe::ProbeSessionStart& start) -> watch::probe::HitSink& {
    PrinterOptions po;
    po.quiet = opts_.session.quiet;
    po.start_ns = start.start_ns;
    po.main_pid = start.main_pid;
    po.caller = start.caller;
    po.locate = start.locate;
    po.show_stack = opts_.show_stack;
    if (aggregator_ != nullptr) {
      aggregator_->SetLocate(start.locate);
    }
    if (opts_.json) {
      printer_ = std::make_unique<ProbeJsonPrinter>(STDOUT_FILENO, std::move(po));
    } else {
      printer_ = std::make_unique<ProbeTextPrinter>(STDOUT_FILENO, std::move(po));
    }
    tally_ = std::make_unique<HitTally>(set_.probes, opts_.session.count);
    // The tally first (it holds --count); the recorder before the printer, so that a failed
    // recording, not the closed output it may cause, is the stop reason.
    std::vector<watch::probe::HitSink*> sinks = {tally_.get()};
    if (writer_ != nullptr) {
      recorder_ = std::make_unique<HitRecorder>(*writer_);
      recorder_->SetLocate(start.locate);
      sinks.push_back(recorder_.get());
    }
    sinks.push_back(printer_.get());
    sink_ = std::make_unique<watch::probe::HitFanout>(std::move(sinks));
    filter_->Attach(*sink_);
    if (aggregator_ != nullptr) {
      filter_->AlsoGiveTaken(*aggregator_);
    }
    return *filter_;
  };
  return hooks;
}

bool SessionOutput::End(const watch::probe::ProbeSessionEnd& end) {
  filter_->Flush();
  std::fflush(stdout);
  const bool recorded =
      FinishRecording(writer_.get(), recorder_.get(), aggregator_.get(), end.info);
  if (aggregator_ != nullptr && opts_.json) {
    PrintAggregatesJson(stdout, *aggregator_, -1);  // before the summary, the last line
  }
  printer_->PrintSummary(stdout, ProbeSummary{set_.probes, *tally_, end, filter_.get()});
  if (aggregator_ != nullptr && !opts_.json) {
    PrintAggregatesText(stdout, *aggregator_, -1);
  }
  std::fflush(stdout);
  return recorded;
}

// The aggregator of --agg (null without); RunProbeSession made one first for its errors.
std::unique_ptr<watch::probe::Aggregator> MakeAggregator(const ProbeCmdOptions& opts,
                                                         const ProbeSet& set) {
  if (opts.aggs.empty()) {
    return nullptr;
  }
  absl::StatusOr<std::unique_ptr<watch::probe::Aggregator>> a =
      watch::probe::Aggregator::Make(set.probes, opts.aggs);
  return a.ok() ? *std::move(a) : nullptr;
}

// Starts the session of `backend` ("agent", "uprobe", "hw" or "ptrace") with `sigfd`.
absl::StatusOr<std::unique_ptr<watch::probe::ProbeSession>> StartSession(
    const std::string& backend, const ProbeCmdOptions& opts, const ProbeSet& set,
    core::UniqueFd sigfd, SessionOutput& out) {
  if (opts.join.has_value()) {
    return StartJoinedProbeSession(opts, set, std::move(sigfd), out.Hooks(), *opts.join);
  }
  if (backend == "agent") {
    watch::probe::AgentSessionOptions ao;
    ao.allow_jump = !opts.no_jump;
    ao.aggregator = out.AggregatorForTarget();
    return watch::probe::StartAgentSession(opts.session, ao, set, std::move(sigfd), out.Hooks());
  }
  if (backend == "uprobe") {
    return watch::probe::StartUprobeSession(opts.session, set, std::move(sigfd), out.Hooks());
  }
  if (backend == "hw") {
    return watch::probe::StartHwSession(opts.session, set, std::move(sigfd), out.Hooks());
  }
  return watch::probe::StartPtraceSession(opts.session, set, std::move(sigfd), out.Hooks());
}

}  // namespace

absl::StatusOr<int> RunProbeSession(const ProbeCmdOptions& opts, const ProbeSet& set,
                                    core::UniqueFd sigfd) {
  std::string backend = opts.backend == "uprobe"   ? "uprobe"
                        : opts.hw                  ? "hw"
                        : opts.backend == "ptrace" ? "ptrace"
                                                   : "agent";
  if (opts.join.has_value()) {
    backend = "ptrace";  // the INT3 engine of the session joined (cli/probe_join.h)
  }
  if (backend == "agent" && opts.backend == "auto" && opts.filter.stop_on) {
    std::fprintf(stderr,
                 "kwatch: note: --stop-on uses the ptrace backend: the thread of the hit must be "
                 "stopped at the probe (a stop per hit until then)\n");
    backend = "ptrace";
  }
  if (backend == "agent" && opts.backend == "auto" && opts.session.follow_forks) {
    // The agent follows forks but not an exec: a child that execs would run its new image
    // unprobed, where ptrace probes it again by the same specs.
    std::fprintf(stderr,
                 "kwatch: note: -f uses the ptrace backend, which probes a child's new image "
                 "after an exec; `--backend agent -f` follows forks in the target itself (faster, "
                 "but an exec'd process is not probed again)\n");
    backend = "ptrace";
  }
  // The filter's and the aggregations' errors (a bad EVENT, a condition, a value a probe
  // lacks) come before any target is touched.
  if (!opts.aggs.empty()) {
    KW_RETURN_IF_ERROR(watch::probe::Aggregator::Make(set.probes, opts.aggs).status());
  }
  KW_ASSIGN_OR_RETURN(std::unique_ptr<watch::probe::HitFilter> filter,
                      watch::probe::HitFilter::Make(set.probes, opts.filter));
  auto out = std::make_unique<SessionOutput>(opts, set, backend, std::move(filter),
                                             MakeAggregator(opts, set));
  absl::StatusOr<std::unique_ptr<watch::probe::ProbeSession>> started =
      StartSession(backend, opts, set, std::move(sigfd), *out);
  if (!started.ok() && backend == "agent" && opts.backend == "auto" &&
      started.status().code() == absl::StatusCode::kUnavailable) {
    // Nothing of the target ran with the agent: the ptrace backend starts over.
    std::fprintf(stderr, "kwatch: note: %s; the ptrace backend runs the probes\n",
                 std::string{started.status().message()}.c_str());
    backend = "ptrace";
    KW_ASSIGN_OR_RETURN(filter, watch::probe::HitFilter::Make(set.probes, opts.filter));
    out = std::make_unique<SessionOutput>(opts, set, backend, std::move(filter),
                                          MakeAggregator(opts, set));
    KW_ASSIGN_OR_RETURN(core::UniqueFd fresh_sigfd, watch::BlockSessionSignals());
    started = StartSession(backend, opts, set, std::move(fresh_sigfd), *out);
  }
  KW_ASSIGN_OR_RETURN(std::unique_ptr<watch::probe::ProbeSession> session, std::move(started));
  const absl::Time began = absl::Now();
  absl::Time next_interval = began + absl::Seconds(opts.interval);
  for (;;) {
    const absl::Duration wait =
        opts.interval > 0
            ? std::clamp(next_interval - absl::Now(), absl::ZeroDuration(), absl::Seconds(1))
            : absl::Seconds(1);
    absl::StatusOr<bool> more = session->Step(wait);
    if (!more.ok() || !*more) {
      break;  // a failure comes back from Finish
    }
    if (opts.interval > 0 && absl::Now() >= next_interval) {
      out->PrintAggregates(absl::ToDoubleSeconds(absl::Now() - began));
      next_interval += absl::Seconds(opts.interval);
    }
  }
  KW_ASSIGN_OR_RETURN(watch::probe::ProbeSessionEnd end, session->Finish());
  const bool recorded = out->End(end);
  KW_RETURN_IF_ERROR(end.error);
  if (!recorded) {
    return 1;  // -o was not honoured (docs/recording.md)
  }
  if (end.launched && end.info.exit.has_value()) {
    return end.info.exit->ShellStatus();
  }
  return 0;
}

}  // namespace kwatch::cli
