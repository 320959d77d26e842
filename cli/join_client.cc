#include "cli/join_client.h"

#include <poll.h>
#include <pthread.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <string>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "core/base/clock.h"
#include "core/base/syscall_status.h"
#include "core/base/unique_fd.h"

namespace kwatch::cli {

namespace {

// What a joined session cannot do yet, by option; nullptr when `opts` can join.
const char* UnsupportedOption(const WatchOptions& opts) {
  if (opts.exec) {
    return "--exec";
  }
  if (opts.stack) {
    return "--stack";
  }
  if (opts.follow_forks) {
    return "-f/--follow-forks";
  }
  if (opts.stop || (opts.backend != "auto" && !opts.backend.empty())) {
    return "--backend/--stop (a joined watch runs in the backend of the session it joins)";
  }
  if (!opts.overcommit.empty()) {
    return "--overcommit (the session joined decides what its registers do)";
  }
  if (opts.kill_on_exit) {
    return "--kill-on-exit";
  }
  return nullptr;
}

}  // namespace

absl::Status CannotJoinYet(absl::string_view command, pid_t pid, const KwatchTracer& tracer) {
  return absl::FailedPreconditionError(absl::StrCat(
      "pid ", pid, " is traced by another kwatch session (kwatch pid ", tracer.pid, "), and ",
      command,
      " cannot join another kwatch's session yet: only watches (`kwatch --write/--rw/--read "
      "EXPR -p ",
      pid, "`) and probes (`kwatch probe SPEC -p ", pid,
      "`) can; end that session first, or run this in it"));
}

absl::StatusOr<int> JoinWatch(const WatchOptions& opts, const KwatchTracer& tracer) {
  const pid_t pid = *opts.pid;
  if (const char* what = UnsupportedOption(opts); what != nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("pid ", pid, " is traced by another kwatch session (kwatch pid ", tracer.pid,
                     "), which this kwatch would join, but ", what,
                     " cannot join a session yet; drop it, or end that session first"));
  }
  // The session's signals are ours to handle: asking the session to end our watches.
  sigset_t set;
  sigemptyset(&set);
  for (const int sig : {SIGINT, SIGTERM, SIGHUP}) {
    sigaddset(&set, sig);
  }
  if (const int err = ::pthread_sigmask(SIG_BLOCK, &set, nullptr); err != 0) {
    return core::SyscallError(err, "pthread_sigmask");
  }
  core::UniqueFd sigfd(::signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK));
  if (!sigfd.valid()) {
    const int err = errno;
    return core::SyscallError(err, "signalfd");
  }
  absl::StatusOr<core::UniqueFd> sock = ConnectJoinSocket(tracer, pid);
  if (!sock.ok()) {
    return sock.status();
  }
  const int fd = sock->get();
  std::string request = "kwatch-join 1\n";
  absl::StrAppend(&request, "kind ", opts.read ? "read" : opts.rw ? "rw" : "write", "\n");
  if (opts.len.has_value()) {
    absl::StrAppend(&request, "len ", *opts.len, "\n");
  }
  absl::StrAppend(&request, "json ", opts.json ? 1 : 0, "\nquiet ", opts.quiet ? 1 : 0, "\n");
  if (opts.count > 0) {
    absl::StrAppend(&request, "count ", opts.count, "\n");
  }
  for (const std::string& e : opts.exprs) {
    if (absl::StrContains(e, '\n')) {
      return absl::InvalidArgumentError(absl::StrCat("'", e, "': an expression has no newline"));
    }
    absl::StrAppend(&request, "expr ", e, "\n");
  }
  if (!opts.condition.empty()) {
    if (absl::StrContains(opts.condition, '\n')) {
      return absl::InvalidArgumentError("--if: a condition has no newline");
    }
    absl::StrAppend(&request, "if ", opts.condition, "\n");
  }
  if (!opts.output.empty()) {
    // The session writes the recording (as this uid): where this kwatch was asked, made absolute.
    std::error_code ec;
    const std::filesystem::path abs = std::filesystem::absolute(opts.output, ec);
    if (ec || absl::StrContains(abs.string(), '\n')) {
      return absl::InvalidArgumentError(
          absl::StrCat("-o ", opts.output, ": not a path this kwatch can pass on"));
    }
    absl::StrAppend(&request, "output ", abs.string(), "\ncommand ",
                    absl::StrReplaceAll(opts.command_line, {{"\n", " "}}), "\n");
  }
  request += "go\n";
  if (absl::Status s = SendAll(fd, request); !s.ok()) {
    return s;
  }
  const uint64_t deadline =
      opts.duration > 0 ? core::MonotonicNs() + static_cast<uint64_t>(opts.duration * 1e9) : 0;
  bool asked_end = false;
  std::string in;
  std::array<char, 65536> buf{};
  while (true) {
    int timeout_ms = -1;
    if (deadline != 0 && !asked_end) {
      const uint64_t now = core::MonotonicNs();
      timeout_ms = now >= deadline ? 0 : static_cast<int>((deadline - now) / 1'000'000 + 1);
    }
    std::array<pollfd, 2> fds{pollfd{fd, POLLIN, 0}, pollfd{sigfd.get(), POLLIN, 0}};
    if (::poll(fds.data(), fds.size(), timeout_ms) < 0) {
      const int err = errno;
      if (err == EINTR) {
        continue;
      }
      return core::SyscallError(err, "poll");
    }
    std::string end_reason;
    if ((fds[1].revents & POLLIN) != 0) {
      signalfd_siginfo si{};
      if (::read(sigfd.get(), &si, sizeof(si)) == static_cast<ssize_t>(sizeof(si))) {
        end_reason = absl::StrCat("interrupted by ", sigabbrev_np(static_cast<int>(si.ssi_signo)));
      }
    }
    if (deadline != 0 && core::MonotonicNs() >= deadline) {
      end_reason = absl::StrFormat("--duration %gs elapsed", opts.duration);
    }
    if (!end_reason.empty() && !asked_end) {
      asked_end = true;
      (void)SendAll(fd, absl::StrCat("end ", end_reason, "\n"));
    }
    if ((fds[0].revents & (POLLIN | POLLHUP | POLLERR)) == 0) {
      continue;
    }
    const ssize_t n = ::recv(fd, buf.data(), buf.size(), 0);
    if (n < 0) {
      const int err = errno;
      if (err == EINTR) {
        continue;
      }
      return core::SyscallError(err, "recv (kwatch control socket)");
    }
    if (n == 0) {
      std::fflush(stdout);
      return absl::UnavailableError(
          absl::StrCat("the kwatch session this kwatch joined (kwatch pid ", tracer.pid,
                       ") went away without ending its watches (killed?); they went with it"));
    }
    in.append(buf.data(), static_cast<size_t>(n));
    while (std::optional<JoinFrame> f = TakeFrame(in)) {
      if (f->channel == 'O') {
        std::fwrite(f->payload.data(), 1, f->payload.size(), stdout);
        std::fflush(stdout);
      } else if (f->channel == 'E') {
        std::fflush(stdout);
        std::fwrite(f->payload.data(), 1, f->payload.size(), stderr);
        std::fflush(stderr);
      } else if (f->channel == 'X') {
        int code = 0;
        (void)absl::SimpleAtoi(f->payload, &code);
        std::fflush(stdout);
        return code;
      }
    }
  }
}

}  // namespace kwatch::cli
