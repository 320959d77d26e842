#include "cli/app.h"

#include <signal.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "cli/output.h"
#include "cli/report_cmd.h"
#include "core/process.h"
#include "core/status_macros.h"
#include "core/syscall_status.h"
#include "core/unique_fd.h"
#include "core/store/trace_writer.h"
#include "watch/profile/storage_profile.h"
#include "watch/recording.h"
#include "watch/session.h"
#include "watch/summary.h"

#ifndef KWATCH_VERSION
#define KWATCH_VERSION "dev"
#endif

namespace kwatch::cli {

namespace {

struct Options {
  bool write = false;
  bool rw = false;
  bool read = false;
  bool exec = false;
  std::optional<uint64_t> len;
  std::vector<std::string> exprs;
  std::optional<pid_t> pid;
  std::vector<std::string> command;
  uint64_t count = 0;
  double duration = 0;
  bool json = false;
  bool quiet = false;
  bool kill_on_exit = false;
  std::string backend = "auto";
  std::string output;        // -o: recording file
  std::string command_line;  // as typed, for the recording
};

uint64_t MonotonicNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ULL + static_cast<uint64_t>(ts.tv_nsec);
}

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
  std::fprintf(stderr, "kwatch: error: %s\n", std::string(s.message()).c_str());
}

// The event loop: drains rings, follows the target, stops on count, duration or a signal.
class Runner {
 public:
  Runner(const Options& opts, core::Process& proc, watch::WatchSession& session, int sigfd,
         core::TraceWriter* writer)
      : opts_(opts),
        proc_(proc),
        session_(session),
        sigfd_(sigfd),
        writer_(writer),
        summary_(session.watches()),
        printer_(stdout, opts.json, 0) {}

  absl::StatusOr<int> Run();

 private:
  absl::Status AddFd(int fd) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (epoll_ctl(epfd_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) {
      const int err = errno;
      return core::SyscallError(err, "epoll_ctl(ADD)");
    }
    return absl::OkStatus();
  }
  void DrainAll();
  // Appends `ev` (and its site, once) to the recording; a failure stops the session.
  void Record(const core::AccessEvent& ev);
  void FlushRecording();
  absl::Status HandleChild();
  void Stop(std::string reason) {
    if (!stopped_) {
      stopped_ = true;
      stop_reason_ = std::move(reason);
    }
  }

  const Options& opts_;
  core::Process& proc_;
  watch::WatchSession& session_;
  int sigfd_;
  core::TraceWriter* writer_;  // -o, or nullptr
  absl::Status record_error_;
  watch::Summary summary_;
  std::optional<watch::StorageProfile> profile_;  // from the start of Run()
  EventPrinter printer_;
  core::UniqueFd epfd_;
  bool stopped_ = false;
  std::string stop_reason_;
  uint64_t delivered_ = 0;
  bool exec_seen_ = false;
};

void Runner::DrainAll() {
  if (stopped_ && opts_.count > 0 && delivered_ >= opts_.count) {
    return;
  }
  session_.Drain([&](const core::AccessEvent& ev) {
    if (opts_.count > 0 && delivered_ >= opts_.count) {
      return;
    }
    ++delivered_;
    summary_.Add(ev);
    profile_->Add(ev);
    Record(ev);
    if (!opts_.quiet) {
      printer_.Print(session_, summary_, ev);
    }
  });
  if (opts_.count > 0 && delivered_ >= opts_.count) {
    Stop(absl::StrCat("--count ", opts_.count, " reached"));
  }
}

void Runner::Record(const core::AccessEvent& ev) {
  if (writer_ == nullptr || !record_error_.ok()) {
    return;
  }
  absl::Status s;
  if (!writer_->HasSite(ev.ip)) {
    s = writer_->AddSite(watch::SiteRecordFor(session_.symbolizer(), ev.ip));
  }
  if (s.ok()) {
    s = writer_->Append(ev);
  }
  if (!s.ok()) {
    record_error_ = s;
    Stop(absl::StrCat("recording failed: ", s.message()));
  }
}

void Runner::FlushRecording() {
  if (writer_ == nullptr || !record_error_.ok()) {
    return;
  }
  if (absl::Status s = writer_->Flush(); !s.ok()) {
    record_error_ = s;
    Stop(absl::StrCat("recording failed: ", s.message()));
  }
}

absl::Status Runner::HandleChild() {
  KW_ASSIGN_OR_RETURN(const std::vector<core::ProcessEvent> events, proc_.Poll());
  for (const auto& e : events) {
    switch (e.kind) {
      case core::ProcessEvent::Kind::kExited:
        Stop(proc_.exit_info()->signaled
                 ? absl::StrCat("target killed by ", sigabbrev_np(proc_.exit_info()->signal))
                 : "target exited");
        break;
      case core::ProcessEvent::Kind::kExec:
        DrainAll();
        session_.Forget();
        exec_seen_ = true;
        std::fprintf(stderr,
                     "kwatch: target %d called exec; the watches of the old image have ended "
                     "(their addresses mean nothing in the new one)\n",
                     proc_.pid());
        KW_RETURN_IF_ERROR(proc_.Resume(e.tid));
        break;
      case core::ProcessEvent::Kind::kGroupStop:
        std::fprintf(stderr, "kwatch: target %d stopped by %s (job control); still watching\n",
                     proc_.pid(), sigabbrev_np(e.signal));
        break;
      default:
        break;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int> Runner::Run() {
  epfd_.Reset(epoll_create1(EPOLL_CLOEXEC));
  if (!epfd_) {
    const int err = errno;
    return core::SyscallError(err, "epoll_create1");
  }
  KW_RETURN_IF_ERROR(AddFd(sigfd_));
  for (int fd : session_.Fds()) {
    KW_RETURN_IF_ERROR(AddFd(fd));
  }
  // A periodic tick drains samples below the wakeup threshold; a deadline for --duration.
  core::UniqueFd tick(timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK));
  itimerspec its{};
  its.it_interval.tv_nsec = 50'000'000;
  its.it_value.tv_nsec = 50'000'000;
  timerfd_settime(tick.get(), 0, &its, nullptr);
  KW_RETURN_IF_ERROR(AddFd(tick.get()));
  const uint64_t start_ns = MonotonicNs();
  const uint64_t deadline_ns =
      opts_.duration > 0 ? start_ns + static_cast<uint64_t>(opts_.duration * 1e9) : 0;
  printer_ = EventPrinter(stdout, opts_.json, start_ns);
  {
    std::vector<watch::WatchedObject> objects;
    for (const watch::Watch& w : session_.watches()) {
      objects.push_back(watch::ObjectForWatch(w));
    }
    watch::ProfileOptions popts;
    popts.start_ns = start_ns;
    profile_.emplace(std::move(objects), popts);
  }
  if (!opts_.quiet) {
    printer_.PrintHeader(session_);
  }

  std::string prog = proc_.argv().empty() ? "?" : proc_.argv()[0];
  if (!session_.backend_note().empty()) {
    std::fprintf(stderr, "kwatch: %s\n", session_.backend_note().c_str());
  }
  std::fprintf(stderr, "kwatch: armed %zu watch%s on pid %d (%s), %s\n", session_.watches().size(),
               session_.watches().size() == 1 ? "" : "es", proc_.pid(), prog.c_str(),
               session_.backend() == watch::BackendKind::kPage ? "page-protection mode"
                                                               : "perf breakpoint stream mode");
  std::fflush(stderr);

  // The target may already have ended (or exec'd) while arming.
  KW_RETURN_IF_ERROR(HandleChild());
  epoll_event evs[64];
  while (!stopped_) {
    const int n = epoll_wait(epfd_.get(), evs, 64, 1000);
    if (n < 0 && errno != EINTR) {
      const int err = errno;
      return core::SyscallError(err, "epoll_wait");
    }
    bool drain = false;
    for (int i = 0; i < n; ++i) {
      if (evs[i].data.fd == sigfd_) {
        signalfd_siginfo si{};
        while (read(sigfd_, &si, sizeof(si)) == sizeof(si)) {
          if (si.ssi_signo == SIGCHLD) {
            drain = true;
            KW_RETURN_IF_ERROR(HandleChild());
          } else {
            Stop(absl::StrCat("interrupted by ", sigabbrev_np(static_cast<int>(si.ssi_signo))));
          }
        }
      } else if (evs[i].data.fd == tick.get()) {
        uint64_t ticks = 0;
        (void)!read(tick.get(), &ticks, sizeof(ticks));
        drain = true;
      } else {
        drain = true;
      }
    }
    if (drain) {
      DrainAll();
      FlushRecording();
    }
    if (deadline_ns != 0 && MonotonicNs() >= deadline_ns) {
      Stop(absl::StrFormat("--duration %gs elapsed", opts_.duration));
    }
    if (proc_.alive()) {
      // SIGCHLD may have been merged with another: poll the target every round.
      KW_RETURN_IF_ERROR(HandleChild());
    }
  }
  DrainAll();
  RunInfo info;
  info.lost = session_.lost();
  info.filtered = session_.filtered();
  info.unrelated = session_.unrelated();
  info.spurious_traps = proc_.spurious_traps();
  info.pid = proc_.pid();
  info.seconds = static_cast<double>(MonotonicNs() - start_ns) / 1e9;
  session_.Disarm();
  info.stop_reason = stop_reason_;
  if (exec_seen_) {
    info.stop_reason += "; the watches ended when the target called exec";
  }
  if (proc_.alive()) {
    if (proc_.launched() && opts_.kill_on_exit) {
      KW_RETURN_IF_ERROR(proc_.Kill());
      info.stop_reason += "; target killed (--kill-on-exit)";
    } else {
      KW_RETURN_IF_ERROR(proc_.Detach());
      std::fprintf(stderr, "kwatch: detached; target %d keeps running\n", proc_.pid());
    }
  }
  info.exit = proc_.exit_info();
  if (writer_ != nullptr && record_error_.ok()) {
    core::SessionEnd end;
    if (info.exit.has_value()) {
      end.exit_status = info.exit->ShellStatus();
    }
    end.exit_reason = info.stop_reason;
    end.lost_count = info.lost;
    if (absl::Status s = writer_->Finish(end); !s.ok()) {
      Error(s);
    } else {
      std::fprintf(stderr, "kwatch: recorded %llu events to %s (kwatch report %s)\n",
                   static_cast<unsigned long long>(writer_->events_committed()),
                   writer_->path().c_str(), writer_->path().c_str());
    }
  } else if (!record_error_.ok()) {
    std::fprintf(stderr,
                 "kwatch: the recording %s holds the events committed before the failure; "
                 "`kwatch report` reads it\n",
                 opts_.output.c_str());
  }
  std::fflush(stdout);
  PrintSummary(stdout, opts_.json, session_, summary_, *profile_, info);
  std::fflush(stdout);
  if (proc_.launched() && info.exit.has_value()) {
    return info.exit->ShellStatus();
  }
  return 0;
}

absl::StatusOr<int> RunWatch(const Options& opts) {
  // Signals arrive through a signalfd, so the loop sees them in order with everything else.
  sigset_t mask;
  sigemptyset(&mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGCHLD}) {
    sigaddset(&mask, sig);
  }
  sigprocmask(SIG_BLOCK, &mask, nullptr);
  core::UniqueFd sigfd(signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK));
  if (!sigfd) {
    const int err = errno;
    return core::SyscallError(err, "signalfd");
  }

  std::unique_ptr<core::Process> proc;
  if (opts.pid.has_value()) {
    KW_ASSIGN_OR_RETURN(proc, core::Process::Attach(*opts.pid));
  } else {
    core::LaunchOptions lo;
    lo.kill_on_exit = opts.kill_on_exit;
    KW_ASSIGN_OR_RETURN(proc, core::Process::Launch(opts.command, lo));
    if (absl::Status s = proc->RunToEntry(); !s.ok()) {
      (void)proc->Kill();
      return s;
    }
  }

  std::vector<watch::WatchRequest> requests;
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
    requests.push_back(std::move(r));
  }
  auto fail = [&](absl::Status s) -> absl::Status {
    // A launched target never ran its own code yet: do not leave it behind.
    if (proc->launched()) {
      (void)proc->Kill();
    } else {
      (void)proc->Detach();
    }
    return s;
  };
  watch::SessionOptions so;
  so.backend = opts.backend == "perf"   ? watch::BackendKind::kPerf
               : opts.backend == "page" ? watch::BackendKind::kPage
                                        : watch::BackendKind::kAuto;
  auto session = watch::WatchSession::Create(*proc, std::move(requests), so);
  if (!session.ok()) {
    return fail(session.status());
  }
  if (absl::Status s = (*session)->Arm(); !s.ok()) {
    return fail(s);
  }
  std::unique_ptr<core::TraceWriter> writer;
  if (!opts.output.empty()) {
    core::SessionRecord rec = core::SessionRecordForThisHost();
    rec.command_line = opts.command_line;
    rec.pid = proc->pid();
    rec.kwatch_version = KWATCH_VERSION;
    rec.mode = "watch";
    rec.backend = std::string(watch::BackendName((*session)->backend()));
    auto w = core::TraceWriter::Create(opts.output, rec);
    if (!w.ok()) {
      return fail(w.status());
    }
    for (const watch::Watch& wt : (*session)->watches()) {
      if (absl::Status s = (*w)->AddWatch(watch::WatchRecordFor(wt, (*session)->backend()));
          !s.ok()) {
        return fail(s);
      }
    }
    writer = std::move(*w);
  }
  Runner runner(opts, *proc, **session, sigfd.get(), writer.get());
  auto code = runner.Run();
  if (!code.ok()) {
    return fail(code.status());
  }
  return code;
}

}  // namespace

int Main(int argc, char** argv) {
  if (argc > 1 && absl::string_view(argv[1]) == "report") {
    return ReportMain(std::vector<std::string>(argv + 2, argv + argc));
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
      "  kwatch --rw g_stats -o run.kwdb -- ./prog      record; then `kwatch report run.kwdb`\n\n"
      "Subcommands: `kwatch report FILE` (storage profile of a recording), see --help of each.\n"
      "Expressions: name, &name, name.field, name[3], ptr->field, 0xADDR, 0xADDR:LEN.\n"
      "With hardware breakpoints a watch covers 1, 2, 4 or 8 aligned bytes (one x86 debug\n"
      "register); with page protection (--backend page) any variable or structure, per field.",
      "kwatch"};
  app.set_version_flag("--version", "kwatch " KWATCH_VERSION);
  auto* w = app.add_flag("-w,--write", opts.write, "Report writes (default)");
  auto* a = app.add_flag("-a,--rw", opts.rw, "Report reads and writes (gdb's awatch)");
  auto* r = app.add_flag("-r,--read", opts.read,
                         "Report reads: x86 has no read-only watchpoint, so kwatch watches "
                         "read-write and filters writes out in software");
  auto* x = app.add_flag("-x,--exec", opts.exec, "Report execution of the address");
  w->excludes(a, r, x);
  a->excludes(r, x);
  r->excludes(x);
  app.add_option("--len", opts.len, "Watch this many bytes (1, 2, 4, 8) instead of the type's size")
      ->check(CLI::IsMember({1, 2, 4, 8}));
  app.add_option("expr", opts.exprs, "What to watch (one or more expressions)");
  app.add_option("-p,--pid", opts.pid, "Attach to a running process")->check(CLI::PositiveNumber);
  app.add_option("-c,--count", opts.count, "Stop after N events");
  app.add_option("-d,--duration", opts.duration, "Stop after SECS seconds")
      ->check(CLI::PositiveNumber);
  app.add_option("--backend", opts.backend,
                 "How to watch: perf (hardware breakpoints, stream mode), page (page "
                 "protection, exact values), auto (perf where this machine delivers debug "
                 "traps, else page)")
      ->check(CLI::IsMember({"auto", "perf", "page"}))
      ->capture_default_str();
  app.add_option("-o,--output", opts.output,
                 "Record the session to FILE (SQLite; read it with `kwatch report FILE`)");
  app.add_flag("--json", opts.json, "Print JSON lines: one per event, then a summary object");
  app.add_flag("-q,--quiet", opts.quiet, "Print no live events, only the summary");
  app.add_flag(
      "--kill-on-exit", opts.kill_on_exit,
      "Kill a launched target when kwatch stops before it ends (default: leave it running)");
  app.footer(
      "Permissions: hardware watchpoints need root, or CAP_PERFMON + CAP_SYS_PTRACE, or\n"
      "`sysctl kernel.perf_event_paranoid=1` for your own processes. Everything after `--` is\n"
      "the command to launch; kwatch exits with its exit status.");

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
  if (opts.pid.has_value() == !opts.command.empty()) {
    std::fprintf(stderr, "kwatch: error: %s\n",
                 opts.pid.has_value()
                     ? "give either -p PID or a command after `--`, not both"
                     : "no target: give -p PID or a command after `--` (e.g. `-- ./prog args`)");
    return 2;
  }
  if (opts.read) {
    std::fprintf(stderr,
                 "kwatch: note: x86 has no read-only watchpoint; watching read-write and "
                 "filtering writes out in software\n");
  }
  auto code = RunWatch(opts);
  if (!code.ok()) {
    Error(code.status());
    return 1;
  }
  return *code;
}

}  // namespace kwatch::cli
