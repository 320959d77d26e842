#include "cli/app.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "cli/join_client.h"
#include "cli/join_server.h"
#include "cli/join_socket.h"
#include "cli/kernel_watch.h"
#include "cli/output.h"
#include "cli/report_cmd.h"
#include "cli/watch_options.h"
#include "cli/watch_recording.h"
#include "core/base/clock.h"
#include "core/base/status_macros.h"
#include "core/base/syscall_status.h"
#include "core/base/target_files.h"
#include "core/ptrace/process.h"
#include "core/store/trace_writer.h"
#include "core/symbols/expr.h"
#include "core/symbols/symbols.h"
#include "drmgr/debug_regs.h"
#include "drmgr/slot_registry.h"
#include "version/version.h"
#include "watch/condition.h"
#include "watch/perf_breakpoint.h"
#include "watch/perf_util.h"
#include "watch/probe/agent_calls.h"
#include "watch/process_setup.h"
#include "watch/profile/storage_profile.h"
#include "watch/recording.h"
#include "watch/recording_sink.h"
#include "watch/session.h"
#include "watch/summary.h"
#include "watch/target_set.h"

namespace kwatch::cli {

namespace {

using Options = WatchOptions;

// argv as a user would retype it in a shell (arguments with spaces or quotes quoted).
std::string CommandLine(int argc, char** argv) {
  std::string out;
  for (int i = 0; i < argc; ++i) {
    const absl::string_view a = argv[i];
    if (i > 0) {
      out += ' ';
    }
    if (!a.empty() && a.find_first_of(" \t'\"$\\") == absl::string_view::npos) {
      absl::StrAppend(&out, a);
    } else {
      out += '\'';
      for (char c : a) {
        if (c == '\'') {
          out += "'\\''";
        } else {
          out += c;
        }
      }
      out += '\'';
    }
  }
  return out;
}

void Error(const absl::Status& s) {
  std::fprintf(stderr, "kwatch: error: %s\n", std::string{s.message()}.c_str());
}

// The lines that say what was armed and how (stderr).
void PrintArmed(const watch::TargetSet& set, const watch::WatchSession& session) {
  const core::ptrace::Process& proc = set.target_process();
  std::string prog = proc.argv().empty() ? "?" : proc.argv()[0];
  if (!session.backend_note().empty()) {
    std::fprintf(stderr, "kwatch: %s\n", session.backend_note().c_str());
  }
  for (const std::string& note : session.follow_notes()) {
    std::fprintf(stderr, "kwatch: note: %s\n", note.c_str());
  }
  size_t paged = 0;
  for (const watch::Watch& w : session.watches()) {
    paged += session.placement(w.id).backend == watch::BackendKind::kPage ? 1 : 0;
  }
  std::string mode = session.backend() == watch::BackendKind::kPage ? "page-protection mode"
                     : session.backend() == watch::BackendKind::kStop
                         ? "stop mode (ptrace debug registers)"
                         : "perf breakpoint stream mode";
  if (session.backend() != watch::BackendKind::kPage && paged > 0) {
    absl::StrAppend(&mode, " (", paged, " with page protection)");
  }
  if (const std::optional<watch::ArmedAt>& at = set.armed_at(); at.has_value()) {
    std::fprintf(stderr,
                 "kwatch: --arm-at %s: tid %d reached %s %.3f ms after the target was let run; "
                 "every thread stopped there while the watches were resolved and armed "
                 "(%.0f us)\n",
                 at->spec.c_str(), at->tid, at->where.c_str(), at->wait_ms, at->arm_us);
  }
  std::fprintf(stderr, "kwatch: armed %zu watch%s on %s (%s), %s%s\n", session.watches().size(),
               session.watches().size() == 1 ? "" : "es", core::PidText(proc.pid()).c_str(),
               prog.c_str(), mode.c_str(), set.follows_forks() ? ", following forks (-f)" : "");
  if (session.allocator() != nullptr) {
    // drmgr's decisions, one line per watch: split, shared, multiplexed, sent to pages.
    for (const watch::Watch& w : session.watches()) {
      std::fprintf(stderr, "kwatch:   watch #%u %s: %s\n", w.id + 1, w.target.display.c_str(),
                   session.placement(w.id).detail.c_str());
    }
    if (const int ext = session.external_slots(); ext > 0) {
      std::fprintf(stderr,
                   "kwatch: %d debug register%s of pid %d %s held outside kwatch (a debugger's "
                   "hardware watchpoints, or another tool); kwatch uses the rest "
                   "(`kwatch slots -p %d` shows them)\n",
                   ext, ext == 1 ? "" : "s", proc.pid(), ext == 1 ? "is" : "are", proc.pid());
    }
  }
  if (session.calls() != nullptr) {
    std::fprintf(stderr, "kwatch: note: %s\n", session.calls()->path_note().c_str());
  }
  std::fflush(stderr);
}

// Runs a process watch session to its end: the header and what was armed, then Step until the
// session ends, publishing drmgr's decisions for `kwatch slots` (refreshed as multiplexing
// rotates them), then Finish (the summary). Returns the launched target's exit status, or 0.
absl::StatusOr<int> RunTargetSet(const Options& opts, watch::TargetSet& set,
                                 AccessPrinter& printer) {
  watch::WatchSession& session = set.first_session();
  const pid_t pid = set.target_process().pid();
  printer.Start(session, set.start_ns(), pid);
  PrintArmed(set, session);

  uint64_t published_ns = 0;
  auto publish = [&](bool force) {
    const watch::WatchSession* now = set.target_session();
    if (now == nullptr || now->allocator() == nullptr) {
      return;
    }
    const uint64_t t = core::MonotonicNs();
    if (!force && t - published_ns < 200'000'000) {
      return;
    }
    published_ns = t;
    if (absl::Status s = drmgr::PublishSlots(pid, now->allocator()->Snapshot(), opts.command_line);
        !s.ok() && force) {
      std::fprintf(stderr, "kwatch: note: `kwatch slots` will not see this session: %s\n",
                   std::string{s.message()}.c_str());
    }
  };
  absl::Cleanup unpublish = [] { drmgr::UnpublishSlots(); };
  publish(true);

  uint64_t rotations = set.rotations();
  uint64_t guest_changes = set.guest_changes();
  uint64_t moves = set.moves();
  while (true) {
    KW_ASSIGN_OR_RETURN(const bool more, set.Step());
    if (set.rotations() != rotations || set.moves() != moves) {
      rotations = set.rotations();
      moves = set.moves();
      publish(false);  // multiplexing rotated, or --follow moved watches
    }
    if (set.guest_changes() != guest_changes) {
      guest_changes = set.guest_changes();
      publish(true);  // a kwatch joined or left: `kwatch slots` shows its watches or not
    }
    if (!more) {
      break;
    }
  }
  KW_ASSIGN_OR_RETURN(const watch::TargetSetEnd end, set.Finish());
  return end.exit_status.value_or(0);
}

// --arm-at: the target never ran the point (it ended, exec'd, or kwatch was interrupted): no
// watch was armed. Says so in the summary's place; returns the launched target's status, or 0.
int NeverArmed(const Options& opts, const watch::DeferredArming& d) {
  std::string exprs = absl::StrJoin(opts.exprs, ", ");
  if (opts.json) {
    std::string s = absl::StrFormat(
        "{\"type\":\"summary\",\"events\":0,\"armed\":false,\"arm_at\":{\"spec\":%s,"
        "\"point\":%s,\"never\":%s}",
        JsonString(d.spec), JsonString(d.point), JsonString(d.never));
    if (d.exit.has_value()) {
      absl::StrAppendFormat(&s, R"(,"exit_code":%d,"signal":%d)",
                            d.exit->signaled ? -1 : d.exit->code, d.exit->signal);
    }
    s += "}\n";
    std::fputs(s.c_str(), stdout);
  } else {
    std::printf(
        "\n== kwatch summary: 0 events: the watches (%s) were never armed: --arm-at %s "
        "(%s) never ran; %s ==\n",
        exprs.c_str(), d.spec.c_str(), d.point.c_str(), d.never.c_str());
  }
  std::fflush(stdout);
  std::fprintf(stderr, "kwatch: --arm-at %s never ran (%s): the watches were never armed\n",
               d.spec.c_str(), d.never.c_str());
  return d.exit.has_value() && !opts.command.empty() ? d.exit->ShellStatus() : 0;
}

absl::StatusOr<int> RunWatch(const Options& opts) {
  watch::ProcessSetupOptions po;
  po.pid = opts.pid;
  po.command = opts.command;
  po.launch.kill_on_exit = opts.kill_on_exit;
  po.launch.run_as = opts.run_as;
  po.follow_forks = opts.follow_forks;
  drmgr::DrKind kind = drmgr::DrKind::kWrite;
  if (opts.rw || opts.read) {
    kind = drmgr::DrKind::kReadWrite;
  } else if (opts.exec) {
    kind = drmgr::DrKind::kExec;
  }
  for (const auto& e : opts.exprs) {
    watch::WatchRequest r;
    r.expr = e;
    r.kind = kind;
    r.reads_only = opts.read;
    r.length = opts.len;
    r.follow = opts.follow;
    if (!opts.in.empty()) {
      po.calls.push_back(watch::CallWatchRequest{std::move(r), opts.in, opts.at, opts.until});
    } else {
      po.requests.push_back(std::move(r));
    }
  }
  watch::SessionOptions& so = po.session;
  so.backend = opts.backend == "perf"   ? watch::BackendKind::kPerf
               : opts.backend == "page" ? watch::BackendKind::kPage
               : opts.backend == "stop" ? watch::BackendKind::kStop
                                        : watch::BackendKind::kAuto;
  if (opts.stop) {
    so.backend = watch::BackendKind::kStop;
  }
  so.overcommit = opts.overcommit == "multiplex" ? watch::Overcommit::kMultiplex
                  : opts.overcommit == "fail"    ? watch::Overcommit::kFail
                                                 : watch::Overcommit::kPages;
  // --backend perf/stop asks for debug registers: what does not fit is not silently watched
  // with page protection (hundreds of times slower) unless --overcommit says so.
  if (opts.overcommit.empty() &&
      (so.backend == watch::BackendKind::kPerf || so.backend == watch::BackendKind::kStop)) {
    so.overcommit = watch::Overcommit::kFail;
    so.hardware_asked = true;
  }
  so.mux_interval = absl::Milliseconds(opts.mux_interval_ms);
  so.stack_frames = opts.stack ? opts.stack_depth : 0;
  po.condition = opts.condition;
  po.arm_at = opts.arm_at;
  if (!po.calls.empty() && opts.calls_by != "ptrace") {
    if (opts.stack) {
      po.calls_why_not_agent = "--stack unwinds each access's stack through ptrace";
    } else {
      po.call_agent = [](core::ptrace::Process& proc, watch::CallWatches& calls,
                         const watch::CallAgentPlan& plan) {
        return watch::probe::StartAgentCalls(proc, calls, plan);
      };
    }
    po.calls_need_agent = opts.calls_by == "agent";
  }
  po.on_planted = [&opts](const std::string& point) {
    std::fprintf(stderr,
                 "kwatch: --arm-at %s: waiting for a thread to run %s; the watches are armed "
                 "there\n",
                 opts.arm_at.c_str(), point.c_str());
    std::fflush(stderr);
  };
  KW_ASSIGN_OR_RETURN(watch::ProcessSetup setup, watch::SetUpProcessWatch(std::move(po)));
  if (setup.session == nullptr) {
    return NeverArmed(opts, *setup.deferred);
  }
  std::unique_ptr<core::store::TraceWriter> writer;
  if (!opts.output.empty()) {
    auto w = watch::CreateWatchRecording(RecordingSpecFor(opts), *setup.session, setup.proc->pid());
    if (!w.ok()) {
      setup.Abandon();
      return w.status();
    }
    writer = *std::move(w);
  }
  std::unique_ptr<AccessPrinter> printer;
  if (opts.json) {
    printer = std::make_unique<AccessJsonPrinter>(stdout, opts.quiet);
  } else {
    printer = std::make_unique<AccessTextPrinter>(stdout, opts.quiet);
  }
  std::optional<watch::AccessRecordingSink> recorder;
  if (writer != nullptr) {
    recorder.emplace(*writer, *printer,
                     [](const watch::RecordingOutcome& o) { (void)SayRecordingEnd(o); });
  }
  watch::AccessSink& sink = recorder.has_value() ? static_cast<watch::AccessSink&>(*recorder)
                                                 : static_cast<watch::AccessSink&>(*printer);
  // Other kwatch commands on the same process join this session (cli/join_server.h).
  std::unique_ptr<JoinServer> joins;
  if (absl::StatusOr<std::unique_ptr<JoinServer>> j = JoinServer::Listen(setup.proc->pid());
      j.ok()) {
    joins = *std::move(j);
  } else {
    std::fprintf(stderr, "kwatch: note: no other kwatch can join this session: %s\n",
                 std::string{j.status().message()}.c_str());
  }
  watch::TargetSetOptions to;
  to.count = opts.count;
  to.duration = opts.duration;
  to.kill_on_exit = opts.kill_on_exit;
  to.recording = writer != nullptr;
  to.condition = opts.condition;
  to.start_ns = setup.armed_ns;
  if (setup.deferred.has_value()) {
    to.armed_at = setup.deferred->Armed();
  }
  KW_ASSIGN_OR_RETURN(
      std::unique_ptr<watch::TargetSet> set,
      watch::TargetSet::Create(to, setup.session_options, std::move(setup.sigfd),
                               std::move(setup.group), std::move(setup.proc),
                               std::move(setup.session), std::move(setup.conditions), sink));
  if (joins != nullptr) {
    set->SetGuests(joins.get());
  }
  auto code = RunTargetSet(opts, *set, *printer);
  if (!code.ok()) {
    set->Abandon();
    return code.status();
  }
  if (recorder.has_value() && recorder->failed()) {
    return 1;  // -o was not honoured (docs/recording.md)
  }
  return *code;
}

}  // namespace

int Main(int argc, char** argv) {
  if (argc > 1 && absl::string_view(argv[1]) == "report") {
    return ReportMain(std::vector<std::string>(argv + 2, argv + argc));
  }
  if (argc > 1 && absl::string_view(argv[1]) == "export") {
    return ExportMain(std::vector<std::string>(argv + 2, argv + argc));
  }
  // Everything after the first "--" is the command to launch.
  std::vector<std::string> args;
  Options opts;
  bool have_dashdash = false;
  for (int i = 1; i < argc; ++i) {
    if (!have_dashdash && absl::string_view(argv[i]) == "--") {
      have_dashdash = true;
      continue;
    }
    (have_dashdash ? opts.command : args).emplace_back(argv[i]);
  }

  CLI::App app{
      "kwatch: watch memory with the processor's debug registers.\n\n"
      "  kwatch --write g_stats.hits -- ./server ARGS   launch a program and watch a field\n"
      "  kwatch --rw 'cache->lines[3]' -p PID          attach to a running process\n"
      "  kwatch --rw g_stats -o run.kwdb -- ./prog      record; then `kwatch report run.kwdb`\n"
      "  kwatch --write &jiffies                        no -p and no command: a kernel variable,\n"
      "                                                 on every CPU (root; see --system-map)\n\n"
      "Subcommands: `kwatch report FILE` (storage profile of a recording), `kwatch export\n"
      "--sql OUT FILE` (a recording with one SQL row per event), `kwatch probe`\n"
      "(INT3 and uprobe probes), `kwatch slots [-p PID]` (who holds the debug registers),\n"
      "`kwatch gdbserver` (gdb's remote protocol, sharing the target with kwatch's watches);\n"
      "see --help of each.\n"
      "Expressions: name, &name, name.field, name[3], ptr->field, 0xADDR, 0xADDR:LEN.\n"
      "A pointer in an expression is read once, when the watch is armed (gdb's watch -l);\n"
      "--follow moves the watch whenever the pointer changes (gdb's watch).\n"
      "With hardware breakpoints a structure is split over the four x86 debug registers and\n"
      "what does not fit follows --overcommit; with page protection (--backend page) any\n"
      "variable or structure is watched exactly, per field.",
      "kwatch"};
  app.set_version_flag("--version", "kwatch " + version::Full());
  auto* w = app.add_flag("-w,--write", opts.write, "Report writes (default)");
  auto* a = app.add_flag("-a,--rw", opts.rw, "Report reads and writes (gdb's awatch)");
  auto* r = app.add_flag("-r,--read", opts.read,
                         "Report reads: x86 has no read-only watchpoint, so kwatch watches "
                         "read-write and filters writes out in software");
  auto* x = app.add_flag("-x,--exec", opts.exec,
                         "Report execution of code: FUNC, FUNC+OFF, FILE:LINE (its first "
                         "statement) or an address (an execute breakpoint)");
  w->excludes(a, r, x);
  a->excludes(r, x);
  r->excludes(x);
  app.add_option("--len", opts.len, "Watch this many bytes (1, 2, 4, 8) instead of the type's size")
      ->check(CLI::IsMember({1, 2, 4, 8}));
  app.add_option("expr", opts.exprs, "What to watch (one or more expressions)");
  app.add_option("-p,--pid", opts.pid, "Attach to a running process")->check(CLI::PositiveNumber);
  app.add_option("-u,--user", opts.user,
                 "Run the command as USER (name or uid, with its groups), as strace -u; needs "
                 "root");
  app.add_option("-c,--count", opts.count, "Stop after N events");
  app.add_option("-d,--duration", opts.duration, "Stop after SECS seconds")
      ->check(CLI::PositiveNumber);
  app.add_option("--backend", opts.backend,
                 "How to watch: perf (hardware breakpoints, stream mode), stop (hardware "
                 "breakpoints through ptrace: each access stops the thread, exact old and new "
                 "values; same as --stop), page (page protection, exact values), auto (perf "
                 "where this machine delivers debug traps, else page)")
      ->check(CLI::IsMember({"auto", "perf", "page", "stop"}))
      ->capture_default_str();
  app.add_flag("--stop", opts.stop,
               "Stop mode: hardware breakpoints written into the threads' debug registers "
               "(ptrace); each access stops the thread for its exact old and new values");
  app.add_option("--if", opts.condition,
                 "Report only accesses for which EXPR holds, C syntax over new, old (the bytes "
                 "accessed, after and before), tid, pid, cpu, len, addr: 'new > 100', "
                 "'new != old && tid == 4242'. Exact modes only (page, stop)");
  app.add_flag("--stack", opts.stack,
               "Print the backtrace of each access (process watches: exact modes only, page "
               "and stop, the thread is stopped at the access; kernel watches and "
               "--kernel-accesses: the kernel's callchain, then the task's user frames)");
  app.add_option("--stack-depth", opts.stack_depth, "Frames per --stack backtrace")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  app.add_option("--overcommit", opts.overcommit,
                 "Hardware sessions: what to do with watches beyond the 4 debug registers of a "
                 "thread: pages (page protection), multiplex (take turns; counts scaled by "
                 "coverage), fail")
      ->check(CLI::IsMember({"pages", "multiplex", "fail"}))
      ->default_str("pages for processes (fail with --backend perf/stop), fail for the kernel");
  app.add_option("--mux-interval", opts.mux_interval_ms,
                 "Multiplexing: milliseconds each group of watches holds the debug registers")
      ->check(CLI::Range(1, 10000))
      ->capture_default_str();
  app.add_option("-o,--output", opts.output,
                 "Record the session to FILE (SQLite; read it with `kwatch report FILE`)");
  app.add_flag("--json", opts.json, "Print JSON lines: one per event, then a summary object");
  app.add_flag("-q,--quiet", opts.quiet, "Print no live events, only the summary");
  app.add_option("--system-map", opts.system_map,
                 "Kernel watches: the running kernel's System.map, for variables that "
                 "/proc/kallsyms does not list (kernels without CONFIG_KALLSYMS_ALL)");
  app.add_option("--vmlinux", opts.vmlinux,
                 "Kernel watches: the running kernel's vmlinux (with its symbol table); with "
                 "DWARF, kernel code is shown with file:line");
  app.add_option("--kcore", opts.kcore,
                 "Kernel watches: read each event's value at drain time from this ELF core "
                 "file (kernel addresses in PT_LOAD segments) instead of /proc/kcore")
      ->default_str("/proc/kcore");
  app.add_flag("--kernel-accesses", opts.kernel_accesses,
               "Watch a process's memory for the accesses the kernel makes on its behalf "
               "(e.g. the buffer read(2) fills), with the kernel function that made each");
  app.add_option("--via", opts.via,
                 "Kernel watches: find the variable's address in the code of FUNC, a kernel "
                 "function that reads it (its RIP-relative operand; +OFF picks the instruction "
                 "when FUNC has several), read through BPF: for kernels whose kallsyms lists no "
                 "variables, without System.map or vmlinux. jiffies needs none (jiffies_read)")
      ->type_name("FUNC[+OFF]");
  app.add_flag("--values-at-drain", opts.values_at_drain,
               "Kernel watches and --kernel-accesses: read each event's value when kwatch drains "
               "the events (~V, /proc/kcore or BPF) instead of at the access (no BPF program on "
               "the breakpoints: a little less work per hit)");
  app.add_option("--type", opts.kernel_type,
                 "Kernel watches: the C type of the watched symbol (e.g. 'struct task_struct'), "
                 "for member expressions; the layout comes from the kernel's BTF");
  app.add_flag("-f,--follow-forks", opts.follow_forks,
               "Watch the children the target forks too, and theirs, as strace -f: each is armed "
               "before it runs, its accesses carry its pid (text PID/TID, JSON pid) and the "
               "summary counts every process; after an exec the watches are armed again by "
               "expression in the new image. Without -f a child runs with none of kwatch's "
               "watches");
  app.add_option("--arm-at", opts.arm_at,
                 "Arm the watches the first time a thread runs SPEC, a probe point as `kwatch "
                 "probe` takes it (FUNC, FUNC+OFF, FUNC:RELLINE, FILE:LINE, 0xADDR, in the "
                 "program's executable): expressions through pointers that start-up code sets "
                 "are resolved there. Every thread stops at the point while the watches are "
                 "armed; the breakpoint is then removed")
      ->type_name("SPEC");
  app.add_option("--in", opts.in,
                 "Watch the expressions per call of FUNC, a function of the program's "
                 "executable: at each call they are evaluated against its parameters and locals "
                 "('r->len', 'sum', 'buf[2]') and armed in the calling thread's debug registers, "
                 "and removed when that call returns (each call and thread its own; recursion "
                 "too). `FUNC::EXPR` says the same for one expression, as gdb's scope syntax")
      ->type_name("FUNC");
  app.add_option("--at", opts.at,
                 "With --in: look each call's objects up when the call reaches SPEC (FUNC+OFF, "
                 "FUNC:RELLINE, FILE:LINE inside FUNC) instead of after FUNC's prologue (a local "
                 "set later, a pointer assigned in the body)")
      ->type_name("SPEC");
  app.add_option("--until", opts.until,
                 "With --in: end each call's watches when the call reaches SPEC (a point inside "
                 "FUNC) instead of when it returns")
      ->type_name("SPEC");
  app.add_option("--calls-by", opts.calls_by,
                 "With --in: who arms each call's watches. agent: kwatch's agent, inside the "
                 "target (jumps to trampolines at the function's entry and lookup point, one "
                 "ioctl to arm and one to disarm: a few us a call, no stop); ptrace: kwatch, "
                 "stopping the thread at each entry and return (tens of us a call); auto: the "
                 "agent where it can (perf stream mode, no --stack, a jump possible at every "
                 "point), else ptrace, saying why")
      ->check(CLI::IsMember({"auto", "agent", "ptrace"}))
      ->type_name("WHO");
  app.add_flag("--follow", opts.follow,
               "Follow the expressions' pointers, as gdb's plain `watch`: kwatch watches every "
               "pointer an expression goes through (g_p in g_p->v; a and a->b in a->b->c) for "
               "writes, in debug registers, and at each write, while every thread is stopped, "
               "evaluates the expression again and moves the watch to the object it leads to "
               "now (parked while a pointer is NULL). Stop mode. Without it a watch stays on the "
               "object its pointers led to when it was armed (gdb's `watch -l`)");
  app.add_flag(
      "--kill-on-exit", opts.kill_on_exit,
      "Kill a launched target when kwatch stops before it ends (default: leave it running)");
  app.footer(
      "Permissions: hardware watchpoints need root, or CAP_PERFMON + CAP_SYS_PTRACE, or\n"
      "`sysctl kernel.perf_event_paranoid=1` for your own processes. Everything after `--` is\n"
      "the command to launch; kwatch exits with its exit status.\n\n"
      "Joining: `kwatch --write EXPR -p PID` on a process another kwatch of the same user\n"
      "already watches joins that session through its control socket\n"
      "(/run/user/UID/kwatch/PID.sock or /tmp/kwatch-UID/PID.sock, mode 0600): its watches get\n"
      "debug registers from the same drmgr, its events and summary are its own, and its\n"
      "watches are removed (their registers returned) when it ends or is killed. -c, -d, --len,\n"
      "--json, -q, --if and -o join (the session writes the recording); --stack, --exec, -f,\n"
      "--backend and --overcommit do not yet.");

  opts.command_line = CommandLine(argc, argv);
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (opts.exprs.empty()) {
    std::fprintf(stderr,
                 "kwatch: error: nothing to watch: give an expression, e.g. "
                 "`kwatch --write g_counter -- ./prog`\n%s",
                 app.help().c_str());
    return 2;
  }
  if (!opts.condition.empty()) {
    if (absl::StatusOr<watch::Condition> c = watch::Condition::Parse(opts.condition); !c.ok()) {
      Error(c.status());
      return 2;
    }
  }
  if (opts.pid.has_value() && !opts.command.empty()) {
    std::fprintf(stderr, "kwatch: error: give either -p PID or a command after `--`, not both\n");
    return 2;
  }
  if (!opts.user.empty()) {
    if (opts.command.empty()) {
      std::fprintf(stderr, "kwatch: error: -u USER applies to a command given after `--`\n");
      return 2;
    }
    absl::StatusOr<core::ptrace::RunAs> as = core::ptrace::ResolveUser(opts.user);
    if (!as.ok()) {
      Error(as.status());
      return 2;
    }
    opts.run_as = *std::move(as);
  }
  if (!opts.command.empty()) {
    // The command shares kwatch's stdout: write whole lines, so that its output never lands
    // inside one of kwatch's lines.
    std::setvbuf(stdout, nullptr, _IOLBF, 1 << 16);
  }
  if (opts.follow_forks) {
    const char* why = nullptr;
    if (!opts.pid.has_value() && opts.command.empty()) {
      why = "kernel watches have no process to follow";
    } else if (opts.kernel_accesses) {
      why =
          "--kernel-accesses watches one process's memory from the kernel side; its forks "
          "are not followed yet";
    } else if (opts.overcommit == "multiplex") {
      why =
          "with --overcommit=multiplex each process would rotate its own registers, and the "
          "summary's coverage and scaled estimates describe one process: use "
          "--overcommit=pages (exact) with -f";
    }
    if (why != nullptr) {
      std::fprintf(stderr, "kwatch: error: -f/--follow-forks: %s\n", why);
      return 2;
    }
  }
  if ((!opts.at.empty() || !opts.until.empty()) && opts.in.empty()) {
    std::fprintf(stderr, "kwatch: error: %s SPEC goes with --in FUNC (the call it is in)\n",
                 opts.at.empty() ? "--until" : "--at");
    return 2;
  }
  if (!opts.in.empty()) {
    const char* why = nullptr;
    if (!opts.pid.has_value() && opts.command.empty()) {
      why =
          "kernel watches have no calls of a program to follow (give -p PID or a command "
          "after `--`)";
    } else if (opts.kernel_accesses) {
      why = "--kernel-accesses watches a whole process's memory from the kernel side";
    } else if (opts.exec) {
      why = "--exec watches code; --in watches the data of each call (--write, --rw, --read)";
    } else if (opts.follow_forks) {
      why = "with -f, each child would need the function's probes of its own: not supported yet";
    } else if (!opts.arm_at.empty()) {
      why = "each call arms its own watches: --arm-at has nothing left to arm";
    } else if (opts.follow) {
      why =
          "each call's object is looked up at the call: its pointers are not followed "
          "afterwards (--follow) yet";
    } else if (opts.backend == "page") {
      why =
          "a watch per call takes the debug registers of the calling thread; page protection "
          "would stop every thread on the page (--backend perf or --stop)";
    }
    if (why != nullptr) {
      std::fprintf(stderr, "kwatch: error: --in: %s\n", why);
      return 2;
    }
  }
  if (!opts.arm_at.empty()) {
    const char* why = nullptr;
    if (!opts.pid.has_value() && opts.command.empty()) {
      why =
          "kernel watches are armed at once, on every CPU: there is no program of yours to "
          "stop at a point (give -p PID or a command after `--`)";
    } else if (opts.kernel_accesses) {
      why = "--kernel-accesses is armed at once; it does not take a point yet";
    } else if (opts.follow_forks) {
      why = "with -f, the point would have to be planted in each child: not supported yet";
    }
    if (why != nullptr) {
      std::fprintf(stderr, "kwatch: error: --arm-at: %s\n", why);
      return 2;
    }
  }
  if (opts.follow) {
    const char* why = nullptr;
    if (!opts.pid.has_value() && opts.command.empty()) {
      why =
          "kernel watches are CPU-wide perf breakpoints that never stop the writer, so a watch "
          "could not move before the kernel writes the new object; watch the kernel variable "
          "where it is";
    } else if (opts.kernel_accesses) {
      why = "--kernel-accesses watches memory from the kernel side, where no write is stopped";
    } else if (opts.exec) {
      why = "--exec watches code, which has no pointers to follow";
    } else if (opts.follow_forks) {
      why = "with -f each child would follow its own pointers: not supported yet";
    } else if (!opts.output.empty()) {
      why =
          "a recording (-o) holds one address per watch, and a followed watch moves: not "
          "supported yet (--json keeps every move)";
    } else if (opts.overcommit == "multiplex") {
      why = "a pointer watch that takes turns would miss the writes that move the watch";
    }
    if (why != nullptr) {
      std::fprintf(stderr, "kwatch: error: --follow: %s\n", why);
      return 2;
    }
  }
  if (!opts.pid.has_value() && opts.command.empty()) {
    if (opts.kernel_accesses) {
      std::fprintf(stderr,
                   "kwatch: error: --kernel-accesses watches a process's memory: give -p PID "
                   "or a command after `--`\n");
      return 2;
    }
    return KernelMain(opts);
  }
  if (opts.kernel_accesses) {
    if (opts.read || opts.exec) {
      std::fprintf(stderr, "kwatch: error: --kernel-accesses takes --write or --rw\n");
      return 2;
    }
    return KernelAccessesMain(opts);
  }
  if (!opts.system_map.empty() || !opts.vmlinux.empty() || !opts.kernel_type.empty() ||
      !opts.kcore.empty() || !opts.via.empty() || opts.values_at_drain) {
    std::fprintf(stderr,
                 "kwatch: error: --system-map, --vmlinux, --type, --via, --values-at-drain and "
                 "--kcore are for kernel watches (no -p and no command)\n");
    return 2;
  }
  if (opts.read) {
    std::fprintf(stderr,
                 "kwatch: note: x86 has no read-only watchpoint; watching read-write and "
                 "filtering writes out in software\n");
  }
  if (opts.pid.has_value()) {
    // A process another kwatch traces: this one joins its session.
    if (const std::optional<KwatchTracer> tracer = TracingKwatch(*opts.pid);
        tracer.has_value() && tracer->pid != ::getpid()) {
      if (!opts.in.empty()) {
        std::fprintf(stderr,
                     "kwatch: error: --in: pid %d is watched by kwatch %d already; a watch per "
                     "call cannot join its session yet (end that session first)\n",
                     *opts.pid, tracer->pid);
        return 2;
      }
      if (opts.follow) {
        std::fprintf(stderr,
                     "kwatch: error: --follow: pid %d is watched by kwatch %d already, and a "
                     "watch that joins its session cannot follow pointers yet\n",
                     *opts.pid, tracer->pid);
        return 2;
      }
      if (!opts.arm_at.empty()) {
        std::fprintf(stderr,
                     "kwatch: error: --arm-at: pid %d is watched by kwatch %d already; joining "
                     "its session arms at once (run without --arm-at, or end that session)\n",
                     *opts.pid, tracer->pid);
        return 2;
      }
      absl::StatusOr<int> joined = JoinWatch(opts, *tracer);
      if (!joined.ok()) {
        Error(joined.status());
        return 1;
      }
      return *joined;
    }
  }
  auto code = RunWatch(opts);
  if (!code.ok()) {
    Error(code.status());
    return 1;
  }
  return *code;
}

}  // namespace kwatch::cli
