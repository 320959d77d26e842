#include "cli/app.h"

#include <signal.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <span>
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
#include "cli/output.h"
#include "cli/report_cmd.h"
#include "cli/slot_registry.h"
#include "core/expr.h"
#include "core/kernel/btf_types.h"
#include "core/kernel/kallsyms.h"
#include "core/kernel/kernel_symbols.h"
#include "core/process.h"
#include "core/status_macros.h"
#include "core/store/trace_writer.h"
#include "core/symbols.h"
#include "core/syscall_status.h"
#include "core/unique_fd.h"
#include "drmgr/debug_regs.h"
#include "watch/condition.h"
#include "watch/perf_breakpoint.h"
#include "watch/perf_util.h"
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
  std::string user;                   // -u: run the command as this user
  std::optional<core::RunAs> run_as;  // resolved from `user`
  std::string backend = "auto";
  bool stop = false;         // --stop: --backend stop
  std::string condition;     // --if EXPR
  bool stack = false;        // --stack
  size_t stack_depth = 16;   // --stack-depth
  std::string overcommit;    // beyond 4 debug registers: "" = pages (processes), fail (kernel)
  int mux_interval_ms = 10;  // --overcommit=multiplex rotation
  std::string output;        // -o: recording file
  std::string command_line;  // as typed, for the recording
  // Kernel watches (no -p and no command):
  std::string system_map;        // --system-map
  std::string vmlinux;           // --vmlinux
  std::string kernel_type;       // --type: the C type of the watched kernel symbol
  bool kernel_accesses = false;  // --kernel-accesses: the kernel's accesses to a process
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
         core::TraceWriter* writer, std::vector<watch::Condition> conditions)
      : opts_(opts),
        proc_(proc),
        session_(session),
        sigfd_(sigfd),
        writer_(writer),
        conditions_(std::move(conditions)),
        summary_(session.watches()),
        printer_(stdout, opts.json, 0) {}

  absl::StatusOr<int> Run();

 private:
  absl::Status AddFd(int fd) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (epoll_ctl(epfd_.get(), EPOLL_CTL_ADD, fd, &ev) != 0 && errno != EEXIST) {
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
  core::TraceWriter* writer_;                 // -o, or nullptr
  std::vector<watch::Condition> conditions_;  // --if, one per watch (by id), or none
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
    if (!conditions_.empty() && !conditions_[ev.watch_id].Matches(ev)) {
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
  // Multiplexed watches rotate through the debug registers at each tick.
  const long tick_ns = session_.multiplexing()
                           ? std::min<long>(50'000'000, opts_.mux_interval_ms * 1'000'000L)
                           : 50'000'000;
  its.it_interval.tv_sec = tick_ns / 1'000'000'000;
  its.it_interval.tv_nsec = tick_ns % 1'000'000'000;
  its.it_value = its.it_interval;
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
  size_t paged = 0;
  for (const watch::Watch& w : session_.watches()) {
    paged += session_.placement(w.id).backend == watch::BackendKind::kPage ? 1 : 0;
  }
  std::string mode = session_.backend() == watch::BackendKind::kPage ? "page-protection mode"
                     : session_.backend() == watch::BackendKind::kStop
                         ? "stop mode (ptrace debug registers)"
                         : "perf breakpoint stream mode";
  if (session_.backend() != watch::BackendKind::kPage && paged > 0) {
    absl::StrAppend(&mode, " (", paged, " with page protection)");
  }
  std::fprintf(stderr, "kwatch: armed %zu watch%s on pid %d (%s), %s\n", session_.watches().size(),
               session_.watches().size() == 1 ? "" : "es", proc_.pid(), prog.c_str(), mode.c_str());
  if (session_.allocator() != nullptr) {
    // drmgr's decisions, one line per watch: split, shared, multiplexed, sent to pages.
    for (const watch::Watch& w : session_.watches()) {
      std::fprintf(stderr, "kwatch:   watch #%u %s: %s\n", w.id + 1, w.target.display.c_str(),
                   session_.placement(w.id).detail.c_str());
    }
    if (const int ext = session_.external_slots(); ext > 0) {
      std::fprintf(stderr,
                   "kwatch: %d debug register%s of pid %d %s held outside kwatch (a debugger's "
                   "hardware watchpoints, or another tool); kwatch uses the rest "
                   "(`kwatch slots -p %d` shows them)\n",
                   ext, ext == 1 ? "" : "s", proc_.pid(), ext == 1 ? "is" : "are", proc_.pid());
    }
  }
  std::fflush(stderr);

  // drmgr's decisions, for `kwatch slots` (refreshed as multiplexing rotates them).
  uint64_t published_ns = 0;
  auto publish = [&](bool force) {
    if (session_.allocator() == nullptr) {
      return;
    }
    const uint64_t now = MonotonicNs();
    if (!force && now - published_ns < 200'000'000) {
      return;
    }
    published_ns = now;
    if (absl::Status s =
            PublishSlots(proc_.pid(), session_.allocator()->Snapshot(), opts_.command_line);
        !s.ok() && force) {
      std::fprintf(stderr, "kwatch: note: `kwatch slots` will not see this session: %s\n",
                   std::string(s.message()).c_str());
    }
  };
  absl::Cleanup unpublish = [] { UnpublishSlots(); };
  publish(true);

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
        if (session_.multiplexing()) {
          KW_ASSIGN_OR_RETURN(const bool rotated, session_.Tick(absl::Now()));
          if (rotated) {
            for (int fd : session_.Fds()) {
              KW_RETURN_IF_ERROR(AddFd(fd));
            }
            publish(false);
          }
        }
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
  if (!conditions_.empty()) {
    info.condition = opts_.condition;
    for (const watch::Condition& c : conditions_) {
      info.condition_evaluated += c.stats().evaluated;
      info.condition_matched += c.stats().matched;
      info.condition_undefined +=
          c.stats().missing_new + c.stats().missing_old + c.stats().division_by_zero;
    }
  }
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
  bool recording_failed = false;
  if (writer_ != nullptr && record_error_.ok()) {
    core::SessionEnd end;
    if (info.exit.has_value()) {
      end.exit_status = info.exit->ShellStatus();
    }
    end.exit_reason = info.stop_reason;
    end.lost_count = info.lost;
    if (absl::Status s = writer_->Finish(end); !s.ok()) {
      Error(s);
      recording_failed = true;
    } else {
      if (!writer_->finish_warning().empty()) {
        std::fprintf(stderr, "kwatch: warning: %s\n", writer_->finish_warning().c_str());
      }
      std::fprintf(stderr, "kwatch: recorded %llu events to %s (kwatch report %s)\n",
                   static_cast<unsigned long long>(writer_->events_committed()),
                   writer_->path().c_str(), writer_->path().c_str());
    }
  } else if (!record_error_.ok()) {
    recording_failed = true;
    std::fprintf(stderr, "kwatch: error: %s\n", std::string(record_error_.message()).c_str());
    if (!writer_->location_lost()) {  // never claim a file that no longer exists
      const std::string& where =
          writer_->moved_to().empty() ? writer_->path() : writer_->moved_to();
      std::fprintf(stderr,
                   "kwatch: the recording %s holds the events committed before the failure; "
                   "`kwatch report %s` reads it\n",
                   where.c_str(), where.c_str());
    }
  }
  std::fflush(stdout);
  PrintSummary(stdout, opts_.json, session_, summary_, *profile_, info);
  std::fflush(stdout);
  if (recording_failed) {
    return 1;  // -o was not honoured (docs/recording.md)
  }
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
    lo.run_as = opts.run_as;
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
               : opts.backend == "stop" ? watch::BackendKind::kStop
                                        : watch::BackendKind::kAuto;
  if (opts.stop) {
    so.backend = watch::BackendKind::kStop;
  }
  so.overcommit = opts.overcommit == "multiplex" ? watch::Overcommit::kMultiplex
                  : opts.overcommit == "fail"    ? watch::Overcommit::kFail
                                                 : watch::Overcommit::kPages;
  so.mux_interval = absl::Milliseconds(opts.mux_interval_ms);
  so.stack_frames = opts.stack ? opts.stack_depth : 0;
  if (!opts.condition.empty()) {
    // Parsed once up front for its errors and for whether it needs exact values.
    auto c = watch::Condition::Parse(opts.condition);
    if (!c.ok()) {
      return fail(c.status());
    }
    so.exact_values = c->uses_new() || c->uses_old();
  }
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
      const watch::WatchPlacement placed = (*session)->placement(wt.id);
      core::WatchRecord watch_record = watch::WatchRecordFor(wt, placed.backend);
      if ((*session)->allocator() != nullptr) {
        // drmgr's decision: registers, split, page protection, multiplexed.
        watch_record.coverage = placed.detail;
      }
      if (absl::Status s = (*w)->AddWatch(watch_record); !s.ok()) {
        return fail(s);
      }
    }
    writer = std::move(*w);
  }
  std::vector<watch::Condition> conditions;
  if (!opts.condition.empty()) {
    for (const watch::Watch& wt : (*session)->watches()) {
      watch::ConditionOptions co;
      co.signed_values = watch::IsSignedType(wt.target.type_name);
      auto c = watch::Condition::Parse(opts.condition, co);
      if (!c.ok()) {
        return fail(c.status());
      }
      conditions.push_back(*std::move(c));
    }
  }
  Runner runner(opts, *proc, **session, sigfd.get(), writer.get(), std::move(conditions));
  auto code = runner.Run();
  if (!code.ok()) {
    return fail(code.status());
  }
  return code;
}

// ---------------------------------------------------------------------------------------------
// Kernel watches: no -p and no command. One CPU-wide breakpoint per online CPU (pid -1).

// One watched kernel object.
struct KernelWatch {
  std::string expr;     // as typed
  std::string display;  // "jiffies", "init_task.prio"
  uint64_t addr = 0;    // run-time address
  uint32_t len = 8;
  std::string type_name;  // "" when no source gives a type
  std::string source;     // where the symbol's address came from
  int64_t slide = 0;
  std::vector<std::unique_ptr<watch::PerfBreakpoint>> bps;  // one per CPU
  std::vector<int> cpus;
  uint64_t events = 0;
};

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
    std::fprintf(stderr, "kwatch: note: %s\n", std::string(st.message()).c_str());
  }
}

// Whether this process may open kernel breakpoint events: root, CAP_PERFMON or CAP_SYS_ADMIN
// (perf_event_open checks perfmon_capable(): CAP_PERFMON since Linux 5.8, else
// CAP_SYS_ADMIN).
bool HasPerfmonCapability() {
  if (geteuid() == 0) {
    return true;
  }
  auto status = core::kernel::ReadWholeFile("/proc/self/status");
  if (!status.ok()) {
    return false;
  }
  for (absl::string_view line : absl::StrSplit(*status, '\n')) {
    if (absl::ConsumePrefix(&line, "CapEff:")) {
      uint64_t caps = 0;
      if (!absl::SimpleHexAtoi(absl::StripAsciiWhitespace(line), &caps)) {
        return false;
      }
      constexpr int kCapSysAdmin = 21;
      constexpr int kCapPerfmon = 38;
      return (caps & (1ULL << kCapSysAdmin)) != 0 || (caps & (1ULL << kCapPerfmon)) != 0;
    }
  }
  return false;
}

// The largest watch length (1, 2, 4, 8) that fits `room` bytes and the alignment of `addr`.
uint32_t LengthWithin(uint64_t addr, std::optional<uint64_t> room) {
  uint32_t len = 8;
  while (len > 1 && ((room.has_value() && *room < len) || addr % len != 0)) {
    len /= 2;
  }
  return len;
}

// Resolves one expression against the kernel: its address through the symbol chain, its
// member path and type through BTF (or --type), its length.
absl::StatusOr<KernelWatch> ResolveKernelExpr(const std::string& text, const Options& opts,
                                              core::kernel::KernelSymbolResolver& symbols,
                                              const core::kernel::KernelBtf* btf) {
  KW_ASSIGN_OR_RETURN(const core::Expr expr, core::ParseExpr(text));
  KernelWatch w;
  w.expr = text;
  if (expr.address.has_value()) {
    if (!expr.steps.empty()) {
      return absl::InvalidArgumentError("a raw kernel address takes no member path");
    }
    w.addr = *expr.address;
    w.display = absl::StrFormat("0x%x", w.addr);
    w.len = static_cast<uint32_t>(opts.len.value_or(expr.length.value_or(8)));
    w.source = "raw address";
    return w;
  }
  KW_ASSIGN_OR_RETURN(const core::kernel::KernelSymbolAddress sym, symbols.Resolve(expr.base));
  if (sym.addr < 0xffff800000000000ULL) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "kernel symbol '%s' is at 0x%x in %s, outside the kernel's address space: it is a "
        "per-CPU variable (an offset into each CPU's area), which kwatch cannot watch yet",
        expr.base, sym.addr, sym.source));
  }
  w.addr = sym.addr;
  w.source = sym.source;
  w.slide = sym.slide;
  w.display = expr.base;
  // The symbol's type: --type, else BTF (per-CPU variables only on most kernels).
  std::optional<core::kernel::BtfTypeRef> type;
  if (!opts.kernel_type.empty()) {
    if (btf == nullptr) {
      return absl::FailedPreconditionError(
          "--type needs the kernel's BTF (/sys/kernel/btf/vmlinux, CONFIG_DEBUG_INFO_BTF)");
    }
    KW_ASSIGN_OR_RETURN(type, btf->FindType(opts.kernel_type));
  } else if (btf != nullptr) {
    type = btf->VarType(expr.base);
  }
  std::optional<uint64_t> type_size;
  if (type.has_value()) {
    KW_ASSIGN_OR_RETURN(const core::kernel::BtfMemberRef m, btf->Walk(*type, expr.steps));
    w.addr += m.offset;
    w.display += m.path;
    w.type_name = m.type_name;
    type_size = m.size;
    if (m.bit_size != 0) {
      w.type_name += absl::StrFormat(" (bitfield :%d)", m.bit_size);
    }
  } else if (sym.from_vmlinux) {
    // The vmlinux's DWARF (libdw) knows every variable's type: resolve the whole expression at
    // link-time addresses, then move it by the slide.
    KW_ASSIGN_OR_RETURN(auto dwarf, core::Symbols::ForFile(sym.file));
    const auto no_memory = [](core::RemoteAddr, std::span<uint8_t>) {
      return absl::InvalidArgumentError(
          "kwatch does not read kernel memory ('->' on a kernel "
          "pointer)");
    };
    auto r = dwarf->Resolve(expr, no_memory);
    if (r.ok()) {
      w.addr = r->addr.value + static_cast<uint64_t>(sym.slide);
      w.display = r->display;
      w.type_name = r->type_name;
      type_size = r->length;
    } else if (!expr.steps.empty()) {
      return r.status();
    }
  }
  if (!type_size.has_value() && !expr.steps.empty()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "no type for kernel symbol '%s': the kernel's BTF describes only per-CPU variables, "
        "and System.map and kallsyms carry no types; name its type with --type, e.g. "
        "`kwatch --rw '%s' --type 'struct task_struct'`",
        expr.base, text));
  }
  if (opts.exec) {
    w.len = 1;  // one instruction start (perf wants sizeof(long) on x86: PerfBreakpoint says so)
  } else if (opts.len.has_value()) {
    w.len = static_cast<uint32_t>(*opts.len);
  } else if (type_size.has_value()) {
    if (*type_size != 1 && *type_size != 2 && *type_size != 4 && *type_size != 8) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s is a %s of %d bytes: one debug register watches 1, 2, 4 or 8 aligned bytes; "
          "watch a member, or give --len",
          w.display, w.type_name, *type_size));
    }
    w.len = static_cast<uint32_t>(*type_size);
  } else if (sym.type == 'T' || sym.type == 't' || sym.type == 'W' || sym.type == 'w') {
    w.len = LengthWithin(w.addr, sym.room);  // code: the first bytes of the function
  } else {
    w.len = LengthWithin(w.addr, sym.room);
    std::fprintf(stderr,
                 "kwatch: note: no type for '%s' (System.map and kallsyms carry none, and the "
                 "kernel's BTF describes only per-CPU variables): watching %u bytes; give "
                 "--len N or --type TYPE\n",
                 w.display.c_str(), w.len);
  }
  if (sym.type != 'D' && sym.type != 'd' && sym.type != 'B' && sym.type != 'b' && !opts.exec &&
      !opts.rw && !opts.read) {
    std::fprintf(stderr,
                 "kwatch: warning: '%s' is in a read-only kernel section (type '%c' in %s): "
                 "nothing writes there, so --write will see no event\n",
                 expr.base.c_str(), sym.type, sym.source.c_str());
  }
  return w;
}

// The command name of a task, read when its first event is printed.
class CommCache {
 public:
  const std::string& Get(pid_t tid, uint32_t cpu) {
    auto it = names_.find(tid);
    if (it != names_.end()) {
      return it->second;
    }
    std::string name;
    if (tid == 0) {
      name = absl::StrCat("swapper/", cpu);  // the idle task of that CPU
    } else {
      auto comm = core::kernel::ReadWholeFile(absl::StrCat("/proc/", tid, "/comm"));
      name = comm.ok() ? std::string(absl::StripAsciiWhitespace(*comm)) : "?";
    }
    return names_.emplace(tid, std::move(name)).first->second;
  }

 private:
  std::map<pid_t, std::string> names_;
};

struct KernelEvent {
  watch::PerfSample s;
  size_t watch = 0;
  watch::PerfCallchain chain;  // --stack
};

// The frames of a kernel event's callchain: kernel frames by Describe (func+off, file:line
// with a vmlinux), then the user frames of the task (by the process's symbols for
// --kernel-accesses; addresses for kernel-wide watches, whose tasks are anyone's).
struct KernelFrame {
  uint64_t ip = 0;
  bool user = false;
  std::string site;
};

std::vector<KernelFrame> KernelFrames(core::kernel::KernelSymbolResolver& symbols,
                                      const core::Symbols* user_syms,
                                      const watch::PerfCallchain& chain) {
  std::vector<KernelFrame> out;
  for (const uint64_t ip : chain.kernel) {
    out.push_back({ip, false, symbols.Describe(ip)});
  }
  for (const uint64_t ip : chain.user) {
    std::string site = absl::StrFormat("0x%x", ip);
    if (user_syms != nullptr) {
      if (auto f = user_syms->FunctionAt(core::RemoteAddr{ip}); f.has_value()) {
        site = absl::StrFormat("%s+0x%x", f->name, ip - f->start.value);
        if (auto l = user_syms->LineAt(core::RemoteAddr{ip}); l.has_value()) {
          const size_t slash = l->file.rfind('/');
          absl::StrAppendFormat(&site, " (%s:%d)",
                                slash == std::string::npos ? l->file : l->file.substr(slash + 1),
                                l->line);
        }
      }
    }
    out.push_back({ip, true, std::move(site)});
  }
  return out;
}

// The event loop of breakpoints whose samples carry kernel IPs (kernel watches, and
// --kernel-accesses of a process, `proc`): drains the rings, prints each event with its CPU,
// task and kernel function+offset, stops on --count, --duration, a signal or the target's
// end, then prints the summary. Returns the exit status.
absl::StatusOr<int> RunBreakpointLoop(const Options& opts, std::vector<KernelWatch>& watches,
                                      core::kernel::KernelSymbolResolver& symbols,
                                      drmgr::DrKind kind, const std::string& armed,
                                      core::Process* proc,
                                      const core::Symbols* user_syms = nullptr) {
  sigset_t mask;
  sigemptyset(&mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGCHLD}) {
    sigaddset(&mask, sig);
  }
  pthread_sigmask(SIG_BLOCK, &mask, nullptr);
  core::UniqueFd sigfd(signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK));
  core::UniqueFd epfd(epoll_create1(EPOLL_CLOEXEC));
  core::UniqueFd tick(timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK));
  if (!sigfd || !epfd || !tick) {
    const int err = errno;
    return core::SyscallError(err, "signalfd/epoll_create1/timerfd_create");
  }
  itimerspec its{};
  its.it_interval.tv_nsec = 50'000'000;
  its.it_value.tv_nsec = 50'000'000;
  timerfd_settime(tick.get(), 0, &its, nullptr);
  auto add = [&](int fd) -> absl::Status {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (epoll_ctl(epfd.get(), EPOLL_CTL_ADD, fd, &ev) != 0) {
      const int err = errno;
      return core::SyscallError(err, "epoll_ctl(ADD)");
    }
    return absl::OkStatus();
  };
  KW_RETURN_IF_ERROR(add(sigfd.get()));
  KW_RETURN_IF_ERROR(add(tick.get()));
  for (const KernelWatch& w : watches) {
    for (const auto& bp : w.bps) {
      for (const int fd : bp->fds()) {
        KW_RETURN_IF_ERROR(add(fd));
      }
    }
  }
  std::fprintf(stderr, "kwatch: %s\n", armed.c_str());
  std::fflush(stderr);
  // The target's end (or exec) while kwatch handles its stops.
  auto poll_target = [&]() -> absl::Status {
    if (proc == nullptr || !proc->alive()) {
      return absl::OkStatus();
    }
    KW_ASSIGN_OR_RETURN(const std::vector<core::ProcessEvent> pevs, proc->Poll());
    for (const auto& e : pevs) {
      if (e.kind == core::ProcessEvent::Kind::kExited) {
        return absl::CancelledError(
            proc->exit_info()->signaled
                ? absl::StrCat("target killed by ", sigabbrev_np(proc->exit_info()->signal))
                : std::string("target exited"));
      }
      if (e.kind == core::ProcessEvent::Kind::kExec) {
        KW_RETURN_IF_ERROR(proc->Resume(e.tid));
        return absl::CancelledError(
            "target called exec (the watched addresses mean nothing in the new image)");
      }
    }
    return absl::OkStatus();
  };

  const uint64_t start_ns = MonotonicNs();
  const uint64_t deadline_ns =
      opts.duration > 0 ? start_ns + static_cast<uint64_t>(opts.duration * 1e9) : 0;
  CommCache comms;
  uint64_t delivered = 0;
  std::string stop_reason;
  if (!opts.quiet && !opts.json) {
    std::printf("%-14s %-4s %-7s %-16s %-3s %-24s %s\n", "TIME(s)", "CPU", "TID", "COMM", "ACC",
                "WATCH", "IP (after the access)");
  }
  auto drain = [&]() {
    std::vector<KernelEvent> evs;
    for (size_t i = 0; i < watches.size(); ++i) {
      for (auto& bp : watches[i].bps) {
        if (bp->ring() == nullptr) {
          continue;
        }
        if (opts.stack) {
          bp->ring()->DrainRecords([&](std::span<const uint8_t> record) {
            KernelEvent ev;
            ev.watch = i;
            if (watch::ParseCallchainSample(record, ev.s, ev.chain)) {
              evs.push_back(std::move(ev));
            }
          });
        } else {
          bp->ring()->Drain([&](const watch::PerfSample& s) { evs.push_back({s, i, {}}); });
        }
      }
    }
    std::sort(evs.begin(), evs.end(),
              [](const KernelEvent& a, const KernelEvent& b) { return a.s.time < b.s.time; });
    for (const KernelEvent& ev : evs) {
      if (opts.count > 0 && delivered >= opts.count) {
        break;
      }
      ++delivered;
      KernelWatch& w = watches[ev.watch];
      ++w.events;
      if (opts.quiet) {
        continue;
      }
      const std::string ip = symbols.Describe(ev.s.ip);
      const std::vector<KernelFrame> frames =
          opts.stack ? KernelFrames(symbols, user_syms, ev.chain) : std::vector<KernelFrame>{};
      const double t =
          ev.s.time >= start_ns ? static_cast<double>(ev.s.time - start_ns) / 1e9 : 0.0;
      const std::string& comm = comms.Get(static_cast<pid_t>(ev.s.tid), ev.s.cpu);
      const char* acc = kind == drmgr::DrKind::kExec    ? "x"
                        : kind == drmgr::DrKind::kWrite ? "w"
                                                        : "rw";
      if (opts.json) {
        std::printf(
            "{\"type\":\"event\",\"time\":%.9f,\"cpu\":%u,\"tid\":%u,\"comm\":%s,\"kind\":\"%s\","
            "\"watch\":%zu,\"field\":%s,\"addr\":\"0x%llx\",\"ip\":\"0x%llx\",\"site\":%s%s}\n",
            t, ev.s.cpu, ev.s.tid, JsonString(comm).c_str(), acc, ev.watch,
            JsonString(w.display).c_str(), static_cast<unsigned long long>(ev.s.addr),
            static_cast<unsigned long long>(ev.s.ip), JsonString(ip).c_str(),
            frames.empty() ? ""
                           : absl::StrCat(",\"stack\":[",
                                          absl::StrJoin(frames, ",",
                                                        [](std::string* o, const KernelFrame& f) {
                                                          absl::StrAppendFormat(
                                                              o,
                                                              "{\"ip\":\"0x%x\",\"space\":"
                                                              "\"%s\",\"site\":%s}",
                                                              f.ip, f.user ? "user" : "kernel",
                                                              JsonString(f.site));
                                                        }),
                                          "]")
                                 .c_str());
      } else {
        std::printf("%-14.9f %-4u %-7u %-16s %-3s %-24s %s\n", t, ev.s.cpu, ev.s.tid, comm.c_str(),
                    acc, w.display.c_str(), ip.c_str());
        for (size_t f = 0; f < frames.size(); ++f) {
          std::printf("    #%-2zu %s%s\n", f, frames[f].user ? "[user] " : "",
                      frames[f].site.c_str());
        }
      }
    }
    std::fflush(stdout);
    if (opts.count > 0 && delivered >= opts.count && stop_reason.empty()) {
      stop_reason = absl::StrCat("--count ", opts.count, " reached");
    }
  };
  std::array<epoll_event, 64> evs{};
  while (stop_reason.empty()) {
    const int n = epoll_wait(epfd.get(), evs.data(), static_cast<int>(evs.size()), 1000);
    if (n < 0 && errno != EINTR) {
      const int err = errno;
      return core::SyscallError(err, "epoll_wait");
    }
    for (int i = 0; i < n; ++i) {
      if (evs[static_cast<size_t>(i)].data.fd == sigfd.get()) {
        signalfd_siginfo si{};
        while (read(sigfd.get(), &si, sizeof(si)) == sizeof(si)) {
          if (si.ssi_signo != SIGCHLD) {
            stop_reason =
                absl::StrCat("interrupted by ", sigabbrev_np(static_cast<int>(si.ssi_signo)));
          }
        }
      } else if (evs[static_cast<size_t>(i)].data.fd == tick.get()) {
        uint64_t ticks = 0;
        (void)(read(tick.get(), &ticks, sizeof(ticks)) > 0);
      }
    }
    drain();
    if (absl::Status st = poll_target(); !st.ok()) {
      if (!absl::IsCancelled(st)) {
        return st;
      }
      if (stop_reason.empty()) {
        stop_reason.assign(st.message().data(), st.message().size());
      }
    }
    if (deadline_ns != 0 && MonotonicNs() >= deadline_ns && stop_reason.empty()) {
      stop_reason = absl::StrFormat("--duration %gs elapsed", opts.duration);
    }
  }
  drain();
  uint64_t lost = 0;
  for (KernelWatch& w : watches) {
    for (auto& bp : w.bps) {
      (void)bp->Disable();
      lost += bp->ring() != nullptr ? bp->ring()->lost() : 0;
    }
  }
  if (opts.json) {
    std::printf(
        "{\"type\":\"summary\",\"events\":%llu,\"lost\":%llu,\"stop_reason\":%s,"
        "\"watches\":[",
        static_cast<unsigned long long>(delivered), static_cast<unsigned long long>(lost),
        JsonString(stop_reason).c_str());
  } else {
    std::printf("kwatch: %llu event%s, %llu lost; %s\n", static_cast<unsigned long long>(delivered),
                delivered == 1 ? "" : "s", static_cast<unsigned long long>(lost),
                stop_reason.c_str());
  }
  for (size_t i = 0; i < watches.size(); ++i) {
    const KernelWatch& w = watches[i];
    uint64_t counted = 0;
    for (const auto& bp : w.bps) {
      auto c = bp->Count();
      counted += c.ok() ? *c : 0;
    }
    const std::string cpus_text = absl::StrJoin(w.cpus, ",");
    const std::string kind_name(drmgr::DrKindName(kind));
    const std::string scope = proc == nullptr
                                  ? absl::StrCat("kernel, CPUs ", cpus_text)
                                  : absl::StrCat("kernel accesses for pid ", proc->pid());
    if (opts.json) {
      std::printf(
          "%s{\"id\":%zu,\"expr\":%s,\"addr\":\"0x%llx\",\"len\":%u,\"kind\":\"%s\","
          "\"type\":%s,\"source\":%s,\"slide\":%lld,\"cpus\":[%s],\"events\":%llu,"
          "\"kernel_count\":%llu}",
          i == 0 ? "" : ",", i, JsonString(w.display).c_str(),
          static_cast<unsigned long long>(w.addr), w.len, kind_name.c_str(),
          JsonString(w.type_name).c_str(), JsonString(w.source).c_str(),
          static_cast<long long>(w.slide), cpus_text.c_str(),
          static_cast<unsigned long long>(w.events), static_cast<unsigned long long>(counted));
    } else {
      std::printf(
          "watch #%zu %s: %u byte%s at 0x%llx%s%s, %s, %s: %llu event%s "
          "(the kernel counted %llu)\n",
          i + 1, w.display.c_str(), w.len, w.len == 1 ? "" : "s",
          static_cast<unsigned long long>(w.addr), w.type_name.empty() ? "" : ", ",
          w.type_name.c_str(), kind_name.c_str(), scope.c_str(),
          static_cast<unsigned long long>(w.events), w.events == 1 ? "" : "s",
          static_cast<unsigned long long>(counted));
    }
  }
  if (opts.json) {
    std::printf("]}\n");
  }
  std::fflush(stdout);
  // CPU hotplug: a CPU that came online after arming had no breakpoint.
  if (proc == nullptr && !watches.empty()) {
    const std::vector<int>& cpus = watches.front().cpus;
    for (const int cpu : watch::OnlineCpus()) {
      if (std::find(cpus.begin(), cpus.end(), cpu) == cpus.end()) {
        std::fprintf(stderr,
                     "kwatch: note: CPU %d came online during the session and was not watched\n",
                     cpu);
      }
    }
  }
  watches.clear();  // closes every event before the target is let go
  if (proc != nullptr) {
    if (proc->alive()) {
      if (proc->launched() && opts.kill_on_exit) {
        KW_RETURN_IF_ERROR(proc->Kill());
      } else {
        KW_RETURN_IF_ERROR(proc->Detach());
        std::fprintf(stderr, "kwatch: detached; target %d keeps running\n", proc->pid());
      }
    }
    if (proc->launched() && proc->exit_info().has_value()) {
      return proc->exit_info()->ShellStatus();
    }
  }
  return 0;
}

absl::StatusOr<int> RunKernelWatch(const Options& opts) {
  if (!HasPerfmonCapability()) {
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
    KW_ASSIGN_OR_RETURN(KernelWatch w, ResolveKernelExpr(e, opts, *symbols, btf.get()));
    std::fprintf(stderr, "kwatch: %s: %u byte%s at 0x%llx%s%s, from %s%s\n", w.display.c_str(),
                 w.len, w.len == 1 ? "" : "s", static_cast<unsigned long long>(w.addr),
                 w.type_name.empty() ? "" : ", ", w.type_name.c_str(), w.source.c_str(),
                 w.slide != 0 || absl::StartsWith(w.source, "System.map") ||
                         absl::StartsWith(w.source, "vmlinux")
                     ? absl::StrFormat(" (KASLR slide %s0x%x)", w.slide < 0 ? "-" : "+",
                                       w.slide < 0 ? -static_cast<uint64_t>(w.slide)
                                                   : static_cast<uint64_t>(w.slide))
                           .c_str()
                     : "");
    for (const int cpu : cpus) {
      watch::BreakpointRequest req;
      req.addr = core::RemoteAddr{w.addr};
      req.len = w.len;
      req.kind = kind;
      req.tid = -1;
      req.cpu = cpu;
      req.inherit = false;
      req.exclude_kernel = false;
      req.exclude_user = false;
      req.callchain_frames = opts.stack ? static_cast<uint16_t>(opts.stack_depth) : 0;
      KW_ASSIGN_OR_RETURN(auto bp, watch::PerfBreakpoint::Open(req));
      w.bps.push_back(std::move(bp));
      w.cpus.push_back(cpu);
    }
    watches.push_back(std::move(w));
  }

  KernelLinesNote(opts, *symbols);
  return RunBreakpointLoop(
      opts, watches, *symbols, kind,
      absl::StrFormat("armed %d kernel watch%s on %d CPUs (one breakpoint per CPU), perf "
                      "breakpoint stream mode%s",
                      watches.size(), watches.size() == 1 ? "" : "es", cpus.size(),
                      StackNote(opts)),
      nullptr);
}

// --kernel-accesses: user addresses of a process watched for the accesses the kernel makes
// on the process's behalf (exclude_user: copy_to_user into a read(2) buffer, futex words...),
// on every thread (inherited by new ones), each event with its kernel function+offset.
absl::StatusOr<int> RunKernelAccesses(const Options& opts) {
  if (!HasPerfmonCapability()) {
    return absl::PermissionDeniedError(
        "--kernel-accesses watches kernel code: it needs root, or CAP_PERFMON (Linux >= 5.8) "
        "or CAP_SYS_ADMIN (also CAP_SYSLOG to read kernel addresses in /proc/kallsyms)");
  }
  KW_ASSIGN_OR_RETURN(auto ksyms, core::kernel::KernelSymbolResolver::Create({}));
  sigset_t mask;
  sigemptyset(&mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGCHLD}) {
    sigaddset(&mask, sig);
  }
  pthread_sigmask(SIG_BLOCK, &mask, nullptr);
  std::unique_ptr<core::Process> proc;
  if (opts.pid.has_value()) {
    KW_ASSIGN_OR_RETURN(proc, core::Process::Attach(*opts.pid));
  } else {
    core::LaunchOptions lo;
    lo.kill_on_exit = opts.kill_on_exit;
    lo.run_as = opts.run_as;
    KW_ASSIGN_OR_RETURN(proc, core::Process::Launch(opts.command, lo));
    if (absl::Status st = proc->RunToEntry(); !st.ok()) {
      (void)proc->Kill();
      return st;
    }
  }
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
    auto expr = core::ParseExpr(text);
    if (!expr.ok()) {
      return fail(expr.status());
    }
    KernelWatch w;
    w.expr = text;
    if (expr->address.has_value()) {
      w.addr = *expr->address;
      w.display = absl::StrFormat("0x%x", w.addr);
      w.len = static_cast<uint32_t>(opts.len.value_or(expr->length.value_or(8)));
    } else {
      auto r = (*syms)->Resolve(*expr, reader);
      if (!r.ok()) {
        return fail(r.status());
      }
      w.addr = r->addr.value;
      w.display = r->display;
      w.type_name = r->type_name;
      w.len = static_cast<uint32_t>(opts.len.value_or(r->length));
    }
    w.source = "the target's symbols";
    watches.push_back(std::move(w));
  }
  if (absl::Status st = proc->StopAll(); !st.ok()) {
    return fail(st);
  }
  for (KernelWatch& w : watches) {
    for (const pid_t tid : proc->TracedThreads()) {
      watch::BreakpointRequest req;
      req.addr = core::RemoteAddr{w.addr};
      req.len = w.len;
      req.kind = kind;
      req.tid = tid;
      req.inherit = true;
      req.exclude_kernel = false;
      req.exclude_user = true;
      req.callchain_frames = opts.stack ? static_cast<uint16_t>(opts.stack_depth) : 0;
      auto bp = watch::PerfBreakpoint::Open(req);
      if (!bp.ok()) {
        return fail(absl::Status(
            bp.status().code(), absl::StrCat("arming '", w.display, "': ", bp.status().message())));
      }
      w.bps.push_back(*std::move(bp));
    }
  }
  if (absl::Status st = proc->ResumeAll(); !st.ok()) {
    return fail(st);
  }
  KernelLinesNote(opts, *ksyms);
  const std::string prog = proc->argv().empty() ? "?" : proc->argv()[0];
  auto code = RunBreakpointLoop(
      opts, watches, *ksyms, kind,
      absl::StrFormat("armed %d watch%s on pid %d (%s) for the kernel's accesses only "
                      "(exclude_user), perf breakpoint stream mode%s",
                      watches.size(), watches.size() == 1 ? "" : "es", proc->pid(), prog,
                      StackNote(opts)),
      proc.get(), syms->get());
  if (!code.ok()) {
    return fail(code.status());
  }
  return code;
}

constexpr char kKernelIfRefusal[] =
    "--if needs the values of each access, and kernel watches (and --kernel-accesses) are "
    "perf breakpoint streams that read no memory at the access; leave --if out and filter "
    "the --json events (tid, cpu, comm, site)";

// Kernel mode's exit codes: 2 when the expression resolves nowhere and nothing more was given
// (a missing target or symbol file: an argument is missing), 1 for other errors.
int KernelMain(const Options& opts) {
  if (opts.read) {
    std::fprintf(stderr,
                 "kwatch: error: --read is not available for kernel watches: kwatch tells reads "
                 "from writes by decoding the accessing instruction, and it does not read kernel "
                 "code; use --rw\n");
    return 2;
  }
  if (!opts.output.empty() || opts.backend == "page") {
    std::fprintf(stderr, "kwatch: error: %s\n",
                 !opts.output.empty()
                     ? "recording kernel watches (-o) is not supported yet"
                     : "kernel watches use hardware breakpoints only (--backend page protects "
                       "a process's pages)");
    return 2;
  }
  if (opts.stop || opts.backend == "stop") {
    std::fprintf(stderr,
                 "kwatch: error: stop mode stops a process's threads through ptrace; kernel "
                 "watches use CPU-wide perf breakpoints (leave --stop out)\n");
    return 2;
  }
  if (!opts.condition.empty()) {
    std::fprintf(stderr, "kwatch: error: %s\n", kKernelIfRefusal);
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
      "  kwatch --rw g_stats -o run.kwdb -- ./prog      record; then `kwatch report run.kwdb`\n"
      "  kwatch --write &jiffies                        no -p and no command: a kernel variable,\n"
      "                                                 on every CPU (root; see --system-map)\n\n"
      "Subcommands: `kwatch report FILE` (storage profile of a recording), `kwatch probe`\n"
      "(INT3 and uprobe probes), `kwatch slots [-p PID]` (who holds the debug registers);\n"
      "see --help of each.\n"
      "Expressions: name, &name, name.field, name[3], ptr->field, 0xADDR, 0xADDR:LEN.\n"
      "With hardware breakpoints a structure is split over the four x86 debug registers and\n"
      "what does not fit follows --overcommit; with page protection (--backend page) any\n"
      "variable or structure is watched exactly, per field.",
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
      ->default_str("pages for processes, fail for the kernel");
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
  app.add_flag("--kernel-accesses", opts.kernel_accesses,
               "Watch a process's memory for the accesses the kernel makes on its behalf "
               "(e.g. the buffer read(2) fills), with the kernel function that made each");
  app.add_option("--type", opts.kernel_type,
                 "Kernel watches: the C type of the watched symbol (e.g. 'struct task_struct'), "
                 "for member expressions; the layout comes from the kernel's BTF");
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
    absl::StatusOr<core::RunAs> as = core::ResolveUser(opts.user);
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
    if (opts.read || opts.exec || !opts.output.empty()) {
      std::fprintf(stderr, "kwatch: error: --kernel-accesses takes --write or --rw, and no -o\n");
      return 2;
    }
    if (!opts.condition.empty()) {
      std::fprintf(stderr, "kwatch: error: %s\n", kKernelIfRefusal);
      return 2;
    }
    auto code = RunKernelAccesses(opts);
    if (!code.ok()) {
      Error(code.status());
      return 1;
    }
    return *code;
  }
  if (!opts.system_map.empty() || !opts.vmlinux.empty() || !opts.kernel_type.empty()) {
    std::fprintf(stderr,
                 "kwatch: error: --system-map, --vmlinux and --type are for kernel watches "
                 "(no -p and no command)\n");
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
