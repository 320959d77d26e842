#include "cli/probe_run.h"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <map>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"
#include "core/base/syscall_status.h"
#include "core/store/trace_records.h"
#include "watch/probe/hw_session.h"
#include "watch/probe/ptrace_session.h"
#include "watch/probe/uprobe_session.h"

#ifndef KWATCH_VERSION
#define KWATCH_VERSION "dev"
#endif

namespace kwatch::cli {

namespace {

// PrintProbeSummary for --hw: the JSON object gives each probe's debug register too.
void PrintHwSummary(const ProbeCmdOptions& opts, const ProbeSet& set, const HitPrinter& sink,
                    const watch::probe::ProbeSessionEnd& end) {
  const std::map<uint32_t, ProbeEndStats>& stats = end.stats;
  const ProbeRunInfo& info = end.info;
  if (!opts.json) {
    PrintProbeSummary(stdout, false, set.probes, sink, stats, info);
    return;
  }
  // The common summary object, plus where each probe was in the registers.
  char* buf = nullptr;
  size_t len = 0;
  FILE* mem = open_memstream(&buf, &len);
  if (mem == nullptr) {
    PrintProbeSummary(stdout, true, set.probes, sink, stats, info);
    return;
  }
  PrintProbeSummary(mem, true, set.probes, sink, stats, info);
  std::fclose(mem);
  const std::string text(buf, len);
  std::free(buf);  // NOLINT(cppcoreguidelines-no-malloc): open_memstream's buffer
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.contains("probes")) {
    std::fputs(text.c_str(), stdout);
    return;
  }
  for (nlohmann::ordered_json& pj : j["probes"]) {
    const auto it = end.hw->registers.find(pj.value("id", 0U));
    if (it != end.hw->registers.end() && it->second >= 0) {
      pj["debug_register"] = it->second;
    } else {
      pj["debug_register"] = nullptr;
    }
  }
  j["external_slots"] = end.hw->external_slots;
  j["stray_traps"] = end.hw->stray_traps;
  std::fputs(j.dump().c_str(), stdout);
  std::fputc('\n', stdout);
}

}  // namespace

absl::StatusOr<std::unique_ptr<core::TraceWriter>> OpenRecording(const ProbeCmdOptions& opts,
                                                                 const ProbeSet& set, pid_t pid,
                                                                 uint64_t load_bias) {
  if (opts.output.empty()) {
    return std::unique_ptr<core::TraceWriter>();
  }
  core::SessionRecord rec = core::SessionRecordForThisHost();
  rec.command_line = opts.command_line;
  rec.pid = pid;
  rec.kwatch_version = KWATCH_VERSION;
  rec.mode = "probe";
  rec.backend = opts.backend;
  KW_ASSIGN_OR_RETURN(std::unique_ptr<core::TraceWriter> w,
                      core::TraceWriter::Create(opts.output, rec));
  KW_RETURN_IF_ERROR(AddProbes(*w, set.probes, load_bias));
  return w;
}

bool FinishRecording(core::TraceWriter* writer, const HitPrinter& sink, const ProbeRunInfo& info,
                     const std::string& path) {
  if (writer == nullptr) {
    return true;
  }
  if (!sink.record_error().ok()) {
    std::fprintf(stderr, "kwatch: error: recording to %s failed: %s\n", path.c_str(),
                 std::string(sink.record_error().message()).c_str());
    if (!writer->location_lost()) {  // never claim a file that no longer exists
      const std::string& where = writer->moved_to().empty() ? path : writer->moved_to();
      std::fprintf(stderr,
                   "kwatch: the recording %s holds the hits committed before the failure; "
                   "`kwatch report %s` reads it\n",
                   where.c_str(), where.c_str());
    }
    return false;
  }
  core::SessionEnd end;
  if (info.exit.has_value()) {
    end.exit_status = info.exit->ShellStatus();
  }
  end.exit_reason = info.stop_reason;
  if (absl::Status s = writer->Finish(end); !s.ok()) {
    std::fprintf(stderr, "kwatch: error: %s\n", std::string(s.message()).c_str());
    return false;
  }
  if (!writer->finish_warning().empty()) {
    std::fprintf(stderr, "kwatch: warning: %s\n", writer->finish_warning().c_str());
  }
  std::fprintf(stderr, "kwatch: recorded %llu probe hits to %s (kwatch report %s)\n",
               static_cast<unsigned long long>(writer->hits_committed()), path.c_str(),
               path.c_str());
  return true;
}

watch::probe::ProbeSessionOptions SessionOptions(const ProbeCmdOptions& opts) {
  watch::probe::ProbeSessionOptions so;
  so.pid = opts.pid;
  so.command = opts.command;
  so.user = opts.user;
  so.count = opts.count;
  so.duration = opts.duration;
  so.kill_on_exit = opts.kill_on_exit;
  so.follow_forks = opts.follow_forks;
  so.quiet = opts.quiet;
  so.maxactive = opts.maxactive;
  so.stack_bytes = opts.stack_bytes;
  so.ring_pages = opts.ring_pages;
  so.command_line = opts.command_line;
  return so;
}

watch::probe::ProbeSessionHooks SessionOutput::Hooks() {
  watch::probe::ProbeSessionHooks hooks;
  hooks.open_recording = [this](pid_t pid, uint64_t load_bias) -> absl::Status {
    ProbeCmdOptions rec = opts;
    rec.backend = backend;
    KW_ASSIGN_OR_RETURN(writer, OpenRecording(rec, set, pid, load_bias));
    return absl::OkStatus();
  };
  hooks.begin = [this](const watch::probe::ProbeSessionStart& start) -> watch::probe::HitSink& {
    SinkOptions so;
    so.json = opts.json;
    so.quiet = opts.quiet;
    so.count = opts.count;
    so.start_ns = start.start_ns;
    so.backend = backend;
    so.main_pid = start.main_pid;
    printer =
        std::make_unique<HitPrinter>(STDOUT_FILENO, so, set.probes, writer.get(), start.caller);
    return *printer;
  };
  return hooks;
}

absl::StatusOr<int> RunProbeSession(watch::probe::ProbeSession& session, SessionOutput& out) {
  for (;;) {
    absl::StatusOr<bool> more = session.Step(absl::Seconds(1));
    if (!more.ok() || !*more) {
      break;  // a failure comes back from Finish
    }
  }
  KW_ASSIGN_OR_RETURN(watch::probe::ProbeSessionEnd end, session.Finish());
  out.printer->Flush();
  std::fflush(stdout);
  const bool recorded = FinishRecording(out.writer.get(), *out.printer, end.info, out.opts.output);
  if (end.hw.has_value()) {
    PrintHwSummary(out.opts, out.set, *out.printer, end);
  } else {
    PrintProbeSummary(stdout, out.opts.json, out.set.probes, *out.printer, end.stats, end.info);
  }
  std::fflush(stdout);
  KW_RETURN_IF_ERROR(end.error);
  if (!recorded) {
    return 1;  // -o was not honoured (docs/recording.md)
  }
  if (end.launched && end.info.exit.has_value()) {
    return end.info.exit->ShellStatus();
  }
  return 0;
}

absl::StatusOr<int> RunPtraceProbes(const ProbeCmdOptions& opts, ProbeSet& set,
                                    core::UniqueFd sigfd) {
  SessionOutput out(opts, set, "ptrace");
  KW_ASSIGN_OR_RETURN(
      std::unique_ptr<watch::probe::ProbeSession> session,
      watch::probe::StartPtraceSession(SessionOptions(opts), set, std::move(sigfd), out.Hooks()));
  return RunProbeSession(*session, out);
}

absl::StatusOr<int> RunHwProbes(const ProbeCmdOptions& opts, ProbeSet& set, core::UniqueFd sigfd) {
  SessionOutput out(opts, set, "hw");
  KW_ASSIGN_OR_RETURN(
      std::unique_ptr<watch::probe::ProbeSession> session,
      watch::probe::StartHwSession(SessionOptions(opts), set, std::move(sigfd), out.Hooks()));
  return RunProbeSession(*session, out);
}

absl::StatusOr<int> RunUprobeProbes(const ProbeCmdOptions& opts, ProbeSet& set,
                                    core::UniqueFd sigfd) {
  SessionOutput out(opts, set, "uprobe");
  KW_ASSIGN_OR_RETURN(
      std::unique_ptr<watch::probe::ProbeSession> session,
      watch::probe::StartUprobeSession(SessionOptions(opts), set, std::move(sigfd), out.Hooks()));
  return RunProbeSession(*session, out);
}

}  // namespace kwatch::cli
