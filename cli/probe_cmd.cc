#include "cli/probe_cmd.h"

#include <pthread.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "cli/join_socket.h"
#include "cli/probe_join.h"
#include "cli/probe_run.h"
#include "core/base/status_macros.h"
#include "core/base/unique_fd.h"
#include "core/probe/probe_spec.h"
#include "core/probe/probe_target.h"
#include "version/version.h"
#include "watch/event_loop.h"
#include "watch/probe/aggregation.h"
#include "watch/probe/dry_run.h"
#include "watch/probe/hit_filter.h"
#include "watch/probe/probe_set.h"

namespace kwatch::cli {

namespace {

void PrintError(const absl::Status& s) {
  std::fprintf(stderr, "kwatch: error: %s\n", std::string{s.message()}.c_str());
}

// argv as a user would retype it in a shell.
std::string CommandLine(const std::vector<std::string>& args) {
  std::string out = "kwatch probe";
  for (const std::string& a : args) {
    out += ' ';
    if (!a.empty() && a.find_first_of(" \t'\"$\\;*?") == std::string::npos) {
      out += a;
      continue;
    }
    out += '\'';
    for (char c : a) {
      out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    }
    out += '\'';
  }
  return out;
}

// -F: the functions of `file` matching `glob`, one per line, as perf probe --funcs lists them.
// Returns kwatch's exit status.
int ListFunctions(const std::string& file, const std::string& glob) {
  absl::StatusOr<std::unique_ptr<core::probe::ProbeTarget>> target =
      core::probe::ProbeTarget::Open(file);
  if (!target.ok()) {
    PrintError(target.status());
    return 2;
  }
  const std::vector<std::string> names = (*target)->FunctionNames(glob);
  if (names.empty()) {
    std::fprintf(stderr, "kwatch: error: no function of %s matches '%s'\n", file.c_str(),
                 glob.c_str());
    return 1;
  }
  for (const std::string& name : names) {
    std::printf("%s\n", name.c_str());
  }
  return 0;
}

// -L and -V: the lines or the variables of `what` in `file`, listed as perf probe does.
// Returns kwatch's exit status.
int List(const std::string& file, const std::string& what, bool lines) {
  absl::StatusOr<core::probe::ProbePoint> point = core::probe::ParseProbePoint(what);
  if (!point.ok()) {
    PrintError(point.status());
    return 2;
  }
  absl::StatusOr<std::unique_ptr<core::probe::ProbeTarget>> target =
      core::probe::ProbeTarget::Open(file);
  absl::Status listed = target.status();
  if (target.ok() && lines) {
    absl::StatusOr<std::vector<core::probe::LineListing>> listings = (*target)->ListLines(*point);
    listed = listings.status();
    for (const core::probe::LineListing& l :
         listings.value_or(std::vector<core::probe::LineListing>{})) {
      std::fputs(core::probe::FormatLineListing(l).c_str(), stdout);
      if (!l.have_source) {
        std::fprintf(stderr, "kwatch: note: source of %s not found; lines listed without text\n",
                     l.file.c_str());
      }
    }
  } else if (target.ok()) {
    absl::StatusOr<std::vector<core::probe::VarListing>> listings = (*target)->ListVars(*point);
    listed = listings.status();
    if (listings.ok()) {
      std::fputs(core::probe::FormatVarListing(what, *listings).c_str(), stdout);
    }
  }
  if (!listed.ok()) {
    PrintError(listed);
    return 1;
  }
  return 0;
}

absl::StatusOr<int> RunProbes(ProbeCmdOptions& opts, const std::string& file) {
  KW_ASSIGN_OR_RETURN(
      watch::probe::ProbeSet set,
      watch::probe::ResolveProbes(file, opts.specs, watch::probe::NamesToFetch(opts.aggs)));
  if (opts.dry_run) {
    // What a session would refuse is refused here too, before the plan.
    KW_RETURN_IF_ERROR(watch::probe::HitFilter::Make(set.probes, opts.filter).status());
    if (!opts.aggs.empty()) {
      KW_RETURN_IF_ERROR(watch::probe::Aggregator::Make(set.probes, opts.aggs).status());
    }
    watch::probe::DryRunOptions dro;
    dro.backend = opts.hw ? "hw" : opts.backend;
    dro.allow_jump = !opts.no_jump;
    const std::vector<watch::probe::ProbePlan> plans = watch::probe::PlanProbes(set, dro);
    std::fputs(opts.json ? watch::probe::PlansJson(plans).c_str()
                         : watch::probe::PlansText(set, plans, dro).c_str(),
               stdout);
    return 0;
  }
  // Signals arrive through a signalfd, in order with the target's events
  // (watch/event_loop.h); the session owns it. A launched target starts with every signal
  // unblocked (core/process.cc). SIGPIPE is blocked too: a closed stdout shows as a write
  // error, and kwatch cleans up instead of dying.
  KW_ASSIGN_OR_RETURN(core::UniqueFd sigfd, watch::BlockSessionSignals());
  sigset_t pipe;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
  return RunProbeSession(opts, set, std::move(sigfd));
}

}  // namespace

int ProbeMain(const std::vector<std::string>& argv) {
  ProbeCmdOptions opts;
  opts.session.command_line = CommandLine(argv);
  std::vector<std::string> args;
  bool have_dashdash = false;
  for (const std::string& a : argv) {
    if (!have_dashdash && a == "--") {
      have_dashdash = true;
      continue;
    }
    (have_dashdash ? opts.session.command : args).push_back(a);
  }

  CLI::App app{
      "kwatch probe: dynamic probes on a user program, in perf-probe syntax.\n\n"
      "  kwatch probe 'tick i r->len' 'tick%return $retval' -- ./prog ARGS\n"
      "  kwatch probe -p PID 'handle_request req->len:u32'\n"
      "  kwatch probe -x ./prog -L tick          lines of tick that can be probed\n"
      "  kwatch probe -x ./prog -V tick:2        variables available at tick's line +2\n"
      "  kwatch probe -x ./prog -F 'ti*'         functions that can be probed\n\n"
      "SPEC: [EVENT=]FUNC[@SRC][+OFF|%return|:RELLINE|;PATTERN] | SRC:LINE | 0xADDR, then\n"
      "arguments: VAR, VAR->field, VAR.field, %REG, @SYM, @0xADDR, $stackN, $retval, $comm,\n"
      "$params, $vars, +OFF(ARG), NAME=ARG, ARG:TYPE (u8..u64 s8..s64 x8..x64 string),\n"
      "then optionally `if COND`: C over the arguments by name, DWARF variables, $retval,\n"
      "tid, pid, cpu, comm (`comm == \"prog\"`): 'compute x if x % 100 == 0'.\n"
      "A spec with arguments is one shell word: quote it.",
      "kwatch probe"};
  app.set_version_flag("--version", "kwatch " + version::Full());
  app.add_option("spec", opts.specs, "Probes: POINT [ARG...] each (quoted)");
  app.add_option("-a,--add", opts.specs, "Add a probe (same as a positional SPEC)");
  app.add_option("-x,--exec", opts.binary,
                 "ELF file the specs refer to: the program or a shared library it loads "
                 "(default: the command after --, or the program of -p PID)");
  app.add_option("--root", opts.root,
                 "Read -x from the filesystem rooted at DIR (a container's image or "
                 "/proc/PID/root): -x /usr/bin/app --root DIR opens DIR/usr/bin/app. With -p, "
                 "-x is read from the process's filesystem without it")
      ->check(CLI::ExistingDirectory);
  app.add_option("-p,--pid", opts.session.pid, "Attach to a running process")
      ->check(CLI::PositiveNumber);
  std::string user;
  app.add_option("-u,--user", user,
                 "Run the command as USER (name or uid, with its groups), as strace -u; needs "
                 "root");
  auto* lines = app.add_option("-L,--line", opts.list_lines,
                               "List the source lines of FUNC[@SRC] that can be probed "
                               "(FUNC:RELLINE names them), as perf probe -L");
  auto* vars = app.add_option("-V,--vars", opts.list_vars,
                              "List the variables available at a probe point (FUNC, "
                              "FUNC:RELLINE, SRC:LINE...), as perf probe -V");
  lines->excludes(vars);
  auto* funcs_option =
      app.add_option("-F,--funcs", opts.funcs_glob,
                     "List the functions of the program (or of -x FILE) that can be probed, as "
                     "perf probe --funcs; GLOB filters them (fnmatch; a leading ! excludes; "
                     "default !_*)")
          ->expected(0, 1)
          ->type_name("[GLOB]");
  funcs_option->excludes(lines)->excludes(vars);
  std::vector<std::string> counts;
  std::vector<std::string> skips;
  app.add_option("-c,--count", counts,
                 "N: stop after N hits (all probes together); EVENT:N: take N hits of probe "
                 "EVENT, then none (the session ends when every probe has reached its count)")
      ->allow_extra_args(false)
      ->type_name("N|EVENT:N");
  app.add_option("--skip", skips,
                 "Ignore the first N hits of each probe that pass its condition (EVENT:N: of "
                 "probe EVENT), as gdb's ignore count")
      ->allow_extra_args(false)
      ->type_name("N|EVENT:N");
  app.add_option("-d,--duration", opts.session.duration, "Stop after SECS seconds")
      ->check(CLI::PositiveNumber);
  std::vector<std::string> aggs;
  app.add_option("--agg", aggs,
                 "Aggregate the hits taken: count(), sum(X), min(X), max(X), avg(X), hist(X) "
                 "(power-of-two buckets), lhist(X, MIN, MAX, STEP), optionally `by KEY[,KEY]` "
                 "(tid, pid, cpu, comm, ustack, an argument); X an argument, a register, tid, "
                 "pid, cpu, or $duration on a %return probe (ns since the call's entry); EVENT: "
                 "first applies it to one probe. Printed at the end (JSON: "
                 "{\"type\":\"aggregate\"} lines), recorded with -o")
      ->allow_extra_args(false)
      ->type_name("[EVENT:]FUNC(X) [by KEY]");
  app.add_option("--interval", opts.interval,
                 "Print the aggregations every SECS seconds too (they keep accumulating)")
      ->check(CLI::PositiveNumber);
  bool stack = false;
  app.add_flag("--stack", stack,
               "Print the user stack of each hit, symbolized with file:line (unwound with the "
               "program's CFI: at the stop with ptrace and --hw, from a copy of the stack taken "
               "at the hit by the agent and the uprobe sample); `--agg 'count() by ustack'` "
               "counts the distinct stacks");
  app.add_option("--stack-depth", opts.session.stack_frames, "Frames per --stack (default 16)")
      ->check(CLI::Range(1, 256));
  app.add_flag("--stop-on", opts.filter.stop_on,
               "At the first hit that passes its probe's condition (after --skip): remove the "
               "probes, leave the target stopped (SIGSTOP) and detached with that thread at the "
               "probe (an entry: before the probed instruction; a return: just back in the "
               "caller), and print how to take over with gdb -p PID (ptrace backend)");
  app.add_flag("--dry-run", opts.dry_run,
               "Print where each probe would go, the path it would take (jump, int3, ptrace, "
               "uprobe, hw) and how each argument would be fetched, from the file alone: no "
               "target is started or touched (with -p, only its program is read)");
  app.add_flag("-q,--quiet", opts.session.quiet, "Print no hit lines, only the summary");
  app.add_flag("--json", opts.json, R"(JSON lines: one {"type":"hit"} per hit, then a summary)");
  app.add_option("-o,--output", opts.output,
                 "Record probes and hits to FILE (SQLite; read it with `kwatch report FILE`)");
  app.add_option("--backend", opts.backend,
                 "agent: probes run inside the target by kwatch's agent (a jmp to a trampoline "
                 "where the code allows, else INT3; no stop per hit; the agent restores the "
                 "code if kwatch dies); auto: the agent where it loads, else ptrace, saying why; "
                 "ptrace: INT3 probes run by kwatch (a stop per hit); uprobe: the kernel's "
                 "uprobe PMU (arguments only from registers and the sampled stack; without -p "
                 "or a command it probes every process running -x FILE)")
      ->check(CLI::IsMember({"auto", "agent", "ptrace", "uprobe"}))
      ->capture_default_str();
  app.add_flag("--no-jump", opts.no_jump,
               "agent: every probe through INT3, none through a jump to a trampoline");
  app.add_option("--maxactive", opts.session.maxactive,
                 "Return probes (ptrace): calls tracked at once; more count as nmissed "
                 "(default 256)");
  app.add_option("--stack-bytes", opts.session.stack_bytes,
                 "uprobe: bytes of user stack sampled per hit, from %sp up; with --stack, the "
                 "bytes the agent and the uprobe sample copy for unwinding (at least 8192)")
      ->check(CLI::Range(8, 65528))
      ->capture_default_str();
  app.add_option("--ring-pages", opts.session.ring_pages,
                 "uprobe: pages (4 KiB) of each per-CPU sample ring, per probe, a power of two; "
                 "samples beyond a full ring are dropped and counted as lost")
      ->check([](const std::string& v) -> std::string {
        uint32_t n = 0;
        if (!absl::SimpleAtoi(v, &n) || n == 0 || (n & (n - 1)) != 0 || n > (1U << 20)) {
          return "a power of two from 1 to 1048576";
        }
        return "";
      })
      ->capture_default_str();
  app.add_flag(
      "-f,--follow-forks", opts.session.follow_forks,
      "Probe the children the target forks too, as strace -f; their hits carry their "
      "pid. Without -f a child gets the original code back and runs unprobed. After an "
      "exec the ptrace backend probes the new image again, the agent does not (so -f with the "
      "default backend uses ptrace; --backend agent -f asks for the agent)");
  app.add_flag("--hw", opts.hw,
               "Probe with execute breakpoints in the debug registers (DR0-DR3, through "
               "ptrace) instead of INT3: the program's code is never modified. At most 4 "
               "probed addresses (fewer when a debugger or another tool holds registers); no "
               "%return probes; ptrace backend only (docs/probe-hw.md)");
  app.add_flag("--kill-on-exit", opts.session.kill_on_exit,
               "Kill a launched target when kwatch stops before it ends (default: remove the "
               "probes and leave it running)");
  app.footer(
      "Output: TIME(s) TID EVENT LOCATION ARGS per hit, then a summary per probe (hits, misses,\n"
      "nmissed for return probes, top argument values). kwatch exits with the launched\n"
      "command's exit status. SIGINT/SIGTERM/SIGHUP remove the probes and detach; if kwatch\n"
      "is killed outright, a guardian process puts the original code back.\n"
      "Permissions: ptrace needs the right to trace the target (same user and\n"
      "kernel.yama.ptrace_scope <= 1 for children, 0 for -p, or CAP_SYS_PTRACE); the uprobe\n"
      "backend needs root (CAP_SYS_ADMIN; CAP_PERFMON on older kernels), whatever\n"
      "kernel.perf_event_paranoid says.\n"
      "Joining: -p PID on a process another kwatch session of the same user traces (`kwatch\n"
      "--write EXPR -p PID`, `kwatch gdbserver` with watches) joins that session: its INT3\n"
      "engine runs the probes (ptrace path) and sends the hits, printed here as usual; they\n"
      "come out when this kwatch ends or is killed. --hw, --backend agent/uprobe, --no-jump,\n"
      "-f and --stop-on do not join yet (docs/gdbserver.md, \"A kwatch probe that joins\").");

  std::vector<std::string> reversed(args.rbegin(), args.rend());
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;  // --help, --version: 0; a usage error: 2
  }
  for (const std::string& c : counts) {
    absl::Status parsed = absl::OkStatus();
    if (!absl::StrContains(c, ':')) {
      if (!absl::SimpleAtoi(c, &opts.session.count)) {
        parsed = absl::InvalidArgumentError(
            absl::StrCat("-c '", c, "': expected N or EVENT:N (N a whole number)"));
      }
    } else {
      parsed = watch::probe::ParsePerProbeCount(c, "-c", opts.filter.count);
    }
    if (!parsed.ok()) {
      PrintError(parsed);
      return 2;
    }
  }
  for (const std::string& text : aggs) {
    absl::StatusOr<watch::probe::AggregationSpec> agg = watch::probe::ParseAggregation(text);
    if (!agg.ok()) {
      PrintError(agg.status());
      return 2;
    }
    opts.aggs.push_back(*std::move(agg));
  }
  // --stack shows each hit's stack; 'by ustack' needs them captured too.
  opts.show_stack = stack;
  if ((stack || watch::probe::UsesStacks(opts.aggs)) && opts.session.stack_frames == 0) {
    opts.session.stack_frames = 16;
  } else if (!stack && !watch::probe::UsesStacks(opts.aggs)) {
    opts.session.stack_frames = 0;  // --stack-depth alone captures nothing
  }
  if (opts.interval > 0 && opts.aggs.empty()) {
    std::fprintf(stderr, "kwatch: error: --interval prints aggregations: give --agg too\n");
    return 2;
  }
  for (const std::string& skip : skips) {
    if (absl::Status parsed = watch::probe::ParsePerProbeCount(skip, "--skip", opts.filter.skip);
        !parsed.ok()) {
      PrintError(parsed);
      return 2;
    }
  }
  if (opts.session.pid.has_value() && !opts.session.command.empty()) {
    std::fprintf(stderr, "kwatch: error: give either -p PID or a command after `--`, not both\n");
    return 2;
  }
  if (opts.hw && opts.backend == "uprobe") {
    std::fprintf(stderr,
                 "kwatch: error: --hw and --backend uprobe exclude each other: the uprobe PMU "
                 "is the kernel's own INT3 breakpoint in the file's code, while --hw places "
                 "execute breakpoints in the debug registers of the threads kwatch traces "
                 "(ptrace); drop one of them\n");
    return 2;
  }
  if (opts.hw && opts.backend == "agent") {
    std::fprintf(stderr,
                 "kwatch: error: --hw and --backend agent exclude each other: the agent patches "
                 "the code (a jmp or an INT3), --hw leaves it alone and uses the debug "
                 "registers; drop one of them\n");
    return 2;
  }
  if (opts.no_jump && (opts.hw || opts.backend == "ptrace" || opts.backend == "uprobe")) {
    std::fprintf(stderr,
                 "kwatch: error: --no-jump is for the agent backend (--backend agent or auto)\n");
    return 2;
  }
  if (opts.filter.stop_on) {
    const char* why = opts.hw                     ? "--hw"
                      : opts.session.follow_forks ? "-f"
                      : opts.backend == "agent"   ? "--backend agent"
                      : opts.backend == "uprobe"  ? "--backend uprobe"
                                                  : nullptr;
    if (why != nullptr) {
      std::fprintf(stderr,
                   "kwatch: error: --stop-on leaves the thread of its hit stopped at the probe, "
                   "which the ptrace backend does (the thread is stopped there); drop %s\n",
                   why);
      return 2;
    }
    opts.session.stop_on = true;
  }
  if (opts.hw && opts.session.follow_forks) {
    std::fprintf(stderr,
                 "kwatch: error: --hw does not follow forks yet: a child starts with no debug "
                 "registers, and kwatch clears the copy of DR7 it inherits; drop -f (children "
                 "then run unprobed) or --hw\n");
    return 2;
  }
  const bool funcs = funcs_option->count() > 0;
  const bool listing = !opts.list_lines.empty() || !opts.list_vars.empty() || funcs;
  if (listing && !opts.specs.empty()) {
    std::fprintf(stderr, "kwatch: error: -L, -V and -F list; they take no probe specs\n");
    return 2;
  }
  if (!listing && opts.specs.empty()) {
    std::fprintf(stderr,
                 "kwatch: error: nothing to probe: give a spec, e.g. `kwatch probe 'tick i' -- "
                 "./prog`\n%s",
                 app.help().c_str());
    return 2;
  }
  if (!opts.session.command.empty()) {
    // The command shares kwatch's stdout: write whole lines, so that its output never lands
    // inside one of kwatch's lines.
    std::setvbuf(stdout, nullptr, _IOLBF, 1 << 16);
  }
  if (!user.empty()) {
    if (opts.session.command.empty()) {
      std::fprintf(stderr, "kwatch: error: -u USER applies to a command given after `--`\n");
      return 2;
    }
    absl::StatusOr<core::ptrace::RunAs> as = core::ptrace::ResolveUser(user);
    if (!as.ok()) {
      PrintError(as.status());
      return 2;
    }
    opts.session.user = *std::move(as);
  }
  if (!listing && !opts.dry_run && !opts.session.pid.has_value() && opts.session.command.empty() &&
      !(opts.backend == "uprobe" && !opts.binary.empty())) {
    std::fprintf(stderr,
                 "kwatch: error: no target: give -p PID or a command after `--` (e.g. `-- ./prog "
                 "args`)%s\n",
                 opts.backend == "uprobe" ? ""
                                          : "; --backend uprobe -x FILE probes every process "
                                            "running FILE");
    return 2;
  }
  absl::StatusOr<std::string> file =
      watch::probe::ProbedFile(opts.binary, opts.root, opts.session.pid, opts.session.command);
  if (!file.ok()) {
    PrintError(file.status());
    return listing ? 2 : 1;
  }
  if (funcs) {
    return ListFunctions(*file, opts.funcs_glob.empty() ? "!_*" : opts.funcs_glob);
  }
  if (!opts.list_lines.empty()) {
    return List(*file, opts.list_lines, /*lines=*/true);
  }
  if (!opts.list_vars.empty()) {
    return List(*file, opts.list_vars, /*lines=*/false);
  }
  if (opts.session.pid.has_value() && opts.backend != "uprobe" && !opts.dry_run) {
    // A process another kwatch session traces: this one joins it (cli/probe_join.h).
    if (const std::optional<KwatchTracer> tracer = TracingKwatch(*opts.session.pid);
        tracer.has_value()) {
      if (const char* what = ProbeOptionThatCannotJoin(opts); what != nullptr) {
        PrintError(absl::FailedPreconditionError(absl::StrCat(
            "pid ", *opts.session.pid, " is traced by another kwatch session (kwatch pid ",
            tracer->pid, "), which this kwatch would join, but ", what,
            " cannot join a session yet; drop it, or end that session first")));
        return 1;
      }
      opts.join = tracer;
    }
  }
  absl::StatusOr<int> code = RunProbes(opts, *file);
  if (!code.ok()) {
    PrintError(code.status());
    return 1;
  }
  return *code;
}

}  // namespace kwatch::cli
