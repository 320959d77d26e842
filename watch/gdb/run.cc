#include "watch/gdb/run.h"

#include <fcntl.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <memory>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"
#include "core/base/syscall_status.h"
#include "core/base/unique_fd.h"
#include "core/ptrace/process.h"
#include "drmgr/slot_registry.h"
#include "watch/event_loop.h"
#include "watch/gdb/connection.h"
#include "watch/gdb/server.h"
#include "watch/process_setup.h"

namespace kwatch::watch::gdb {

namespace {

// What kwatch says when the server let go of gdb: gdb detached or went away, or a signal that
// ends kwatch ended the wait for gdb's next packet (`woken`; the session's loop reads it).
std::string LetGo(pid_t pid, bool woken, absl::string_view after) {
  if (woken) {
    return absl::StrCat("gdbserver: a signal ends kwatch while gdb holds pid ", pid,
                        " stopped: gdb's points removed, pid ", pid, " runs on");
  }
  return absl::StrCat("gdbserver: gdb detached; pid ", pid, " runs on", after);
}

// --stdio: gdb's pipe moves to descriptors of kwatch's own (close-on-exec), fd 0 becomes
// /dev/null and fd 1 kwatch's stderr, so that a launched program inherits neither end.
absl::StatusOr<std::unique_ptr<Connection>> TakeStdio() {
  core::UniqueFd in(::fcntl(0, F_DUPFD_CLOEXEC, 3));
  core::UniqueFd out(::fcntl(1, F_DUPFD_CLOEXEC, 3));
  if (!in || !out) {
    const int err = errno;
    return core::SyscallError(err, "fcntl(F_DUPFD_CLOEXEC) of stdin/stdout");
  }
  core::UniqueFd null(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (!null || ::dup2(null.get(), 0) < 0 || ::dup2(2, 1) < 0) {
    const int err = errno;
    return core::SyscallError(err, "dup2 (stdin from /dev/null, stdout to stderr)");
  }
  return std::make_unique<Connection>(std::move(in), std::move(out));
}

// What `kwatch slots` shows: kwatch's watches' decisions, with the registers they count as
// held outside kwatch shown as gdb's points (gdb's own allocator's requests, renumbered).
drmgr::AllocatorSnapshot SlotsSnapshot(const WatchSession* session, const HwPoints& gdb) {
  drmgr::AllocatorSnapshot snap;
  if (session != nullptr && session->allocator() != nullptr) {
    snap = session->allocator()->Snapshot();
  }
  constexpr uint64_t kGdbIds = uint64_t{1} << 32;
  const drmgr::AllocatorSnapshot g = gdb.allocator().Snapshot();
  for (drmgr::RequestView v : g.requests) {
    v.id.value += kGdbIds;
    snap.requests.push_back(std::move(v));
  }
  for (const drmgr::ScopeView& gs : g.scopes) {
    drmgr::ScopeView* into = nullptr;
    for (drmgr::ScopeView& s : snap.scopes) {
      if (s.scope == gs.scope) {
        into = &s;
      }
    }
    if (into == nullptr) {
      snap.scopes.push_back(gs);
      into = &snap.scopes.back();
      for (drmgr::SlotView& slot : into->slots) {
        for (drmgr::RequestId& id : slot.holders) {
          id.value += kGdbIds;
        }
      }
      continue;
    }
    for (const drmgr::SlotView& gslot : gs.slots) {
      if (gslot.state == drmgr::SlotState::kFree || gslot.state == drmgr::SlotState::kExternal) {
        continue;
      }
      for (drmgr::SlotView& slot : into->slots) {
        if (slot.state == drmgr::SlotState::kExternal || slot.state == drmgr::SlotState::kFree) {
          slot = gslot;
          for (drmgr::RequestId& id : slot.holders) {
            id.value += kGdbIds;
          }
          into->external = std::max(0, into->external - 1);
          break;
        }
      }
    }
  }
  return snap;
}

void Say(const GdbServerOptions& o, const std::string& line) {
  if (o.say) {
    o.say(line);
  }
}

// After the first stop: the loop of a session without kwatch watches.
absl::StatusOr<int> RunAlone(const GdbServerOptions& opts, core::UniqueFd sigfd,
                             core::ptrace::Process& proc, GdbServer& server, Connection& conn) {
  KW_ASSIGN_OR_RETURN(std::unique_ptr<EventLoop> loop, EventLoop::Create(std::move(sigfd)));
  KW_RETURN_IF_ERROR(loop->Add(conn.in_fd()));
  while (proc.alive()) {
    if (server.state() == GdbServer::State::kDetached) {
      KW_RETURN_IF_ERROR(proc.Detach());
      Say(opts, LetGo(proc.pid(), conn.woken(), ""));
      return 0;
    }
    KW_ASSIGN_OR_RETURN(const EventLoop::Ready ready, loop->Wait(absl::Milliseconds(50)));
    if (ready.stop_signal() != 0) {
      Say(opts, "stopped by a signal: detaching from the target");
      KW_RETURN_IF_ERROR(proc.Detach());
      return 0;
    }
    KW_ASSIGN_OR_RETURN(const std::vector<core::ptrace::ProcessEvent> events, proc.Poll());
    for (const core::ptrace::ProcessEvent& e : events) {
      if (e.kind == core::ptrace::ProcessEvent::Kind::kExec) {
        server.OnExec();
        KW_RETURN_IF_ERROR(proc.Resume(e.tid));
      }
    }
    if (!proc.alive()) {
      break;
    }
    KW_RETURN_IF_ERROR(server.PollConnection());
    if (server.state() != GdbServer::State::kServing) {
      (void)loop->Remove(conn.in_fd());
    }
  }
  const bool killed = server.state() == GdbServer::State::kKilled;
  if (proc.exit_info().has_value()) {
    KW_RETURN_IF_ERROR(server.ReportExit(*proc.exit_info()));
    if (!killed && proc.launched()) {
      return proc.exit_info()->ShellStatus();
    }
  }
  return 0;
}

// After the first stop: the loop of a session with kwatch's watches (TargetSet).
absl::StatusOr<int> RunWithWatches(const GdbServerOptions& opts, TargetSet& set, GdbServer& server,
                                   const Connection& conn) {
  core::ptrace::Process& proc = set.target_process();
  bool said_detached = server.state() != GdbServer::State::kServing;
  for (;;) {
    absl::StatusOr<bool> more = set.Step(absl::Milliseconds(50));
    if (!more.ok()) {
      set.Abandon();
      return more.status();
    }
    if (proc.alive()) {
      KW_RETURN_IF_ERROR(server.PollConnection());
    }
    if (!said_detached && proc.alive() && server.state() == GdbServer::State::kDetached) {
      said_detached = true;
      Say(opts, LetGo(proc.pid(), conn.woken(), " and kwatch goes on watching it"));
    }
    if (!*more) {
      break;
    }
  }
  const bool killed = server.state() == GdbServer::State::kKilled;
  server.SetSlotLender(nullptr);  // the watches end here
  KW_ASSIGN_OR_RETURN(const TargetSetEnd end, set.Finish());
  // gdb hears of the exit after kwatch's summary, which it shows (--stdio: kwatch's stderr
  // is gdb's, and gdb goes once the program has exited).
  if (!proc.alive() && proc.exit_info().has_value()) {
    KW_RETURN_IF_ERROR(server.ReportExit(*proc.exit_info()));
  }
  return killed ? 0 : end.exit_status.value_or(0);
}

}  // namespace

absl::StatusOr<int> RunGdbServer(GdbServerOptions opts, AccessSink* sink) {
  // gdb may close the connection at any time: a write then fails (EPIPE) instead of killing
  // kwatch with SIGPIPE while it still has a target to let go.
  ::signal(SIGPIPE, SIG_IGN);
  // The transport first: a port in use fails before any target is touched.
  std::optional<Listener> listener;
  std::unique_ptr<Connection> conn;
  if (opts.stdio) {
    KW_ASSIGN_OR_RETURN(conn, TakeStdio());
  } else {
    KW_ASSIGN_OR_RETURN(listener, Listener::Bind(opts.listen));
  }

  const bool watching = !opts.requests.empty();
  std::unique_ptr<TargetSet> set;
  std::unique_ptr<core::ptrace::Process> alone;
  core::UniqueFd alone_sigfd;
  core::ptrace::Process* proc = nullptr;
  if (watching) {
    if (sink == nullptr) {
      return absl::InvalidArgumentError("watches need a sink for their events");
    }
    ProcessSetupOptions po;
    po.pid = opts.pid;
    po.command = opts.command;
    po.launch = opts.launch;
    po.requests = std::move(opts.requests);
    po.session = opts.session;
    po.hold_stopped = true;
    KW_ASSIGN_OR_RETURN(ProcessSetup setup, SetUpProcessWatch(std::move(po)));
    KW_ASSIGN_OR_RETURN(
        set, TargetSet::Create(opts.target, setup.session_options, std::move(setup.sigfd),
                               std::move(setup.group), std::move(setup.proc),
                               std::move(setup.session), std::move(setup.conditions), *sink));
    proc = &set->target_process();
    if (opts.armed) {
      opts.armed(*set);
    }
  } else {
    KW_ASSIGN_OR_RETURN(alone_sigfd, BlockSessionSignals());
    KW_ASSIGN_OR_RETURN(alone, core::ptrace::Process::Start(opts.pid, opts.command, opts.launch));
    if (absl::Status s = alone->StopAll(); !s.ok()) {
      alone->Abandon();
      return s;
    }
    alone->HoldStopped();
    proc = alone.get();
  }
  auto abandon = [&] {
    if (set != nullptr) {
      set->Abandon();
    } else if (alone != nullptr) {
      alone->Abandon();
    }
  };
  Say(opts, absl::StrCat("gdbserver: ", proc->launched() ? "launched" : "attached to", " pid ",
                         proc->pid(), ", stopped"));

  // SIGINT, SIGTERM and SIGHUP (blocked, read by the session's loop) also end a wait for gdb:
  // for it to connect (the target is let go), or while it holds the target stopped (the
  // server lets go as if gdb had gone, and the loop then reads the signal and ends).
  sigset_t ending;
  sigemptyset(&ending);
  for (const int sig : {SIGINT, SIGTERM, SIGHUP}) {
    sigaddset(&ending, sig);
  }
  const core::UniqueFd wake(::signalfd(-1, &ending, SFD_CLOEXEC | SFD_NONBLOCK));
  if (listener.has_value()) {
    Say(opts, absl::StrCat("gdbserver: listening on port ", listener->port(),
                           " (gdb: target remote HOST:", listener->port(), ")"));
    absl::StatusOr<core::UniqueFd> c = listener->Accept(wake.get());
    if (!c.ok()) {
      const bool launched = proc->launched();
      abandon();
      if (c.status().code() == absl::StatusCode::kCancelled) {
        Say(opts, absl::StrCat("gdbserver: a signal ends kwatch before gdb connected; pid ",
                               proc->pid(), launched ? " killed (it never ran)" : " released"));
        return 0;
      }
      return c.status();
    }
    core::UniqueFd out(::fcntl(c->get(), F_DUPFD_CLOEXEC, 3));
    conn = std::make_unique<Connection>(*std::move(c), std::move(out));
    Say(opts, "gdbserver: gdb connected");
  }

  conn->set_wake_fd(wake.get());  // -1 (no signalfd): waits as before
  GdbServer server(*proc, *conn, /*attached=*/!proc->launched());
  if (absl::Status s = server.Start(); !s.ok()) {
    abandon();
    return s;
  }
  if (set != nullptr && opts.serving) {
    opts.serving(&server);
  }
  absl::Cleanup unserve = [&] {  // before the server's destructor
    if (set != nullptr && opts.serving) {
      opts.serving(nullptr);
    }
  };
  // `kwatch slots -p PID` shows kwatch's watches and gdb's points; gdb's points take registers
  // from kwatch's watches (debugger priority) and give them back.
  auto publish = [&] {
    const WatchSession* session = set != nullptr ? set->target_session() : nullptr;
    (void)drmgr::PublishSlots(proc->pid(), SlotsSnapshot(session, server.hw_points()),
                              opts.command_line);
  };
  server.SetSlotLender([&](int registers) -> absl::Status {
    if (set != nullptr && set->target_session() != nullptr &&
        set->target_session() == &set->first_session()) {
      absl::StatusOr<std::vector<std::string>> lines =
          set->first_session().LendSlots(registers, server.hw_points().DataRanges());
      // A page backend armed for a displaced watch claims its faults first: the server stays
      // the last of the process's interceptors.
      proc->RemoveInterceptor(&server);
      proc->AddInterceptor(&server);
      if (lines.ok()) {
        for (std::string& line : *lines) {
          set->Note(std::move(line));
        }
      } else if (lines.status().code() != absl::StatusCode::kFailedPrecondition) {
        return lines.status();
      }
    }
    publish();
    return absl::OkStatus();
  });
  publish();
  absl::Cleanup unpublish = [&server] {
    server.SetSlotLender(nullptr);
    drmgr::UnpublishSlots();
  };
  if (absl::Status s = server.ServeStopped(/*interrupted=*/false); !s.ok()) {
    abandon();
    return s;
  }
  if (absl::Status s = proc->ReleaseHold(); !s.ok()) {
    abandon();
    return s;
  }
  if (watching && server.state() == GdbServer::State::kDetached) {
    Say(opts, LetGo(proc->pid(), conn->woken(), " and kwatch goes on watching it"));
  }
  absl::StatusOr<int> code = watching
                                 ? RunWithWatches(opts, *set, server, *conn)
                                 : RunAlone(opts, std::move(alone_sigfd), *proc, server, *conn);
  if (!code.ok()) {
    abandon();
  }
  return code;
}

}  // namespace kwatch::watch::gdb
