#include "cli/gdbserver_cmd.h"

#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cli/join_client.h"
#include "cli/join_server.h"
#include "cli/join_socket.h"
#include "cli/output.h"
#include "core/base/target_files.h"
#include "watch/gdb/run.h"
#include "watch/gdb/server.h"
#include "watch/session.h"
#include "watch/target_set.h"

namespace kwatch::cli {

namespace {

void SayLine(const std::string& line) {
  std::fprintf(stderr, "kwatch: %s\n", line.c_str());
  std::fflush(stderr);
}

}  // namespace

int GdbServerMain(const std::vector<std::string>& args) {
  std::vector<std::string> own;
  watch::gdb::GdbServerOptions opts;
  bool have_dashdash = false;
  for (const std::string& a : args) {
    if (!have_dashdash && a == "--") {
      have_dashdash = true;
      continue;
    }
    (have_dashdash ? opts.command : own).push_back(a);
  }
  bool rw = false;
  bool read = false;
  bool write = false;
  std::optional<uint64_t> len;
  std::vector<std::string> exprs;
  std::optional<pid_t> pid;
  std::string backend = "auto";
  std::string overcommit = "pages";
  bool json = false;
  bool quiet = false;
  CLI::App app{
      "kwatch gdbserver: serve gdb's remote protocol over a process, with kwatch's own watches\n"
      "in the same session. gdb's breakpoints go through kwatch's INT3 engine, its hardware\n"
      "watchpoints through drmgr at debugger priority; kwatch's traps are never shown to gdb.\n\n"
      "  kwatch gdbserver --listen :2345 -- ./prog ARGS       then in gdb: target remote :2345\n"
      "  gdb -ex 'target remote | kwatch gdbserver --stdio -- ./prog' ./prog\n"
      "  kwatch gdbserver --listen localhost:2345 --write g_stats.hits -p PID",
      "kwatch gdbserver"};
  auto* listen = app.add_option("--listen", opts.listen,
                                "Wait for gdb on HOST:PORT (TCP; :PORT for every address, :0 for "
                                "a free port)");
  auto* stdio = app.add_flag("--stdio", opts.stdio,
                             "Talk to gdb on stdin/stdout (`target remote | kwatch gdbserver "
                             "--stdio ...`); a launched program's stdout goes to stderr");
  listen->excludes(stdio);
  auto* w = app.add_flag("-w,--write", write, "kwatch watches: report writes (default)");
  auto* a = app.add_flag("-a,--rw", rw, "kwatch watches: report reads and writes");
  auto* r = app.add_flag("-r,--read", read,
                         "kwatch watches: report reads (read-write in hardware, writes filtered)");
  w->excludes(a, r);
  a->excludes(r);
  app.add_option("--len", len, "Watch this many bytes (1, 2, 4, 8) instead of the type's size")
      ->check(CLI::IsMember({1, 2, 4, 8}));
  app.add_option("expr", exprs, "What kwatch watches meanwhile (none: gdb alone)");
  app.add_option("-p,--pid", pid, "Attach to a running process")->check(CLI::PositiveNumber);
  app.add_option("--backend", backend,
                 "kwatch watches: perf (hardware breakpoints, stream mode) or auto (the same); "
                 "page and stop modes intercept the signals gdb's steps see, not supported here")
      ->check(CLI::IsMember({"auto", "perf"}))
      ->capture_default_str();
  app.add_option("--overcommit", overcommit,
                 "kwatch watches beyond the debug registers, or when gdb's hardware "
                 "points take theirs (debugger priority): pages (page protection, exact counts; "
                 "an execute watch, or one whose page holds data gdb watches, takes turns "
                 "instead), multiplex (take turns, counts scaled by coverage) or fail (wait, "
                 "counting nothing)")
      ->check(CLI::IsMember({"pages", "fail", "multiplex"}))
      ->capture_default_str();
  app.add_flag("--json", json, "kwatch's events as JSON lines");
  app.add_flag("-q,--quiet", quiet, "No live events, only the summary");
  app.footer(
      "Supported: qSupported, target description (amd64), threads, registers, memory, continue\n"
      "and step (all-stop), Z0-Z4, watch/rwatch/awatch stop reasons, shared libraries\n"
      "(libraries-svr4, auxv), detach, kill. See docs/gdbserver.md.\n"
      "A process another kwatch session traces is refused with what can join it: gdbserver\n"
      "cannot join a kwatch session yet (`kwatch --write EXPR -p PID` and `kwatch probe SPEC\n"
      "-p PID` can; both join this session too).");
  std::vector<std::string> reversed(own.rbegin(), own.rend());
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (opts.listen.empty() && !opts.stdio) {
    std::fprintf(stderr, "kwatch gdbserver: error: give --listen HOST:PORT or --stdio\n%s",
                 app.help().c_str());
    return 2;
  }
  if (pid.has_value() == !opts.command.empty()) {
    std::fprintf(stderr, "kwatch gdbserver: error: give either -p PID or a command after `--`\n");
    return 2;
  }
  if (pid.has_value()) {
    if (const std::optional<KwatchTracer> tracer = TracingKwatch(*pid); tracer.has_value()) {
      std::fprintf(
          stderr, "kwatch gdbserver: error: %s\n",
          std::string{CannotJoinYet("`kwatch gdbserver`", *pid, *tracer).message()}.c_str());
      return 1;
    }
  }
  opts.pid = pid;
  opts.launch.kill_on_exit = true;
  drmgr::DrKind kind = rw || read ? drmgr::DrKind::kReadWrite : drmgr::DrKind::kWrite;
  for (const std::string& e : exprs) {
    watch::WatchRequest req;
    req.expr = e;
    req.kind = kind;
    req.reads_only = read;
    req.length = len;
    opts.requests.push_back(std::move(req));
  }
  opts.session.backend = watch::BackendKind::kPerf;
  opts.session.overcommit = overcommit == "multiplex" ? watch::Overcommit::kMultiplex
                            : overcommit == "fail"    ? watch::Overcommit::kFail
                                                      : watch::Overcommit::kPages;
  opts.session.hardware_asked = overcommit == "fail";
  opts.session.debugger_shares = true;
  opts.say = SayLine;
  opts.command_line = "kwatch gdbserver";
  for (const std::string& arg : args) {
    absl::StrAppend(&opts.command_line, " ", arg);
  }
  std::unique_ptr<AccessPrinter> printer;
  if (json) {
    printer = std::make_unique<AccessJsonPrinter>(stdout, quiet);
  } else {
    printer = std::make_unique<AccessTextPrinter>(stdout, quiet);
  }
  // A second kwatch on the process joins this session (cli/join_server.h), as with `kwatch`.
  std::unique_ptr<JoinServer> joins;
  opts.armed = [&printer, &joins](watch::TargetSet& set) {
    watch::WatchSession& session = set.first_session();
    printer->Start(session, set.start_ns(), set.target_process().pid());
    if (absl::StatusOr<std::unique_ptr<JoinServer>> j =
            JoinServer::Listen(set.target_process().pid());
        j.ok()) {
      joins = *std::move(j);
      set.SetGuests(joins.get());
    } else {
      SayLine(absl::StrCat("note: no other kwatch can join this session: ", j.status().message()));
    }
    for (const watch::Watch& wt : session.watches()) {
      SayLine(absl::StrCat("  watch #", wt.id + 1, " ", wt.target.display, ": ",
                           session.placement(wt.id).detail));
    }
  };
  // A joining `kwatch probe` places its probes in the engine of gdb's breakpoints.
  opts.serving = [&joins](watch::gdb::GdbServer* server) {
    if (joins != nullptr) {
      joins->ShareEngine(server != nullptr ? server->engine() : nullptr);
    }
  };
  absl::StatusOr<int> code = watch::gdb::RunGdbServer(std::move(opts), printer.get());
  std::fflush(stdout);
  if (!code.ok()) {
    std::fprintf(stderr, "kwatch gdbserver: error: %s\n",
                 std::string{code.status().message()}.c_str());
    return 1;
  }
  return *code;
}

}  // namespace kwatch::cli
