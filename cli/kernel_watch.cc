#include "cli/kernel_watch.h"

#include <pthread.h>

#include <algorithm>
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
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "cli/output.h"
#include "cli/watch_recording.h"
#include "core/base/status_macros.h"
#include "core/kernel/btf_types.h"
#include "core/kernel/kernel_symbols.h"
#include "core/ptrace/process.h"
#include "core/store/trace_writer.h"
#include "core/symbols/symbols.h"
#include "drmgr/debug_regs.h"
#include "watch/kernel/capability.h"
#include "watch/kernel/drain_values.h"
#include "watch/kernel/kernel_event.h"
#include "watch/kernel/kernel_expr.h"
#include "watch/kernel/kernel_frames.h"
#include "watch/kernel/kernel_recording.h"
#include "watch/kernel/kernel_registers.h"
#include "watch/kernel/kernel_session.h"
#include "watch/kernel/kernel_slots.h"
#include "watch/kernel/task_names.h"
#include "watch/perf_util.h"

namespace kwatch::cli {

namespace {

using Options = WatchOptions;

using watch::kernel::DrainValues;
using watch::kernel::KernelEvent;
using watch::kernel::KernelEventSink;
using watch::kernel::KernelFrame;
using watch::kernel::KernelNote;
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

// The note that watch `i`'s value cannot be read (said once per watch).
std::string ValueUnreadableText(size_t i, const KernelWatch& w, const absl::Status& why) {
  return absl::StrFormat("kwatch: note: watch #%d %s shows no value: %s\n", i + 1, w.display,
                         why.message());
}

// ", callchains of up to N frames (--stack)" for the armed line of a kernel session, or "".
std::string StackNote(const Options& opts) {
  return opts.stack ? absl::StrFormat(", callchains of up to %d frames (--stack)", opts.stack_depth)
                    : std::string();
}

// Loads the kernel's line tables when a vmlinux with DWARF is at hand (--vmlinux, or perf's
// places), so that kernel code shows as func+off (file:line); says so when --vmlinux was
// given and cannot serve, and when --stack would show function+offset only.
void KernelLinesNote(const Options& opts, core::kernel::KernelSymbolResolver& symbols) {
  const absl::Status st = symbols.LoadLines();
  if (st.ok()) {
    std::fprintf(stderr, "kwatch: kernel source lines from %s\n", symbols.lines_file().c_str());
  } else if (!opts.vmlinux.empty() || opts.stack) {
    absl::FPrintF(stderr, "kwatch: note: %s\n", st.message());
  }
}

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

// The live output of a kernel session: events and the summary on stdout (text, or JSON lines
// with --json), notes on stderr in both forms. Start once the session is created.
class KernelPrinter : public KernelEventSink {
 public:
  KernelPrinter(const Options& opts, drmgr::DrKind kind, pid_t target,
                core::kernel::KernelSymbolResolver& symbols, TaskNames& comms,
                const core::Symbols* user_syms)
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
        std::fputs(
            ValueUnreadableText(note.watch, session_->watches()[note.watch], note.why).c_str(),
            stderr);
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
  // The notes on repeated IPs (stderr), after the summary's watches.
  void RepeatedIpNotes(std::span<const KernelWatch> watches) const {
    bool repeated = false;
    for (size_t i = 0; i < watches.size(); ++i) {
      if (watches[i].sites.repeated > 0) {
        std::fprintf(stderr, "%s", RepeatedIpNote(watches[i], i, symbols_).c_str());
        repeated = true;
      }
    }
    if (repeated) {
      absl::FPrintF(stderr, "%s", kRepeatedIpExplanation);
    }
  }

  const Options& opts_;
  drmgr::DrKind kind_;
  pid_t target_;  // --kernel-accesses: the process; 0 for kernel watches
  core::kernel::KernelSymbolResolver& symbols_;
  TaskNames& comms_;
  const core::Symbols* user_syms_;
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
      const std::string v =
          ev.value.has_value() ? absl::StrCat("~", ValueOf(*ev.value, w.len)) : std::string("?");
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

  absl::Status OnEvent(const KernelEvent& ev, const KernelWatch& w) override {
    if (opts_.quiet) {
      return absl::OkStatus();
    }
    const std::string ip = symbols_.Describe(ev.s.ip);
    const std::vector<KernelFrame> frames = Frames(ev);
    const double t = Seconds(ev.s.time);
    const std::string& comm = comms_.Get(static_cast<pid_t>(ev.s.tid), ev.s.cpu);
    const std::string value =
        ev.value.has_value() ? absl::StrCat(ValueOf(*ev.value, w.len), R"(,"value_at":"drain")")
                             : "null";
    const std::string stack =
        frames.empty()
            ? ""
            : absl::StrCat(",\"stack\":[",
                           absl::StrJoin(frames, ",",
                                         [](std::string* o, const KernelFrame& f) {
                                           absl::StrAppendFormat(
                                               o, "{\"ip\":\"0x%x\",\"space\":\"%s\",\"site\":%s}",
                                               f.ip, f.user ? "user" : "kernel",
                                               JsonString(f.site));
                                         }),
                           "]");
    std::printf(
        "{\"type\":\"event\",\"time\":%.9f,\"cpu\":%u,\"tid\":%u,\"comm\":%s,\"kind\":\"%s\","
        "\"watch\":%zu,\"field\":%s,\"addr\":\"0x%llx\",\"value\":%s,\"ip\":\"0x%llx\","
        "\"site\":%s%s}\n",
        t, ev.s.cpu, ev.s.tid, JsonString(comm).c_str(), Access(), ev.watch,
        JsonString(w.display).c_str(), static_cast<unsigned long long>(ev.s.addr), value.c_str(),
        static_cast<unsigned long long>(ev.s.ip), JsonString(ip).c_str(), stack.c_str());
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

// What a kernel session runs on, set up by RunKernelWatch or RunKernelAccesses.
struct KernelRun {
  std::vector<KernelWatch> watches;
  drmgr::DrKind kind = drmgr::DrKind::kWrite;
  std::string armed;  // the "armed ..." line
  std::unique_ptr<watch::kernel::KernelSlots> slots;
  std::unique_ptr<DrainValues> values;       // kernel memory for values at drain time, or null
  core::Process* proc = nullptr;             // --kernel-accesses: the process
  const core::Symbols* user_syms = nullptr;  // ... and its symbols
  core::TraceWriter* writer = nullptr;       // -o
};

// Runs a kernel session (kernel watches, or --kernel-accesses of `run.proc`) to its end:
// prints each event with its CPU, task and kernel function+offset, then the summary. Returns
// kwatch's exit status.
absl::StatusOr<int> RunKernelSession(const Options& opts, KernelRun run,
                                     core::kernel::KernelSymbolResolver& symbols) {
  const pid_t pid = run.proc != nullptr ? run.proc->pid() : 0;
  TaskNames comms;
  std::unique_ptr<KernelPrinter> printer;
  if (opts.json) {
    printer =
        std::make_unique<KernelJsonPrinter>(opts, run.kind, pid, symbols, comms, run.user_syms);
  } else {
    printer =
        std::make_unique<KernelTextPrinter>(opts, run.kind, pid, symbols, comms, run.user_syms);
  }
  std::optional<watch::kernel::KernelRecordingSink> recorder;
  if (run.writer != nullptr) {
    recorder.emplace(*run.writer, symbols, comms, *printer);
  }
  KernelEventSink& sink = recorder.has_value() ? static_cast<KernelEventSink&>(*recorder)
                                               : static_cast<KernelEventSink&>(*printer);
  watch::kernel::KernelSessionOptions so;
  so.count = opts.count;
  so.duration = opts.duration;
  so.callchains = opts.stack;
  so.kill_on_exit = opts.kill_on_exit;
  KW_ASSIGN_OR_RETURN(
      std::unique_ptr<KernelWatchSession> session,
      KernelWatchSession::Create(so, std::move(run.watches),
                                 std::make_unique<watch::kernel::PublishedRegisters>(
                                     std::move(run.slots), pid, opts.command_line, SayUnpublished),
                                 std::move(run.values), run.proc, sink));
  std::fprintf(stderr, "kwatch: %s\n", run.armed.c_str());
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

// Blocks the signals that go to the session's signalfd, before the recording's checkpoint
// thread starts, so that it inherits the mask (else a Ctrl-C there would kill kwatch).
void BlockSessionSignals() {
  sigset_t mask;
  sigemptyset(&mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGCHLD}) {
    sigaddset(&mask, sig);
  }
  pthread_sigmask(SIG_BLOCK, &mask, nullptr);
}

// The drain-time values of `watches` (kcore), with the notes that say where they come from
// or why there are none. Nothing is opened with -q and no -o (no event is shown or recorded).
absl::StatusOr<std::unique_ptr<DrainValues>> OpenValues(const Options& opts,
                                                        const std::vector<KernelWatch>& watches) {
  auto opened =
      watch::kernel::OpenDrainValues(opts.kcore, !opts.quiet || !opts.output.empty(), watches);
  if (!opened.ok()) {
    return absl::Status(opened.status().code(),
                        absl::StrCat("--kcore ", opts.kcore, ": ", opened.status().message()));
  }
  if (!opened->why_none.ok()) {
    absl::FPrintF(stderr, "kwatch: note: kernel events show no value: %s\n",
                  opened->why_none.message());
  } else if (!opened->source.empty()) {
    absl::FPrintF(stderr,
                  "kwatch: values from %s, read when kwatch drains the events (~V), not at the "
                  "access\n",
                  opened->source);
  }
  for (const auto& [i, why] : opened->unreadable) {
    std::fputs(ValueUnreadableText(i, watches[i], why).c_str(), stderr);
  }
  return std::move(opened->values);
}

// Resolves a kernel watch's expression and says what it found (stderr): the notes on its
// length and section, then "jiffies: 8 bytes at 0x..., from System.map FILE (KASLR slide ...)".
absl::StatusOr<KernelWatch> ResolveAndSay(const std::string& text, const Options& opts,
                                          core::kernel::KernelSymbolResolver& symbols,
                                          const core::kernel::KernelBtf* btf) {
  watch::kernel::KernelExprOptions eo;
  eo.len = opts.len;
  eo.type = opts.kernel_type;
  eo.exec = opts.exec;
  KW_ASSIGN_OR_RETURN(watch::kernel::ResolvedKernelExpr r,
                      watch::kernel::ResolveKernelExpr(text, eo, symbols, btf));
  KernelWatch& w = r.watch;
  if (r.length_guessed) {
    std::fprintf(stderr,
                 "kwatch: note: no type for '%s' (System.map and kallsyms carry none, and the "
                 "kernel's BTF describes only per-CPU variables): watching %u bytes; give "
                 "--len N or --type TYPE\n",
                 w.display.c_str(), w.len);
  }
  if (r.read_only_section && !opts.exec && !opts.rw && !opts.read) {
    std::fprintf(stderr,
                 "kwatch: warning: '%s' is in a read-only kernel section (type '%c' in %s): "
                 "nothing writes there, so --write will see no event\n",
                 r.symbol.c_str(), r.symbol_type, w.source.c_str());
  }
  std::fprintf(stderr, "kwatch: %s: %u byte%s at 0x%llx%s%s, from %s%s\n", w.display.c_str(), w.len,
               w.len == 1 ? "" : "s", static_cast<unsigned long long>(w.addr),
               w.type_name.empty() ? "" : ", ", w.type_name.c_str(), w.source.c_str(),
               w.slide != 0 || absl::StartsWith(w.source, "System.map") ||
                       absl::StartsWith(w.source, "vmlinux")
                   ? absl::StrFormat(" (KASLR slide %s0x%x)", w.slide < 0 ? "-" : "+",
                                     w.slide < 0 ? -static_cast<uint64_t>(w.slide)
                                                 : static_cast<uint64_t>(w.slide))
                         .c_str()
                   : "");
  return std::move(w);
}

uint16_t CallchainFrames(const Options& opts) {
  return opts.stack ? static_cast<uint16_t>(opts.stack_depth) : 0;
}

absl::StatusOr<int> RunKernelWatch(const Options& opts) {
  if (!watch::kernel::HasPerfmonCapability()) {
    return absl::PermissionDeniedError(
        "watching the kernel needs root, or CAP_PERFMON (Linux >= 5.8) or CAP_SYS_ADMIN (also "
        "CAP_SYSLOG to read kernel addresses in /proc/kallsyms): run it with sudo, or `sudo "
        "setcap cap_perfmon,cap_syslog+ep $(command -v kwatch)`");
  }
  core::kernel::KernelSymbolSources src;
  src.system_map = opts.system_map;
  src.vmlinux = opts.vmlinux;
  KW_ASSIGN_OR_RETURN(auto symbols, core::kernel::KernelSymbolResolver::Create(src));
  std::unique_ptr<core::kernel::KernelBtf> btf;
  if (auto b = core::kernel::KernelBtf::Load(); b.ok()) {
    btf = *std::move(b);
  } else if (!opts.kernel_type.empty()) {
    return b.status();
  }

  drmgr::DrKind kind = drmgr::DrKind::kWrite;
  if (opts.rw || opts.read) {
    kind = drmgr::DrKind::kReadWrite;
  } else if (opts.exec) {
    kind = drmgr::DrKind::kExec;
  }
  const std::vector<int> cpus = watch::OnlineCpus();
  std::vector<KernelWatch> watches;
  for (const std::string& e : opts.exprs) {
    KW_ASSIGN_OR_RETURN(KernelWatch w, ResolveAndSay(e, opts, *symbols, btf.get()));
    watches.push_back(std::move(w));
  }
  // drmgr decides who holds which register of each CPU; its slots are opened as CPU-wide
  // breakpoints (watch/kernel/kernel_slots.h).
  KW_ASSIGN_OR_RETURN(auto slots,
                      watch::kernel::ArmKernelWatches(kind, CallchainFrames(opts), watches, cpus));
  KW_ASSIGN_OR_RETURN(std::unique_ptr<DrainValues> values, OpenValues(opts, watches));
  KernelLinesNote(opts, *symbols);
  BlockSessionSignals();
  std::unique_ptr<core::TraceWriter> writer;
  if (!opts.output.empty()) {
    KW_ASSIGN_OR_RETURN(writer,
                        watch::kernel::CreateKernelRecording(RecordingSpecFor(opts), 0, watches));
  }
  KernelRun run;
  run.kind = kind;
  run.armed = absl::StrFormat(
      "armed %d kernel watch%s on %d CPUs (one breakpoint per CPU), perf breakpoint stream "
      "mode%s",
      watches.size(), watches.size() == 1 ? "" : "es", cpus.size(), StackNote(opts));
  run.watches = std::move(watches);
  run.slots = std::move(slots);
  run.values = std::move(values);
  run.writer = writer.get();
  return RunKernelSession(opts, std::move(run), *symbols);
}

// --kernel-accesses: user addresses of a process watched for the accesses the kernel makes
// on the process's behalf (exclude_user: copy_to_user into a read(2) buffer, futex words...),
// on every thread (inherited by new ones), each event with its kernel function+offset.
absl::StatusOr<int> RunKernelAccesses(const Options& opts) {
  if (!watch::kernel::HasPerfmonCapability()) {
    return absl::PermissionDeniedError(
        "--kernel-accesses watches kernel code: it needs root, or CAP_PERFMON (Linux >= 5.8) "
        "or CAP_SYS_ADMIN (also CAP_SYSLOG to read kernel addresses in /proc/kallsyms)");
  }
  KW_ASSIGN_OR_RETURN(auto ksyms, core::kernel::KernelSymbolResolver::Create({}));
  BlockSessionSignals();
  core::LaunchOptions lo;
  lo.kill_on_exit = opts.kill_on_exit;
  lo.run_as = opts.run_as;
  KW_ASSIGN_OR_RETURN(std::unique_ptr<core::Process> proc,
                      core::Process::Start(opts.pid, opts.command, lo));
  auto fail = [&](absl::Status st) -> absl::Status {
    if (proc->launched()) {
      (void)proc->Kill();
    } else {
      (void)proc->Detach();
    }
    return st;
  };
  auto syms = core::Symbols::ForProcess(proc->pid());
  if (!syms.ok()) {
    return fail(syms.status());
  }
  const core::MemoryReader reader = [&proc](core::RemoteAddr addr, std::span<uint8_t> out) {
    return proc->ReadMemory(addr, out);
  };
  const drmgr::DrKind kind = opts.rw ? drmgr::DrKind::kReadWrite : drmgr::DrKind::kWrite;
  std::vector<KernelWatch> watches;
  for (const std::string& text : opts.exprs) {
    auto w = watch::kernel::ResolveProcessExpr(text, opts.len, **syms, reader);
    if (!w.ok()) {
      return fail(w.status());
    }
    watches.push_back(*std::move(w));
  }
  if (absl::Status st = proc->StopAll(); !st.ok()) {
    return fail(st);
  }
  // drmgr decides which registers of the process's threads the watches hold (process scope,
  // as process sessions ask it); each slot is opened on every thread, inherited by new ones.
  auto slots = watch::kernel::ArmKernelAccesses(kind, CallchainFrames(opts), watches, *proc);
  if (!slots.ok()) {
    return fail(slots.status());
  }
  if (absl::Status st = proc->ResumeAll(); !st.ok()) {
    return fail(st);
  }
  KernelLinesNote(opts, *ksyms);
  std::unique_ptr<core::TraceWriter> writer;
  if (!opts.output.empty()) {
    auto w = watch::kernel::CreateKernelRecording(RecordingSpecFor(opts), proc->pid(), watches);
    if (!w.ok()) {
      return fail(w.status());
    }
    writer = *std::move(w);
  }
  const std::string prog = proc->argv().empty() ? "?" : proc->argv()[0];
  KernelRun run;
  run.kind = kind;
  run.armed = absl::StrFormat(
      "armed %d watch%s on pid %d (%s) for the kernel's accesses only (exclude_user), perf "
      "breakpoint stream mode%s",
      watches.size(), watches.size() == 1 ? "" : "es", proc->pid(), prog, StackNote(opts));
  run.watches = std::move(watches);
  run.slots = *std::move(slots);
  run.proc = proc.get();
  run.user_syms = syms->get();
  run.writer = writer.get();
  auto code = RunKernelSession(opts, std::move(run), *ksyms);
  if (!code.ok()) {
    return fail(code.status());
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
    return 2;
  }
  return 1;
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