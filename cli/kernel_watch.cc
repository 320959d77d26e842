#include "cli/kernel_watch.h"

#include <pthread.h>

#include <algorithm>
#include <array>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "cli/output.h"
#include "cli/watch_recording.h"
#include "core/base/status_macros.h"
#include "core/kernel/accessors.h"
#include "core/kernel/bpf_kernel_reader.h"
#include "core/kernel/kernel_symbols.h"
#include "core/ptrace/process.h"
#include "core/store/trace_writer.h"
#include "core/symbols/symbols.h"
#include "drmgr/debug_regs.h"
#include "watch/kernel/kernel_event.h"
#include "watch/kernel/kernel_frames.h"
#include "watch/kernel/kernel_recording.h"
#include "watch/kernel/kernel_registers.h"
#include "watch/kernel/kernel_session.h"
#include "watch/kernel/kernel_setup.h"
#include "watch/kernel/kernel_slots.h"
#include "watch/kernel/task_names.h"

namespace kwatch::cli {

namespace {

using Options = WatchOptions;

using watch::kernel::KernelEvent;
using watch::kernel::KernelEventSink;
using watch::kernel::KernelFrame;
using watch::kernel::KernelNote;
using watch::kernel::KernelSetup;
using watch::kernel::KernelSummary;
using watch::kernel::KernelWatch;
using watch::kernel::KernelWatchSession;
using watch::kernel::SitesByEvents;
using watch::kernel::SiteTally;
using watch::kernel::TaskNames;

void Error(const absl::Status& s) {
  absl::FPrintF(stderr, "kwatch: error: %s\n", s.message());
}

// ---------------------------------------------------------------------------------------------
// Kernel watches: no -p and no command. One CPU-wide breakpoint per online CPU (pid -1).

// The per-site table of watch `i` (text summary), "" when it saw no event:
//   kernel sites of watch #1 buf (the IP the CPU reported: after the access):
//     EVENTS  TASKS  CPUS      SITE
//        140      1  0,1       _copy_to_iter+0x80
std::string SitesText(const KernelWatch& w, size_t i, core::kernel::KernelSymbolResolver& symbols) {
  if (w.sites.by_ip.empty()) {
    return "";
  }
  std::string out = absl::StrFormat(
      "kernel sites of watch #%d %s (the IP the CPU reported: after the access):\n"
      "  %8s %6s  %-9s %s\n",
      i + 1, w.display, "EVENTS", "TASKS", "CPUS", "SITE");
  for (const auto& [ip, st] : SitesByEvents(w.sites)) {
    absl::StrAppendFormat(&out, "  %8d %6d  %-9s %s\n", st->events, st->tids.size(),
                          absl::StrJoin(st->cpus, ","), symbols.Describe(ip));
  }
  return out;
}

// The sites of a watch as a JSON array, most events first.
std::string SitesJson(const SiteTally& t, core::kernel::KernelSymbolResolver& symbols) {
  std::vector<std::string> items;
  for (const auto& [ip, st] : SitesByEvents(t)) {
    items.push_back(
        absl::StrFormat(R"({"ip":"0x%x","site":%s,"events":%d,"tasks":[%s],"cpus":[%s]})", ip,
                        JsonString(symbols.Describe(ip)), st->events, absl::StrJoin(st->tids, ","),
                        absl::StrJoin(st->cpus, ",")));
  }
  return absl::StrCat("[", absl::StrJoin(items, ","), "]");
}

// Says how many events of a watch came at the IP of their task's previous event on the same
// CPU (the signature of a rep string instruction trapping per iteration; see
// kRepeatedIpExplanation).
std::string RepeatedIpNote(const KernelWatch& w, size_t i,
                           core::kernel::KernelSymbolResolver& symbols) {
  return absl::StrFormat(
      "kwatch: note: watch #%d %s: %d of its %d events came at the same IP as the previous "
      "event of their task on their CPU (first at %s)\n",
      i + 1, w.display, w.sites.repeated, w.events, symbols.Describe(w.sites.first_repeated_ip));
}

// What repeated IPs mean, printed once after the notes above.
constexpr absl::string_view kRepeatedIpExplanation =
    "kwatch: note: a rep string instruction traps after each iteration that touches the "
    "watched bytes, reporting the instruction itself while iterations remain and the next one "
    "after the last: a `rep movsb` that copies N watched bytes (copy_to_user on CPUs with "
    "FSRM/ERMS) gives N events, which are iterations of one copy, not N calls; the kernel "
    "counts them the same way. A task running the same instruction again also repeats its IP "
    "(docs/kernel.md)\n";

// What repeated IPs mean when none is a rep string instruction.
constexpr absl::string_view kRepeatedIpRerun =
    "kwatch: note: the instruction at a repeated IP is no rep string instruction: the task ran "
    "it again (a loop, or each system call's entry), each run one access (docs/kernel.md)\n";

// The live output of a kernel session: events and the summary on stdout (text, or JSON lines
// with --json), notes on stderr in both forms. Start once the session is created.
class KernelPrinter : public KernelEventSink {
 public:
  KernelPrinter(const Options& opts, drmgr::DrKind kind, pid_t target,
                core::kernel::KernelSymbolResolver& symbols, TaskNames& comms,
                const core::symbols::Symbols* user_syms)
      : opts_(opts),
        kind_(kind),
        target_(target),
        symbols_(symbols),
        comms_(comms),
        user_syms_(user_syms) {}

  // The session's clock and watches; the column header.
  virtual void Start(const KernelWatchSession& session) {
    session_ = &session;
    show_values_ = session.values_shown();
  }

  void OnDrained() override { std::fflush(stdout); }

  void OnNote(const KernelNote& note) override {
    switch (note.kind) {
      case KernelNote::Kind::kValueUnreadable:
        std::fputs(absl::StrCat("kwatch: ",
                                watch::kernel::ValueUnreadableNote(
                                    note.watch, session_->watches()[note.watch], note.why),
                                "\n")
                       .c_str(),
                   stderr);
        break;
      case KernelNote::Kind::kAccessValues:
        if (note.why.ok()) {
          std::fprintf(stderr,
                       "kwatch: values at the access: a BPF program on each breakpoint reads the "
                       "watched bytes when it fires (V; ~V only where that read failed and the "
                       "drain-time read stood in)\n");
        } else {
          std::fprintf(stderr, "kwatch: note: no values at the access (%s)\n",
                       absl::StrCat(note.why.message()).c_str());
        }
        std::fflush(stderr);
        break;
      case KernelNote::Kind::kCpuOffline:
        std::fprintf(stderr,
                     "kwatch: CPU %d went offline: its breakpoints are closed (the kernel drops "
                     "CPU-bound events of an offline CPU); it is armed again if it comes back\n",
                     note.cpu);
        std::fflush(stderr);
        break;
      case KernelNote::Kind::kCpuArmed:
        std::fprintf(stderr,
                     "kwatch: CPU %d came online during the session: armed %zu kernel watch%s "
                     "there (accesses on it before this line were not seen)\n",
                     note.cpu, note.count, note.count == 1 ? "" : "es");
        std::fflush(stderr);
        break;
      case KernelNote::Kind::kCpuRefused:
        std::fprintf(stderr,
                     "kwatch: warning: CPU %d came online during the session, but the kernel "
                     "watches could not be armed there: %s\n",
                     note.cpu, absl::StrCat(note.why.message()).c_str());
        break;
      case KernelNote::Kind::kCpuUnwatched:
        std::fprintf(stderr,
                     "kwatch: note: CPU %d came online during the session and was not watched\n",
                     note.cpu);
        break;
      case KernelNote::Kind::kDetached:
        std::fprintf(stderr, "kwatch: detached; target %d keeps running\n", note.pid);
        break;
    }
  }

 protected:
  // Seconds from the session's start to an event's time.
  double Seconds(uint64_t time_ns) const {
    const uint64_t start = session_->start_ns();
    return time_ns >= start ? static_cast<double>(time_ns - start) / 1e9 : 0.0;
  }
  const char* Access() const {
    return kind_ == drmgr::DrKind::kExec ? "x" : kind_ == drmgr::DrKind::kWrite ? "w" : "rw";
  }
  std::vector<KernelFrame> Frames(const KernelEvent& ev) const {
    return opts_.stack ? watch::kernel::KernelFrames(symbols_, user_syms_, ev.chain)
                       : std::vector<KernelFrame>{};
  }
  // The CPUs a watch holds registers on, in order: "0,1,3".
  static std::string CpusText(const KernelWatch& w) {
    std::vector<int> sorted_cpus = w.cpus;  // CPUs that came online later are at the end
    std::sort(sorted_cpus.begin(), sorted_cpus.end());
    return absl::StrJoin(sorted_cpus, ",");
  }
  // The notes on repeated IPs (stderr), after the summary's watches; the rep string
  // explanation once, when a repeated IP is a rep string instruction (or its code cannot be
  // read), else what else repeats an IP.
  void RepeatedIpNotes(std::span<const KernelWatch> watches) const {
    bool rep = false;
    bool other = false;
    std::optional<absl::StatusOr<std::unique_ptr<core::kernel::BpfKernelReader>>> reader;
    for (size_t i = 0; i < watches.size(); ++i) {
      if (watches[i].sites.repeated > 0) {
        std::fprintf(stderr, "%s", RepeatedIpNote(watches[i], i, symbols_).c_str());
        if (!reader.has_value()) {
          reader = core::kernel::BpfKernelReader::Open();  // once, for every watch
        }
        const std::optional<bool> is_rep = RepStringAt(*reader, watches[i].sites.first_repeated_ip);
        rep = rep || is_rep.value_or(true);
        other = other || !is_rep.value_or(true);
      }
    }
    if (rep) {
      absl::FPrintF(stderr, "%s", kRepeatedIpExplanation);
    } else if (other) {
      absl::FPrintF(stderr, "%s", kRepeatedIpRerun);
    }
  }

  // Whether the kernel instruction at `ip` is a rep string instruction, from its code read
  // through BPF; nullopt when it cannot be read or decoded.
  static std::optional<bool> RepStringAt(
      const absl::StatusOr<std::unique_ptr<core::kernel::BpfKernelReader>>& reader, uint64_t ip) {
    std::array<uint8_t, 16> code{};
    if (!reader.ok() || !(*reader)->Read(ip, code).ok()) {
      return std::nullopt;
    }
    return core::kernel::IsRepString(code);
  }

  const Options& opts_;
  drmgr::DrKind kind_;
  pid_t target_;  // --kernel-accesses: the process; 0 for kernel watches
  core::kernel::KernelSymbolResolver& symbols_;
  TaskNames& comms_;
  const core::symbols::Symbols* user_syms_;
  const KernelWatchSession* session_ = nullptr;
  bool show_values_ = false;
};

class KernelTextPrinter final : public KernelPrinter {
 public:
  using KernelPrinter::KernelPrinter;

  void Start(const KernelWatchSession& session) override {
    KernelPrinter::Start(session);
    if (opts_.quiet) {
      return;
    }
    if (show_values_) {
      std::printf("%-14s %-4s %-7s %-16s %-3s %-24s %-22s %s\n", "TIME(s)", "CPU", "TID", "COMM",
                  "ACC", "WATCH", "VALUE (~ = at drain)", "IP (after the access)");
    } else {
      std::printf("%-14s %-4s %-7s %-16s %-3s %-24s %s\n", "TIME(s)", "CPU", "TID", "COMM", "ACC",
                  "WATCH", "IP (after the access)");
    }
  }

  absl::Status OnEvent(const KernelEvent& ev, const KernelWatch& w) override {
    if (opts_.quiet) {
      return absl::OkStatus();
    }
    const std::string ip = symbols_.Describe(ev.s.ip);
    const std::vector<KernelFrame> frames = Frames(ev);
    const double t = Seconds(ev.s.time);
    const std::string& comm = comms_.Get(static_cast<pid_t>(ev.s.tid), ev.s.cpu);
    if (show_values_) {
      const std::string v = ev.value.has_value() ? absl::StrCat(ev.value_at_access ? "" : "~",
                                                                ValueOf(*ev.value, w.len))
                                                 : std::string("?");
      std::printf("%-14.9f %-4u %-7u %-16s %-3s %-24s %-22s %s\n", t, ev.s.cpu, ev.s.tid,
                  comm.c_str(), Access(), w.display.c_str(), v.c_str(), ip.c_str());
    } else {
      std::printf("%-14.9f %-4u %-7u %-16s %-3s %-24s %s\n", t, ev.s.cpu, ev.s.tid, comm.c_str(),
                  Access(), w.display.c_str(), ip.c_str());
    }
    for (size_t f = 0; f < frames.size(); ++f) {
      std::printf("    #%-2zu %s%s\n", f, frames[f].user ? "[user] " : "", frames[f].site.c_str());
    }
    return absl::OkStatus();
  }

  void OnSummary(const KernelSummary& summary, std::span<const KernelWatch> watches) override {
    std::printf("kwatch: %llu event%s, %llu lost; %s\n",
                static_cast<unsigned long long>(summary.events), summary.events == 1 ? "" : "s",
                static_cast<unsigned long long>(summary.lost), summary.stop_reason.c_str());
    const std::string kind_name(drmgr::DrKindName(kind_));
    for (size_t i = 0; i < watches.size(); ++i) {
      const KernelWatch& w = watches[i];
      const std::string scope = target_ == 0 ? absl::StrCat("kernel, CPUs ", CpusText(w))
                                             : absl::StrCat("kernel accesses for pid ", target_);
      std::printf(
          "watch #%zu %s: %u byte%s at 0x%llx%s%s, %s, %s: %llu event%s "
          "(the kernel counted %llu)\n",
          i + 1, w.display.c_str(), w.len, w.len == 1 ? "" : "s",
          static_cast<unsigned long long>(w.addr), w.type_name.empty() ? "" : ", ",
          w.type_name.c_str(), kind_name.c_str(), scope.c_str(),
          static_cast<unsigned long long>(w.events), w.events == 1 ? "" : "s",
          static_cast<unsigned long long>(summary.counted[i]));
    }
    for (size_t i = 0; i < watches.size(); ++i) {
      std::printf("%s", SitesText(watches[i], i, symbols_).c_str());
    }
    RepeatedIpNotes(watches);
    std::fflush(stdout);
  }
};

class KernelJsonPrinter final : public KernelPrinter {
 public:
  using KernelPrinter::KernelPrinter;

  // One `watch` object per watch, as process sessions print them (docs/output.md).
  void Start(const KernelWatchSession& session) override {
    KernelPrinter::Start(session);
    if (opts_.quiet) {
      return;
    }
    const std::string kind_name(drmgr::DrKindName(kind_));
    const std::vector<KernelWatch>& watches = session.watches();
    for (size_t i = 0; i < watches.size(); ++i) {
      const KernelWatch& w = watches[i];
      std::printf(
          "{\"type\":\"watch\",\"id\":%zu,\"expr\":%s,\"display\":%s,\"addr\":\"0x%llx\","
          "\"len\":%u,\"kind\":\"%s\",\"type_name\":%s,\"backend\":\"perf\"}\n",
          i, JsonString(w.expr).c_str(), JsonString(w.display).c_str(),
          static_cast<unsigned long long>(w.addr), w.len, kind_name.c_str(),
          JsonString(w.type_name).c_str());
    }
  }

  absl::Status OnEvent(const KernelEvent& ev, const KernelWatch& w) override {
    if (opts_.quiet) {
      return absl::OkStatus();
    }
    const std::string ip = symbols_.Describe(ev.s.ip);
    const std::vector<KernelFrame> frames = Frames(ev);
    const double t = Seconds(ev.s.time);
    const std::string& comm = comms_.Get(static_cast<pid_t>(ev.s.tid), ev.s.cpu);
    const std::string value =
        ev.value.has_value()
            ? absl::StrCat(ValueOf(*ev.value, w.len), ev.value_at_access ? R"(,"value_at":"access")"
                                                                         : R"(,"value_at":"drain")")
            : R"(null,"value_at":null)";
    const std::string stack =
        frames.empty()
            ? ""
            : absl::StrCat(",\"stack\":[",
                           absl::StrJoin(frames, ",",
                                         [](std::string* o, const KernelFrame& f) {
                                           absl::StrAppendFormat(
                                               o, R"({"ip":"0x%x","space":"%s","site":%s})", f.ip,
                                               f.user ? "user" : "kernel", JsonString(f.site));
                                         }),
                           "]");
    // The fields of process events (docs/output.md), then the kernel's own: comm, watch,
    // time (seconds from the start), site (function+offset as the text shows it), stack.
    const core::kernel::KernelSymbolResolver::CodeSite code = symbols_.Locate(ev.s.ip);
    std::printf(
        "{\"type\":\"event\",\"time_ns\":%llu,\"pid\":%u,\"tid\":%u,\"cpu\":%u,"
        "\"access\":\"%s\",\"addr\":\"0x%llx\",\"len\":%u,\"expr\":%s,\"field\":%s,"
        "\"ip\":\"0x%llx\",\"function\":%s,\"offset\":%llu,\"file\":%s,\"line\":%d,"
        "\"value\":%s,\"comm\":%s,\"watch\":%zu,\"time\":%.9f,\"site\":%s%s}\n",
        static_cast<unsigned long long>(ev.s.time), ev.s.pid, ev.s.tid, ev.s.cpu, Access(),
        static_cast<unsigned long long>(ev.s.addr), w.len, JsonString(w.expr).c_str(),
        JsonString(w.display).c_str(), static_cast<unsigned long long>(ev.s.ip),
        JsonString(code.function).c_str(), static_cast<unsigned long long>(code.offset),
        JsonString(code.file).c_str(), code.line, value.c_str(), JsonString(comm).c_str(), ev.watch,
        t, JsonString(ip).c_str(), stack.c_str());
    return absl::OkStatus();
  }

  void OnSummary(const KernelSummary& summary, std::span<const KernelWatch> watches) override {
    std::printf(
        "{\"type\":\"summary\",\"events\":%llu,\"lost\":%llu,\"stop_reason\":%s,"
        "\"watches\":[",
        static_cast<unsigned long long>(summary.events),
        static_cast<unsigned long long>(summary.lost), JsonString(summary.stop_reason).c_str());
    const std::string kind_name(drmgr::DrKindName(kind_));
    for (size_t i = 0; i < watches.size(); ++i) {
      const KernelWatch& w = watches[i];
      std::printf(
          "%s{\"id\":%zu,\"expr\":%s,\"addr\":\"0x%llx\",\"len\":%u,\"kind\":\"%s\","
          "\"type\":%s,\"source\":%s,\"slide\":%lld,\"cpus\":[%s],\"events\":%llu,"
          "\"kernel_count\":%llu,\"sites\":%s,\"repeated_ip_events\":%llu}",
          i == 0 ? "" : ",", i, JsonString(w.display).c_str(),
          static_cast<unsigned long long>(w.addr), w.len, kind_name.c_str(),
          JsonString(w.type_name).c_str(), JsonString(w.source).c_str(),
          static_cast<long long>(w.slide), CpusText(w).c_str(),
          static_cast<unsigned long long>(w.events),
          static_cast<unsigned long long>(summary.counted[i]), SitesJson(w.sites, symbols_).c_str(),
          static_cast<unsigned long long>(w.sites.repeated));
    }
    RepeatedIpNotes(watches);
    std::printf("]}\n");
    std::fflush(stdout);
  }
};

void SayUnpublished(const absl::Status& st) {
  absl::FPrintF(stderr, "kwatch: note: kwatch slots will not show this session: %s\n",
                st.message());
}

// Runs a kernel session (kernel watches, or --kernel-accesses of `setup.proc`) to its end:
// prints each event with its CPU, task and kernel function+offset, then the summary. Returns
// kwatch's exit status.
absl::StatusOr<int> RunKernelSession(const Options& opts, KernelSetup& setup) {
  core::kernel::KernelSymbolResolver& symbols = *setup.symbols;
  const pid_t pid = setup.proc != nullptr ? setup.proc->pid() : 0;
  std::unique_ptr<core::store::TraceWriter> writer;
  if (!opts.output.empty()) {
    KW_ASSIGN_OR_RETURN(
        writer, watch::kernel::CreateKernelRecording(RecordingSpecFor(opts), pid, setup.watches));
  }
  TaskNames comms;
  std::unique_ptr<KernelPrinter> printer;
  if (opts.json) {
    printer = std::make_unique<KernelJsonPrinter>(opts, setup.kind, pid, symbols, comms,
                                                  setup.user_syms.get());
  } else {
    printer = std::make_unique<KernelTextPrinter>(opts, setup.kind, pid, symbols, comms,
                                                  setup.user_syms.get());
  }
  std::optional<watch::kernel::KernelRecordingSink> recorder;
  if (writer != nullptr) {
    recorder.emplace(*writer, symbols, comms, *printer);
  }
  KernelEventSink& sink = recorder.has_value() ? static_cast<KernelEventSink&>(*recorder)
                                               : static_cast<KernelEventSink&>(*printer);
  watch::kernel::KernelSessionOptions so;
  so.count = opts.count;
  so.duration = opts.duration;
  so.callchains = opts.stack;
  so.kill_on_exit = opts.kill_on_exit;
  so.access_values = !opts.values_at_drain && (!opts.quiet || !opts.output.empty());
  KW_ASSIGN_OR_RETURN(std::unique_ptr<KernelWatchSession> session,
                      KernelWatchSession::Create(
                          so, std::move(setup.watches),
                          std::make_unique<watch::kernel::PublishedRegisters>(
                              std::move(setup.slots), pid, opts.command_line, SayUnpublished),
                          std::move(setup.values), setup.proc.get(), sink));
  std::fprintf(stderr, "kwatch: %s\n", setup.armed.c_str());
  std::fflush(stderr);
  printer->Start(*session);
  while (true) {
    KW_ASSIGN_OR_RETURN(const bool more, session->Step());
    if (!more) {
      break;
    }
  }
  KW_ASSIGN_OR_RETURN(const watch::kernel::KernelSessionEnd end, session->Finish());
  if (recorder.has_value() && !SayRecordingEnd(recorder->Finish(end))) {
    return 1;  // -o was not honoured (docs/recording.md)
  }
  return end.exit_status.value_or(0);
}

// Blocks the signals that go to the session's signalfd: before a launch (no SIGCHLD is lost)
// and before the recording's checkpoint thread starts, so that it inherits the mask (else a
// Ctrl-C there would kill kwatch).
void BlockSessionSignals() {
  sigset_t mask;
  sigemptyset(&mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGCHLD}) {
    sigaddset(&mask, sig);
  }
  pthread_sigmask(SIG_BLOCK, &mask, nullptr);
}

watch::kernel::KernelSetupOptions SetupOptionsFor(const Options& opts) {
  watch::kernel::KernelSetupOptions so;
  so.exprs = opts.exprs;
  so.kind = opts.rw || opts.read ? drmgr::DrKind::kReadWrite
            : opts.exec          ? drmgr::DrKind::kExec
                                 : drmgr::DrKind::kWrite;
  so.len = opts.len;
  so.type = opts.kernel_type;
  so.via = opts.via;
  so.callchain_frames = opts.stack ? static_cast<uint16_t>(opts.stack_depth) : 0;
  so.system_map = opts.system_map;
  so.vmlinux = opts.vmlinux;
  so.kcore = opts.kcore;
  so.values_needed = !opts.quiet || !opts.output.empty();
  so.pid = opts.pid;
  so.command = opts.command;
  so.launch.kill_on_exit = opts.kill_on_exit;
  so.launch.run_as = opts.run_as;
  return so;
}

void Say(const std::string& line) {
  std::fprintf(stderr, "kwatch: %s\n", line.c_str());
}

absl::StatusOr<int> RunKernelWatch(const Options& opts) {
  KW_ASSIGN_OR_RETURN(KernelSetup setup,
                      watch::kernel::SetUpKernelWatches(SetupOptionsFor(opts), Say));
  BlockSessionSignals();
  return RunKernelSession(opts, setup);
}

// --kernel-accesses: user addresses of a process watched for the accesses the kernel makes
// on the process's behalf (exclude_user: copy_to_user into a read(2) buffer, futex words...),
// on every thread (inherited by new ones), each event with its kernel function+offset.
absl::StatusOr<int> RunKernelAccesses(const Options& opts) {
  BlockSessionSignals();
  KW_ASSIGN_OR_RETURN(KernelSetup setup,
                      watch::kernel::SetUpKernelAccesses(SetupOptionsFor(opts), Say));
  auto code = RunKernelSession(opts, setup);
  if (!code.ok()) {
    setup.proc->Abandon();
  }
  return code;
}

}  // namespace

// Why --if is refused for kernel watches and --kernel-accesses.
constexpr absl::string_view kKernelIfRefusal =
    "--if needs the values of each access, and kernel watches (and --kernel-accesses) are "
    "perf breakpoint streams that read no memory at the access; leave --if out and filter "
    "the --json events (tid, cpu, comm, site)";

constexpr absl::string_view kKernelRecordingRefusal =
    "-o records kernel --write watches only: a read-write breakpoint does not say whether the "
    "kernel read or wrote, kwatch does not read kernel code to decode the access, and a "
    "recording stores each event as a read or a write; record with --write, or watch --rw live";

int KernelMain(const Options& opts) {
  if (opts.read) {
    std::fprintf(stderr,
                 "kwatch: error: --read is not available for kernel watches: kwatch tells reads "
                 "from writes by decoding the accessing instruction, and it does not read kernel "
                 "code; use --rw\n");
    return 2;
  }
  if (!opts.output.empty() && (opts.rw || opts.exec)) {
    absl::FPrintF(stderr, "kwatch: error: %s\n", kKernelRecordingRefusal);
    return 2;
  }
  if (opts.backend == "page") {
    std::fprintf(stderr,
                 "kwatch: error: kernel watches use hardware breakpoints only (--backend page "
                 "protects a process's pages)\n");
    return 2;
  }
  if (opts.stop || opts.backend == "stop") {
    std::fprintf(stderr,
                 "kwatch: error: stop mode stops a process's threads through ptrace; kernel "
                 "watches use CPU-wide perf breakpoints (leave --stop out)\n");
    return 2;
  }
  if (!opts.condition.empty()) {
    absl::FPrintF(stderr, "kwatch: error: %s\n", kKernelIfRefusal);
    return 2;
  }
  if (opts.overcommit == "pages" || opts.overcommit == "multiplex") {
    std::fprintf(stderr, "kwatch: error: %s\n",
                 opts.overcommit == "pages"
                     ? "--overcommit=pages cannot watch kernel memory: page protection works on "
                       "a process's pages; kernel watches have the debug registers only "
                       "(--overcommit=fail, the default there)"
                     : "--overcommit=multiplex is for process watches; kernel watches take one "
                       "debug register each on every CPU and fail beyond four");
    return 2;
  }
  auto code = RunKernelWatch(opts);
  if (code.ok()) {
    return *code;
  }
  Error(code.status());
  if (absl::IsNotFound(code.status()) && opts.system_map.empty() && opts.vmlinux.empty()) {
    std::fprintf(stderr,
                 "kwatch: note: no target was given (-p PID or a command after `--`), so kwatch "
                 "watched the kernel and looked the expression up among kernel symbols\n");
  }
  return 1;  // 2 is for usage errors
}

int KernelAccessesMain(const Options& opts) {
  if (!opts.condition.empty()) {
    absl::FPrintF(stderr, "kwatch: error: %s\n", kKernelIfRefusal);
    return 2;
  }
  if (!opts.output.empty() && (opts.rw || opts.exec)) {
    absl::FPrintF(stderr, "kwatch: error: %s\n", kKernelRecordingRefusal);
    return 2;
  }
  auto code = RunKernelAccesses(opts);
  if (!code.ok()) {
    Error(code.status());
    return 1;
  }
  return *code;
}

}  // namespace kwatch::cli