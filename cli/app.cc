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
#include "cli/kernel_watch.h"
#include "cli/output.h"
#include "cli/report_cmd.h"
#include "cli/watch_options.h"
#include "core/base/clock.h"
#include "core/symbols/expr.h"
#include "core/ptrace/process.h"
#include "core/ptrace/process_group.h"
#include "core/base/status_macros.h"
#include "core/store/trace_writer.h"
#include "core/symbols/symbols.h"
#include "core/base/syscall_status.h"
#include "core/base/unique_fd.h"
#include "drmgr/debug_regs.h"
#include "drmgr/slot_registry.h"
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
  std::fprintf(stderr, "kwatch: error: %s\n", std::string(s.message()).c_str());
}

// The event loop: drains rings, follows the target (and with -f the children it forks), stops
// on count, duration or a signal.
class Runner {
 public:
  Runner(const Options& opts, std::unique_ptr<core::ProcessGroup> group,
         std::unique_ptr<core::Process> proc, std::unique_ptr<watch::WatchSession> session,
         const watch::SessionOptions& session_opts, int sigfd, core::TraceWriter* writer,
         std::vector<watch::Condition> conditions);

  absl::StatusOr<int> Run();
  // After Run() failed: every watch removed, followed children detached, the target killed if
  // it was launched (it may never have run its own code), else detached.
  void Abandon();

 private:
  // A process of the session: the target, or (-f) a followed child.
  struct Tracee {
    std::unique_ptr<core::Process> proc;
    // Its watches now; nullptr when they ended (exec without -f, or not re-armed).
    std::unique_ptr<watch::WatchSession> session;
    // Sessions of images it exec'd from (kept for their counts and, the target's first, for
    // the summary).
    std::vector<std::unique_ptr<watch::WatchSession>> ended;
    pid_t parent = 0;  // 0: the target
    uint64_t events = 0;
    std::vector<uint64_t> per_watch;
    // Per watch, after an exec re-arm: the first image's address minus this image's (the
    // summary counts fields against the first image's layout). Empty: no difference.
    std::vector<uint64_t> rebase;
  };

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
  absl::Status AddFds(const watch::WatchSession& session) {
    for (int fd : session.Fds()) {
      KW_RETURN_IF_ERROR(AddFd(fd));
    }
    return absl::OkStatus();
  }
  Tracee& target() { return *tracees_.front(); }
  // The session the summary describes: the target's first (its watches, placements, names).
  watch::WatchSession& first() {
    return target().ended.empty() ? *target().session : *target().ended.front();
  }
  void DrainAll();
  void DrainTracee(Tracee& t);
  // Appends `ev` (and its site, once) to the recording; a failure stops the session.
  void Record(watch::WatchSession& session, const core::AccessEvent& ev);
  void FlushRecording();
  // Polls the target and every followed child, and handles what happened to each.
  absl::Status HandleChild();
  absl::Status HandleEvents(Tracee& t, const std::vector<core::ProcessEvent>& events);
  // -f: takes followed child `pid` (forked by thread `tid` of `parent`), arms its session and
  // resumes it.
  absl::Status AdoptChild(Tracee& parent, pid_t pid);
  // -f: `t` called exec (stopped at its exec event): its watches are armed again by
  // expression in the new image when they resolve to the same types; says what happened.
  void Rearm(Tracee& t);
  bool AnyChildAlive() const;
  std::string Who(const Tracee& t) const {
    return t.parent == 0 ? absl::StrCat("target ", t.proc->pid())
                         : absl::StrCat("followed child ", t.proc->pid());
  }
  void Note(std::string note) {
    std::fprintf(stderr, "kwatch: %s\n", note.c_str());
    notes_.push_back(std::move(note));
  }
  void Stop(std::string reason) {
    if (!stopped_) {
      stopped_ = true;
      stop_reason_ = std::move(reason);
    }
  }
  // Removes the watches from every process, then lets each go: killed (--kill-on-exit on a
  // launched target) or detached.
  absl::Status Release(RunInfo& info);

  const Options& opts_;
  std::unique_ptr<core::ProcessGroup> group_;     // -f; outlives every process below
  std::vector<std::unique_ptr<Tracee>> tracees_;  // the target first, then children by fork
  watch::SessionOptions session_opts_;
  int sigfd_;
  core::TraceWriter* writer_;                 // -o, or nullptr
  std::vector<watch::Condition> conditions_;  // --if, one per watch (by id), or none
  absl::Status record_error_;
  std::vector<watch::Watch> watches_;  // the target's first image's: what the summary counts
  watch::Summary summary_;
  std::optional<watch::StorageProfile> profile_;  // from the start of Run()
  EventPrinter printer_;
  core::UniqueFd epfd_;
  bool stopped_ = false;
  std::string stop_reason_;
  uint64_t delivered_ = 0;
  bool exec_seen_ = false;  // the target's watches ended at an exec (not re-armed)
  std::vector<std::string> notes_;
};

Runner::Runner(const Options& opts, std::unique_ptr<core::ProcessGroup> group,
               std::unique_ptr<core::Process> proc, std::unique_ptr<watch::WatchSession> session,
               const watch::SessionOptions& session_opts, int sigfd, core::TraceWriter* writer,
               std::vector<watch::Condition> conditions)
    : opts_(opts),
      group_(std::move(group)),
      session_opts_(session_opts),
      sigfd_(sigfd),
      writer_(writer),
      conditions_(std::move(conditions)),
      watches_(session->watches()),
      summary_(watches_),
      printer_(stdout, opts.json, 0) {
  auto t = std::make_unique<Tracee>();
  t->proc = std::move(proc);
  t->session = std::move(session);
  t->per_watch.assign(watches_.size(), 0);
  tracees_.push_back(std::move(t));
}

void Runner::DrainAll() {
  for (size_t i = 0; i < tracees_.size(); ++i) {
    DrainTracee(*tracees_[i]);
  }
  if (opts_.count > 0 && delivered_ >= opts_.count) {
    Stop(absl::StrCat("--count ", opts_.count, " reached"));
  }
}

void Runner::DrainTracee(Tracee& t) {
  if (t.session == nullptr || (stopped_ && opts_.count > 0 && delivered_ >= opts_.count)) {
    return;
  }
  watch::WatchSession& session = *t.session;
  session.Drain([&](const core::AccessEvent& ev) {
    if (opts_.count > 0 && delivered_ >= opts_.count) {
      return;
    }
    if (!conditions_.empty() && !conditions_[ev.watch_id].Matches(ev)) {
      return;
    }
    ++delivered_;
    ++t.events;
    ++t.per_watch[ev.watch_id];
    core::AccessEvent rebased;
    const core::AccessEvent* counted = &ev;
    if (!t.rebase.empty()) {
      rebased = ev;
      rebased.addr.value += t.rebase[ev.watch_id];
      rebased.access_addr.value += t.rebase[ev.watch_id];
      counted = &rebased;
    }
    summary_.Add(*counted);
    profile_->Add(*counted);
    Record(session, ev);
    if (!opts_.quiet) {
      printer_.Print(session, summary_, ev, counted);
    }
  });
}

void Runner::Record(watch::WatchSession& session, const core::AccessEvent& ev) {
  if (writer_ == nullptr || !record_error_.ok()) {
    return;
  }
  absl::Status s;
  if (!writer_->HasSite(ev.ip)) {
    s = writer_->AddSite(watch::SiteRecordFor(session.symbolizer(), ev.ip));
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

bool Runner::AnyChildAlive() const {
  for (size_t i = 1; i < tracees_.size(); ++i) {
    if (tracees_[i]->proc->alive()) {
      return true;
    }
  }
  return false;
}

absl::Status Runner::HandleChild() {
  // Children adopted meanwhile are polled in the same round (the vector may grow).
  for (size_t i = 0; i < tracees_.size(); ++i) {
    Tracee& t = *tracees_[i];
    if (!t.proc->alive()) {
      continue;
    }
    KW_ASSIGN_OR_RETURN(const std::vector<core::ProcessEvent> events, t.proc->Poll());
    KW_RETURN_IF_ERROR(HandleEvents(t, events));
  }
  const core::Process& main = *target().proc;
  if (!main.alive() && !AnyChildAlive()) {
    std::string reason =
        main.exit_info()->signaled
            ? absl::StrCat("target killed by ", sigabbrev_np(main.exit_info()->signal))
            : "target exited";
    if (tracees_.size() > 1) {
      absl::StrAppend(&reason, "; its followed children ended");
    }
    Stop(std::move(reason));
  }
  return absl::OkStatus();
}

absl::Status Runner::HandleEvents(Tracee& t, const std::vector<core::ProcessEvent>& events) {
  core::Process& proc = *t.proc;
  for (const core::ProcessEvent& e : events) {
    switch (e.kind) {
      case core::ProcessEvent::Kind::kExited:
        if (t.parent != 0) {
          DrainTracee(t);  // what its rings still hold
          std::fprintf(
              stderr, "kwatch: followed child %d %s %d\n", proc.pid(),
              proc.exit_info()->signaled ? "killed by signal" : "exited with status",
              proc.exit_info()->signaled ? proc.exit_info()->signal : proc.exit_info()->code);
        }
        break;
      case core::ProcessEvent::Kind::kExec:
        DrainAll();
        if (t.session != nullptr) {
          t.session->Forget();
          t.ended.push_back(std::move(t.session));
        }
        if (group_ != nullptr && !stopped_) {
          Rearm(t);
          KW_RETURN_IF_ERROR(proc.ResumeAll());
          break;
        }
        if (t.parent == 0) {
          exec_seen_ = true;
          std::fprintf(stderr,
                       "kwatch: target %d called exec; the watches of the old image have ended "
                       "(their addresses mean nothing in the new one; -f re-arms them)\n",
                       proc.pid());
        } else {
          Note(absl::StrCat(Who(t), " called exec: its watches ended there"));
        }
        KW_RETURN_IF_ERROR(proc.Resume(e.tid));
        break;
      case core::ProcessEvent::Kind::kForked:
        if (e.child != 0) {
          KW_RETURN_IF_ERROR(AdoptChild(t, e.child));
        }
        break;
      case core::ProcessEvent::Kind::kGroupStop:
        std::fprintf(stderr, "kwatch: %s stopped by %s (job control); still watching\n",
                     Who(t).c_str(), sigabbrev_np(e.signal));
        break;
      default:
        break;
    }
  }
  return absl::OkStatus();
}

absl::Status Runner::AdoptChild(Tracee& parent, pid_t pid) {
  const uint64_t t0 = core::MonotonicNs();
  std::unique_ptr<core::Process> child = group_->TakeChild(pid);
  if (child == nullptr) {
    return absl::OkStatus();
  }
  watch::WatchSession* from = parent.session.get();
  if (from == nullptr || stopped_) {
    // Nothing of kwatch's is in it (cleaned at its fork): it goes unwatched, detached.
    Note(absl::StrCat("child ", pid, " of ", parent.proc->pid(), " not followed: ",
                      stopped_ ? "kwatch was stopping" : "its parent's watches had ended"));
    return child->Detach();
  }
  auto session = watch::WatchSession::ForFork(*from, *child);
  if (!session.ok()) {
    (void)child->Detach();
    return session.status();
  }
  if (absl::Status s = (*session)->Arm(); !s.ok()) {
    (void)child->Detach();
    return absl::Status(
        s.code(), absl::StrCat("arming the watches in followed child ", pid, ": ", s.message()));
  }
  auto t = std::make_unique<Tracee>();
  t->parent = parent.proc->pid();
  t->proc = std::move(child);
  t->session = *std::move(session);
  t->per_watch.assign(watches_.size(), 0);
  t->rebase = parent.rebase;  // the same image as its parent
  KW_RETURN_IF_ERROR(AddFds(*t->session));
  if (!opts_.quiet) {
    std::fprintf(stderr, "kwatch: following child %d of %d (watches armed in %.0f us)\n", pid,
                 t->parent, static_cast<double>(core::MonotonicNs() - t0) / 1e3);
  }
  tracees_.push_back(std::move(t));
  return absl::OkStatus();
}

void Runner::Rearm(Tracee& t) {
  const std::string who = Who(t);
  std::string what;
  // Up to the new program's entry point: its shared libraries are mapped then.
  absl::Status s = t.proc->RunToEntry();
  std::unique_ptr<watch::WatchSession> session;
  std::vector<uint64_t> rebase(watches_.size(), 0);
  bool moved = false;
  if (s.ok()) {
    std::vector<watch::WatchRequest> requests;
    for (const watch::Watch& w : watches_) {
      requests.push_back(w.request);
    }
    auto created = watch::WatchSession::Create(*t.proc, std::move(requests), session_opts_);
    s = created.status();
    if (s.ok()) {
      session = *std::move(created);
    }
  }
  for (size_t i = 0; s.ok() && i < watches_.size(); ++i) {
    const core::ResolvedExpr& was = watches_[i].target;
    const core::ResolvedExpr& now = session->watches()[i].target;
    if (now.type_name != was.type_name || now.length != was.length) {
      s = absl::FailedPreconditionError(absl::StrFormat(
          "'%s' is %s (%d bytes) in the new image, %s (%d bytes) in the first: one summary "
          "cannot count both layouts",
          watches_[i].request.expr, now.type_name, now.length, was.type_name, was.length));
    }
    rebase[i] = was.addr.value - now.addr.value;
    moved = moved || rebase[i] != 0;
  }
  if (s.ok() && moved && writer_ != nullptr) {
    s = absl::FailedPreconditionError(
        "the watched variables moved (the new image is loaded elsewhere) and the recording "
        "(-o) holds one address per watch");
  }
  if (s.ok()) {
    s = session->Arm();
  }
  if (s.ok()) {
    s = AddFds(*session);
  }
  if (s.ok()) {
    std::vector<std::string> where;
    for (const watch::Watch& w : session->watches()) {
      where.push_back(absl::StrFormat("%s at 0x%x", w.target.display, w.target.addr.value));
    }
    what =
        absl::StrCat(session->watches().size() == 1 ? "its watch was" : "its watches were",
                     " re-armed in the new image by expression (-f): ", absl::StrJoin(where, ", "));
    t.session = std::move(session);
    t.rebase = moved ? std::move(rebase) : std::vector<uint64_t>();
  } else {
    what = absl::StrCat("not re-armed: ", s.message());
    t.rebase.clear();
  }
  Note(absl::StrCat(who, " called exec: the watches of the old image ended there; ", what));
}

absl::Status Runner::Release(RunInfo& info) {
  if (group_ != nullptr) {
    // Forks from now on are cleaned and let go; children already announced are let go too.
    group_->set_follow_forks(false);
    (void)HandleChild();
    DrainAll();
  }
  for (auto& t : tracees_) {
    if (t->session != nullptr) {
      t->session->Disarm();
    }
  }
  const bool kill = target().proc->launched() && opts_.kill_on_exit;
  size_t detached = 0;
  for (size_t i = 1; i < tracees_.size(); ++i) {
    core::Process& p = *tracees_[i]->proc;
    if (!p.alive()) {
      continue;
    }
    if (kill) {
      KW_RETURN_IF_ERROR(p.Kill());
    } else {
      KW_RETURN_IF_ERROR(p.Detach());
      ++detached;
    }
  }
  if (detached > 0) {
    std::fprintf(stderr,
                 "kwatch: watches removed from %zu followed child%s, detached; %s running\n",
                 detached, detached == 1 ? "" : "ren", detached == 1 ? "it keeps" : "they keep");
  }
  core::Process& main = *target().proc;
  if (main.alive()) {
    if (kill) {
      KW_RETURN_IF_ERROR(main.Kill());
      info.stop_reason += "; target killed (--kill-on-exit)";
    } else {
      KW_RETURN_IF_ERROR(main.Detach());
      std::fprintf(stderr, "kwatch: detached; target %d keeps running\n", main.pid());
    }
  }
  return absl::OkStatus();
}

void Runner::Abandon() {
  for (size_t i = tracees_.size(); i-- > 0;) {
    Tracee& t = *tracees_[i];
    t.session.reset();  // disarms
    t.ended.clear();
    if (!t.proc->alive()) {
      continue;
    }
    // A launched target that may never have run its own code is not left behind.
    if (i == 0 && t.proc->launched()) {
      (void)t.proc->Kill();
    } else {
      (void)t.proc->Detach();
    }
  }
}

absl::StatusOr<int> Runner::Run() {
  epfd_.Reset(epoll_create1(EPOLL_CLOEXEC));
  if (!epfd_) {
    const int err = errno;
    return core::SyscallError(err, "epoll_create1");
  }
  KW_RETURN_IF_ERROR(AddFd(sigfd_));
  watch::WatchSession& session = *target().session;
  core::Process& proc = *target().proc;
  KW_RETURN_IF_ERROR(AddFds(session));
  // A periodic tick drains samples below the wakeup threshold; a deadline for --duration.
  core::UniqueFd tick(timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK));
  itimerspec its{};
  // Multiplexed watches rotate through the debug registers at each tick.
  const long tick_ns = session.multiplexing()
                           ? std::min<long>(50'000'000, opts_.mux_interval_ms * 1'000'000L)
                           : 50'000'000;
  its.it_interval.tv_sec = tick_ns / 1'000'000'000;
  its.it_interval.tv_nsec = tick_ns % 1'000'000'000;
  its.it_value = its.it_interval;
  timerfd_settime(tick.get(), 0, &its, nullptr);
  KW_RETURN_IF_ERROR(AddFd(tick.get()));
  const uint64_t start_ns = core::MonotonicNs();
  const uint64_t deadline_ns =
      opts_.duration > 0 ? start_ns + static_cast<uint64_t>(opts_.duration * 1e9) : 0;
  printer_ = EventPrinter(stdout, opts_.json, start_ns);
  printer_.set_main_pid(proc.pid());
  {
    std::vector<watch::WatchedObject> objects;
    for (const watch::Watch& w : watches_) {
      objects.push_back(watch::ObjectForWatch(w));
    }
    watch::ProfileOptions popts;
    popts.start_ns = start_ns;
    profile_.emplace(std::move(objects), popts);
  }
  if (!opts_.quiet) {
    printer_.PrintHeader(session);
  }

  std::string prog = proc.argv().empty() ? "?" : proc.argv()[0];
  if (!session.backend_note().empty()) {
    std::fprintf(stderr, "kwatch: %s\n", session.backend_note().c_str());
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
  std::fprintf(stderr, "kwatch: armed %zu watch%s on pid %d (%s), %s%s\n", session.watches().size(),
               session.watches().size() == 1 ? "" : "es", proc.pid(), prog.c_str(), mode.c_str(),
               group_ != nullptr ? ", following forks (-f)" : "");
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
  std::fflush(stderr);

  // drmgr's decisions, for `kwatch slots` (refreshed as multiplexing rotates them).
  uint64_t published_ns = 0;
  auto publish = [&](bool force) {
    watch::WatchSession* now = target().session.get();
    if (now == nullptr || now->allocator() == nullptr) {
      return;
    }
    const uint64_t t = core::MonotonicNs();
    if (!force && t - published_ns < 200'000'000) {
      return;
    }
    published_ns = t;
    if (absl::Status s =
            drmgr::PublishSlots(proc.pid(), now->allocator()->Snapshot(), opts_.command_line);
        !s.ok() && force) {
      std::fprintf(stderr, "kwatch: note: `kwatch slots` will not see this session: %s\n",
                   std::string(s.message()).c_str());
    }
  };
  absl::Cleanup unpublish = [] { drmgr::UnpublishSlots(); };
  publish(true);

  // The target may already have ended (or exec'd) while arming.
  KW_RETURN_IF_ERROR(HandleChild());
  epoll_event evs[64];
  while (!stopped_) {
    std::fflush(stdout);  // live lines before waiting, also into a pipe (| grep, | tee)
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
        for (size_t k = 0; k < tracees_.size(); ++k) {
          watch::WatchSession* s = tracees_[k]->session.get();
          if (s == nullptr || !s->multiplexing() || !tracees_[k]->proc->alive()) {
            continue;
          }
          KW_ASSIGN_OR_RETURN(const bool rotated, s->Tick(absl::Now()));
          if (rotated) {
            KW_RETURN_IF_ERROR(AddFds(*s));
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
    if (deadline_ns != 0 && core::MonotonicNs() >= deadline_ns) {
      Stop(absl::StrFormat("--duration %gs elapsed", opts_.duration));
    }
    // SIGCHLD may have been merged with another: poll the processes every round.
    KW_RETURN_IF_ERROR(HandleChild());
  }
  DrainAll();
  RunInfo info;
  for (const auto& t : tracees_) {
    for (const watch::WatchSession* s : {t->session.get()}) {
      if (s != nullptr) {
        info.lost += s->lost();
        info.filtered += s->filtered();
        info.unrelated += s->unrelated();
      }
    }
    for (const auto& s : t->ended) {
      info.lost += s->lost();
      info.filtered += s->filtered();
      info.unrelated += s->unrelated();
    }
    info.spurious_traps += t->proc->spurious_traps();
  }
  if (!conditions_.empty()) {
    info.condition = opts_.condition;
    for (const watch::Condition& c : conditions_) {
      info.condition_evaluated += c.stats().evaluated;
      info.condition_matched += c.stats().matched;
      info.condition_undefined +=
          c.stats().missing_new + c.stats().missing_old + c.stats().division_by_zero;
    }
  }
  info.pid = proc.pid();
  info.seconds = static_cast<double>(core::MonotonicNs() - start_ns) / 1e9;
  info.stop_reason = stop_reason_;
  KW_RETURN_IF_ERROR(Release(info));
  if (exec_seen_) {
    info.stop_reason += "; the watches ended when the target called exec";
  }
  if (proc.forks() > 0) {
    notes_.push_back(absl::StrFormat(
        "the target forked %d child%s: not followed (-f follows them), each let go with none of "
        "kwatch's watches",
        proc.forks(), proc.forks() == 1 ? "" : "ren"));
  }
  if (group_ != nullptr) {
    for (const auto& t : tracees_) {
      RunInfo::Process p;
      p.pid = t->proc->pid();
      p.parent = t->parent;
      p.events = t->events;
      p.per_watch = t->per_watch;
      p.exit = t->proc->exit_info();
      info.processes.push_back(std::move(p));
    }
  }
  info.notes = notes_;
  info.exit = proc.exit_info();
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
  PrintSummary(stdout, opts_.json, first(), summary_, *profile_, info);
  std::fflush(stdout);
  if (recording_failed) {
    return 1;  // -o was not honoured (docs/recording.md)
  }
  if (proc.launched() && info.exit.has_value()) {
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

  // -f: the target and the children it forks share one tracer (core/process_group.h).
  std::unique_ptr<core::ProcessGroup> group;
  if (opts.follow_forks) {
    group = std::make_unique<core::ProcessGroup>(/*follow_forks=*/true);
  }
  core::LaunchOptions lo;
  lo.kill_on_exit = opts.kill_on_exit;
  lo.run_as = opts.run_as;
  KW_ASSIGN_OR_RETURN(std::unique_ptr<core::Process> proc,
                      core::Process::Start(opts.pid, opts.command, lo));
  if (group != nullptr) {
    group->Add(*proc);
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
  Runner runner(opts, std::move(group), std::move(proc), *std::move(session), so, sigfd.get(),
                writer.get(), std::move(conditions));
  auto code = runner.Run();
  if (!code.ok()) {
    runner.Abandon();
    return code.status();
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
  app.add_option("--kcore", opts.kcore,
                 "Kernel watches: read each event's value at drain time from this ELF core "
                 "file (kernel addresses in PT_LOAD segments) instead of /proc/kcore")
      ->default_str("/proc/kcore");
  app.add_flag("--kernel-accesses", opts.kernel_accesses,
               "Watch a process's memory for the accesses the kernel makes on its behalf "
               "(e.g. the buffer read(2) fills), with the kernel function that made each");
  app.add_option("--type", opts.kernel_type,
                 "Kernel watches: the C type of the watched symbol (e.g. 'struct task_struct'), "
                 "for member expressions; the layout comes from the kernel's BTF");
  app.add_flag("-f,--follow-forks", opts.follow_forks,
               "Watch the children the target forks too, and theirs, as strace -f: each is armed "
               "before it runs, its accesses carry its pid (text PID/TID, JSON pid) and the "
               "summary counts every process; after an exec the watches are armed again by "
               "expression in the new image. Without -f a child runs with none of kwatch's "
               "watches");
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
      !opts.kcore.empty()) {
    std::fprintf(stderr,
                 "kwatch: error: --system-map, --vmlinux, --type and --kcore are for kernel "
                 "watches (no -p and no command)\n");
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
