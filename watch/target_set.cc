#include "watch/target_set.h"

#include <algorithm>
#include <csignal>
#include <cstring>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/base/clock.h"
#include "core/base/status_macros.h"

namespace kwatch::watch {

// A process of the session: the target, or (-f) a followed child.
struct TargetSet::Tracee {
  std::unique_ptr<core::ptrace::Process> proc;
  // Its watches now; nullptr when they ended (exec without -f, or not re-armed).
  std::unique_ptr<WatchSession> session;
  // Sessions of images it exec'd from (kept for their counts and, the target's first, for the
  // summary).
  std::vector<std::unique_ptr<WatchSession>> ended;
  pid_t parent = 0;  // 0: the target
  uint64_t events = 0;
  std::vector<uint64_t> per_watch;
  // Per watch, after an exec re-arm: the first image's address minus this image's (the summary
  // counts fields against the first image's layout). Empty: no difference.
  std::vector<uint64_t> rebase;
};

TargetSet::TargetSet(TargetSetOptions opts, const SessionOptions& session_opts,
                     core::UniqueFd sigfd, std::unique_ptr<core::ptrace::ProcessGroup> group,
                     std::vector<Condition> conditions, AccessSink& sink)
    : opts_(std::move(opts)),
      session_opts_(session_opts),
      sigfd_(std::move(sigfd)),
      group_(std::move(group)),
      conditions_(std::move(conditions)),
      sink_(sink) {}

TargetSet::~TargetSet() {
  if (guests_ != nullptr) {
    guests_->Abandon();  // while the processes are still traced
  }
}

absl::StatusOr<std::unique_ptr<TargetSet>> TargetSet::Create(
    const TargetSetOptions& opts, const SessionOptions& session_opts, core::UniqueFd sigfd,
    std::unique_ptr<core::ptrace::ProcessGroup> group,
    std::unique_ptr<core::ptrace::Process> target, std::unique_ptr<WatchSession> session,
    std::vector<Condition> conditions, AccessSink& sink) {
  std::unique_ptr<TargetSet> set(new TargetSet(opts, session_opts, std::move(sigfd),
                                               std::move(group), std::move(conditions), sink));
  set->watches_ = session->watches();
  set->summary_.emplace(set->watches_);
  for (const Watch& w : set->watches_) {
    if (const FollowedWatch* fw = session->followed(w.id); fw != nullptr) {
      RunInfo::Followed& f = set->followed_[w.id];
      f.watch_id = w.id;
      set->current_object_[w.id] = -1;
      if (!fw->parked) {
        f.objects.push_back({w.target.addr, {}});
        set->current_object_[w.id] = 0;
      }
    }
  }
  auto t = std::make_unique<Tracee>();
  t->proc = std::move(target);
  t->session = std::move(session);
  t->per_watch.assign(set->watches_.size(), 0);
  set->tracees_.push_back(std::move(t));
  if (absl::Status s = set->Init(); !s.ok()) {
    set->Abandon();
    return s;
  }
  return set;
}

absl::Status TargetSet::AddFds(const WatchSession& session) {
  for (int fd : session.Fds()) {
    KW_RETURN_IF_ERROR(loop_->Add(fd));
  }
  return absl::OkStatus();
}

absl::Status TargetSet::Init() {
  const WatchSession& session = *target().session;
  // A periodic tick drains samples below the wakeup threshold; multiplexed watches rotate
  // through the debug registers at each tick.
  const absl::Duration tick = session.multiplexing()
                                  ? std::min(EventLoop::kDefaultTick, session_opts_.mux_interval)
                                  : EventLoop::kDefaultTick;
  KW_ASSIGN_OR_RETURN(loop_, EventLoop::Create(std::move(sigfd_), tick));
  KW_RETURN_IF_ERROR(AddFds(session));
  start_ns_ =
      opts_.start_ns != 0 ? std::min(opts_.start_ns, core::MonotonicNs()) : core::MonotonicNs();
  deadline_ns_ = opts_.duration > 0 ? start_ns_ + static_cast<uint64_t>(opts_.duration * 1e9) : 0;
  std::vector<profile::WatchedObject> objects;
  for (const Watch& w : watches_) {
    objects.push_back(profile::ObjectForWatch(w));
  }
  profile::ProfileOptions popts;
  popts.start_ns = start_ns_;
  profile_.emplace(std::move(objects), popts);
  return absl::OkStatus();
}

core::ptrace::Process& TargetSet::target_process() const {
  return *target().proc;
}

const WatchSession* TargetSet::target_session() const {
  return target().session.get();
}

WatchSession& TargetSet::first_session() {
  return target().ended.empty() ? *target().session : *target().ended.front();
}

std::string TargetSet::Who(const Tracee& t) {
  return t.parent == 0 ? absl::StrCat("target ", t.proc->pid())
                       : absl::StrCat("followed child ", t.proc->pid());
}

void TargetSet::Note(std::string text) {
  AccessNote note;
  note.kind = AccessNote::Kind::kText;
  note.text = text;
  sink_.OnNote(note);
  notes_.push_back(std::move(text));
}

void TargetSet::Stop(absl::string_view reason) {
  if (!stopped_) {
    stopped_ = true;
    stop_reason_.assign(reason.data(), reason.size());
  }
}

void TargetSet::DrainAll() {
  for (const std::unique_ptr<Tracee>& t : tracees_) {
    DrainTracee(*t);
  }
  if (opts_.count > 0 && delivered_ >= opts_.count) {
    Stop(absl::StrCat("--count ", opts_.count, " reached"));
  }
}

void TargetSet::DrainTracee(Tracee& t) {
  if (t.session == nullptr || (stopped_ && opts_.count > 0 && delivered_ >= opts_.count)) {
    return;
  }
  WatchSession& session = *t.session;
  const bool own_session = &t == &target() && t.ended.empty();
  // --follow: the moves go between the events before and after them.
  const std::vector<FollowMove> moves = session.TakeMoves();
  size_t next_move = 0;
  const auto moves_until = [&](uint64_t time_ns) {
    for (; next_move < moves.size() && moves[next_move].time_ns <= time_ns; ++next_move) {
      OnMove(session, moves[next_move]);
    }
  };
  absl::Cleanup rest = [&] { moves_until(~uint64_t{0}); };
  session.Drain([&](const core::AccessEvent& ev) {
    moves_until(ev.time_ns);
    if (ev.watch_id >= watches_.size()) {
      // A watch a joined kwatch added: its events are its own.
      if (guests_ != nullptr && own_session) {
        guests_->OnGuestEvent(session, ev);
      }
      return;
    }
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
    if (ev.call != 0 && session.calls() != nullptr) {
      rebased = session.calls()->Rebase(ev);  // at its offset in the call's object
      counted = &rebased;
    } else if (!t.rebase.empty()) {
      rebased = ev;
      rebased.addr.value += t.rebase[ev.watch_id];
      rebased.access_addr.value += t.rebase[ev.watch_id];
      counted = &rebased;
    }
    if (auto f = followed_.find(ev.watch_id); f != followed_.end()) {
      // Counted on its object, and against the first object's layout like the others.
      const int at = current_object_[ev.watch_id];
      if (at >= 0) {
        RunInfo::FollowedObject& o = f->second.objects[static_cast<size_t>(at)];
        o.counts.Add(ev.kind);
        rebased = ev;
        const uint64_t shift = watches_[ev.watch_id].target.addr.value - o.addr.value;
        rebased.addr.value += shift;
        rebased.access_addr.value += shift;
        counted = &rebased;
      }
    }
    summary_->Add(*counted);
    profile_->Add(*counted);
    if (absl::Status s = sink_.OnEvent(session, *summary_, ev, *counted); !s.ok()) {
      Stop(s.message());
    }
  });
  if (CallWatches* calls = session.calls(); calls != nullptr) {
    // Calls that ended before this drain: their events were all in it.
    for (CallRecord& r : calls->TakeEnded()) {
      AccessNote note;
      note.kind = AccessNote::Kind::kCallEnded;
      note.pid = session.process().pid();
      note.call = std::move(r);
      note.text = calls->FunctionOf(note.call->watch_id);
      note.expr = session.watches()[note.call->watch_id].target.display;
      sink_.OnNote(note);
    }
  }
}

void TargetSet::OnMove(WatchSession& session, const FollowMove& m) {
  ++moves_;
  RunInfo::Followed& f = followed_[m.watch_id];
  f.watch_id = m.watch_id;
  f.moves.push_back(m);
  int& at = current_object_[m.watch_id];
  at = -1;
  if (m.to.has_value()) {
    for (size_t i = 0; i < f.objects.size() && at < 0; ++i) {
      if (f.objects[i].addr == *m.to) {
        at = static_cast<int>(i);  // back to an object it watched before
      }
    }
    if (at < 0) {
      f.objects.push_back({*m.to, {}});
      at = static_cast<int>(f.objects.size() - 1);
    }
  }
  AccessNote note;
  note.kind = AccessNote::Kind::kMoved;
  note.pid = session.process().pid();
  note.move = m;
  note.display = session.watches()[m.watch_id].target.display;
  note.site = session.symbolizer().Locate(m.ip);
  sink_.OnNote(note);
}

bool TargetSet::AnyChildAlive() const {
  for (size_t i = 1; i < tracees_.size(); ++i) {
    if (tracees_[i]->proc->alive()) {
      return true;
    }
  }
  return false;
}

absl::Status TargetSet::PollAll() {
  // Children adopted meanwhile are polled in the same round (the vector may grow).
  for (size_t i = 0; i < tracees_.size(); ++i) {  // NOLINT(modernize-loop-convert)
    Tracee& t = *tracees_[i];
    if (!t.proc->alive()) {
      continue;
    }
    KW_ASSIGN_OR_RETURN(const std::vector<core::ptrace::ProcessEvent> events, t.proc->Poll());
    KW_RETURN_IF_ERROR(HandleEvents(t, events));
  }
  const core::ptrace::Process& main = *target().proc;
  if (!main.alive() && !AnyChildAlive()) {
    std::string reason =
        main.exit_info()->signaled
            ? absl::StrCat("target killed by ", sigabbrev_np(main.exit_info()->signal))
            : "target exited";
    if (tracees_.size() > 1) {
      absl::StrAppend(&reason, "; its followed children ended");
    }
    Stop(reason);
  }
  return absl::OkStatus();
}

absl::Status TargetSet::HandleEvents(Tracee& t,
                                     const std::vector<core::ptrace::ProcessEvent>& events) {
  core::ptrace::Process& proc = *t.proc;
  for (const core::ptrace::ProcessEvent& e : events) {
    if (guests_ != nullptr && t.parent == 0) {
      guests_->OnTargetEvent(e);
    }
    switch (e.kind) {
      case core::ptrace::ProcessEvent::Kind::kExited:
        if (t.parent != 0) {
          DrainTracee(t);  // what its rings still hold
          AccessNote note;
          note.kind = AccessNote::Kind::kChildExited;
          note.pid = proc.pid();
          note.parent = t.parent;
          note.exit = proc.exit_info();
          sink_.OnNote(note);
        }
        break;
      case core::ptrace::ProcessEvent::Kind::kExec:
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
          AccessNote note;
          note.kind = AccessNote::Kind::kTargetExec;
          note.pid = proc.pid();
          sink_.OnNote(note);
        } else {
          Note(absl::StrCat(Who(t), " called exec: its watches ended there"));
        }
        KW_RETURN_IF_ERROR(proc.Resume(e.tid));
        break;
      case core::ptrace::ProcessEvent::Kind::kThreadExited:
        if (t.session != nullptr && t.session->calls() != nullptr) {
          t.session->calls()->OnThreadExit(e.tid);
        }
        break;
      case core::ptrace::ProcessEvent::Kind::kForked:
        if (e.child != 0) {
          KW_RETURN_IF_ERROR(AdoptChild(t, e.child));
        }
        break;
      case core::ptrace::ProcessEvent::Kind::kGroupStop: {
        AccessNote note;
        note.kind = AccessNote::Kind::kGroupStop;
        note.pid = proc.pid();
        note.parent = t.parent;
        note.signal = e.signal;
        sink_.OnNote(note);
        break;
      }
      default:
        break;
    }
  }
  return absl::OkStatus();
}

absl::Status TargetSet::AdoptChild(Tracee& parent, pid_t pid) {
  const uint64_t t0 = core::MonotonicNs();
  std::unique_ptr<core::ptrace::Process> child = group_->TakeChild(pid);
  if (child == nullptr) {
    return absl::OkStatus();
  }
  WatchSession* from = parent.session.get();
  if (from == nullptr || stopped_) {
    // Nothing of kwatch's is in it (cleaned at its fork): it goes unwatched, detached.
    Note(absl::StrCat("child ", pid, " of ", parent.proc->pid(), " not followed: ",
                      stopped_ ? "kwatch was stopping" : "its parent's watches had ended"));
    return child->Detach();
  }
  auto session = WatchSession::ForFork(*from, *child);
  if (!session.ok()) {
    (void)child->Detach();
    return session.status();
  }
  if (absl::Status s = (*session)->Arm(); !s.ok()) {
    (void)child->Detach();
    return {s.code(),
            absl::StrCat("arming the watches in followed child ", pid, ": ", s.message())};
  }
  auto t = std::make_unique<Tracee>();
  t->parent = parent.proc->pid();
  t->proc = std::move(child);
  t->session = *std::move(session);
  t->per_watch.assign(watches_.size(), 0);
  t->rebase = parent.rebase;  // the same image as its parent
  KW_RETURN_IF_ERROR(AddFds(*t->session));
  AccessNote note;
  note.kind = AccessNote::Kind::kChildFollowed;
  note.pid = pid;
  note.parent = t->parent;
  note.arm_us = static_cast<double>(core::MonotonicNs() - t0) / 1e3;
  sink_.OnNote(note);
  tracees_.push_back(std::move(t));
  return absl::OkStatus();
}

void TargetSet::Rearm(Tracee& t) {
  const std::string who = Who(t);
  std::string what;
  // Up to the new program's entry point: its shared libraries are mapped then.
  absl::Status s = t.proc->RunToEntry();
  std::unique_ptr<WatchSession> session;
  std::vector<uint64_t> rebase(watches_.size(), 0);
  bool moved = false;
  if (s.ok()) {
    std::vector<WatchRequest> requests;
    for (const Watch& w : watches_) {
      requests.push_back(w.request);
    }
    auto created = WatchSession::Create(*t.proc, std::move(requests), session_opts_);
    s = created.status();
    if (s.ok()) {
      session = *std::move(created);
    }
  }
  for (size_t i = 0; s.ok() && i < watches_.size(); ++i) {
    const core::symbols::ResolvedExpr& was = watches_[i].target;
    const core::symbols::ResolvedExpr& now = session->watches()[i].target;
    if (now.type_name != was.type_name || now.length != was.length) {
      s = absl::FailedPreconditionError(absl::StrFormat(
          "'%s' is %s (%d bytes) in the new image, %s (%d bytes) in the first: one summary "
          "cannot count both layouts",
          watches_[i].request.expr, now.type_name, now.length, was.type_name, was.length));
    }
    rebase[i] = was.addr.value - now.addr.value;
    moved = moved || rebase[i] != 0;
  }
  if (s.ok() && moved && opts_.recording) {
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
    for (const Watch& w : session->watches()) {
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

absl::StatusOr<bool> TargetSet::Step(absl::Duration timeout) {
  if (!started_) {
    started_ = true;
    // The target may already have ended (or exec'd) while arming.
    KW_RETURN_IF_ERROR(PollAll());
  }
  if (stopped_) {
    return false;
  }
  sink_.BeforeWait();
  KW_ASSIGN_OR_RETURN(const EventLoop::Ready ready, loop_->Wait(timeout));
  bool drain = false;
  for (const EventLoop::Event& e : ready.events) {
    switch (e.kind) {
      case EventLoop::Event::Kind::kSignal:
        if (e.value == SIGCHLD) {
          drain = true;
          KW_RETURN_IF_ERROR(PollAll());
        } else {
          Stop(absl::StrCat("interrupted by ", sigabbrev_np(e.value)));
        }
        break;
      case EventLoop::Event::Kind::kTick:
        drain = true;
        for (const std::unique_ptr<Tracee>& t : tracees_) {
          WatchSession* s = t->session.get();
          if (s == nullptr || !s->multiplexing() || !t->proc->alive()) {
            continue;
          }
          KW_ASSIGN_OR_RETURN(const bool rotated, s->Tick(absl::Now()));
          if (rotated) {
            KW_RETURN_IF_ERROR(AddFds(*s));
            ++rotations_;
          }
        }
        break;
      case EventLoop::Event::Kind::kFd:
        drain = true;
        break;
    }
  }
  if (drain) {
    DrainAll();
    if (absl::Status s = sink_.OnDrained(); !s.ok()) {
      Stop(s.message());
    }
  }
  if (guests_ != nullptr && target().session != nullptr && target().session->armed() &&
      target().proc->alive()) {
    for (std::string& line : guests_->Serve(*target().session)) {
      Note(std::move(line));
      ++guest_changes_;
    }
  }
  if (deadline_ns_ != 0 && core::MonotonicNs() >= deadline_ns_) {
    Stop(absl::StrFormat("--duration %gs elapsed", opts_.duration));
  }
  // SIGCHLD may have been merged with another: poll the processes every round.
  KW_RETURN_IF_ERROR(PollAll());
  return !stopped_;
}

absl::Status TargetSet::Release(RunInfo& info) {
  if (group_ != nullptr) {
    // Forks from now on are cleaned and let go; children already announced are let go too.
    group_->set_follow_forks(false);
    (void)PollAll();
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
    core::ptrace::Process& p = *tracees_[i]->proc;
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
    AccessNote note;
    note.kind = AccessNote::Kind::kChildrenDetached;
    note.count = detached;
    sink_.OnNote(note);
  }
  core::ptrace::Process& main = *target().proc;
  if (main.alive()) {
    if (kill) {
      KW_RETURN_IF_ERROR(main.Kill());
      info.stop_reason += "; target killed (--kill-on-exit)";
    } else {
      KW_RETURN_IF_ERROR(main.Detach());
      AccessNote note;
      note.kind = AccessNote::Kind::kDetached;
      note.pid = main.pid();
      sink_.OnNote(note);
    }
  }
  return absl::OkStatus();
}

void TargetSet::Abandon() {
  if (guests_ != nullptr) {
    guests_->Abandon();
  }
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

absl::StatusOr<TargetSetEnd> TargetSet::Finish() {
  if (WatchSession* s = target().session.get(); s != nullptr && s->calls() != nullptr) {
    (void)s->calls()->Remove();  // calls still running end: their events are in this drain
  }
  DrainAll();
  TargetSetEnd end;
  RunInfo& info = end.info;
  for (const auto& t : tracees_) {
    if (const WatchSession* s = t->session.get(); s != nullptr) {
      info.lost += s->lost();
      info.filtered += s->filtered();
      info.unrelated += s->unrelated();
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
    for (const Condition& c : conditions_) {
      info.condition_evaluated += c.stats().evaluated;
      info.condition_matched += c.stats().matched;
      info.condition_undefined +=
          c.stats().missing_new + c.stats().missing_old + c.stats().division_by_zero;
    }
  }
  core::ptrace::Process& proc = *target().proc;
  info.pid = proc.pid();
  info.seconds = static_cast<double>(core::MonotonicNs() - start_ns_) / 1e9;
  info.stop_reason = stop_reason_;
  if (guests_ != nullptr && target().session != nullptr) {
    RunInfo told = info;
    told.exit = proc.exit_info();
    guests_->EndAll(*target().session, told);
  }
  KW_RETURN_IF_ERROR(Release(info));
  if (exec_seen_) {
    info.stop_reason += "; the watches ended when the target called exec";
  }
  uint64_t restores = 0;
  uint64_t kept = 0;
  for (const auto& t : tracees_) {
    const auto add = [&](const WatchSession& s) {
      restores += s.segv_handler_restores();
      kept += s.segv_handler_resets_kept();
    };
    if (t->session != nullptr) {
      add(*t->session);
    }
    for (const auto& s : t->ended) {
      add(*s);
    }
  }
  if (restores > 0) {
    notes_.push_back(absl::StrFormat(
        "restored the program's SIGSEGV handler %d time%s (the kernel reset it when a watched "
        "page was touched with SIGSEGV blocked)",
        restores, restores == 1 ? "" : "s"));
  }
  if (kept > 0) {
    notes_.push_back(absl::StrFormat(
        "found the program's SIGSEGV handler reset %d time%s at a fault on a watched page: not "
        "put back, as it was installed with SA_RESETHAND (a handler for one fault; kwatch cannot "
        "tell that reset from the kernel's at a fault with SIGSEGV blocked)",
        kept, kept == 1 ? "" : "s"));
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
  info.armed_at = opts_.armed_at;
  for (auto& [id, f] : followed_) {
    if (const FollowedWatch* fw = first_session().followed(id); fw != nullptr) {
      for (const core::symbols::PointerLoad& p : fw->pointers) {
        f.pointers.push_back(p.display);
      }
      f.parked = fw->parked;
      f.why = fw->why;
    }
    info.followed.push_back(f);
  }
  info.exit = proc.exit_info();
  if (proc.launched() && info.exit.has_value()) {
    end.exit_status = info.exit->ShellStatus();
  }
  sink_.OnSummary(AccessSummary{first_session(), *summary_, *profile_, info});
  return end;
}

}  // namespace kwatch::watch
