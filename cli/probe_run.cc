#include "cli/probe_run.h"

#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <ctime>

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"
#include "core/store/trace_records.h"
#include "core/base/syscall_status.h"

#ifndef KWATCH_VERSION
#define KWATCH_VERSION "dev"
#endif

namespace kwatch::cli {

namespace {

// Reads every signal waiting in the signalfd (several per read: one read is the common case).
template <typename F>
void DrainSignals(int sigfd, F&& on_signal) {
  std::array<signalfd_siginfo, 16> si{};
  for (;;) {
    const ssize_t n = read(sigfd, si.data(), sizeof(si));
    if (n < static_cast<ssize_t>(sizeof(signalfd_siginfo))) {
      return;
    }
    const size_t count = static_cast<size_t>(n) / sizeof(signalfd_siginfo);
    for (size_t i = 0; i < count; ++i) {
      on_signal(static_cast<int>(si[i].ssi_signo));
    }
    if (count < si.size()) {
      return;
    }
  }
}

}  // namespace

uint64_t NowNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ULL + static_cast<uint64_t>(ts.tv_nsec);
}

int ReadStopSignal(int sigfd) {
  int stop = 0;
  DrainSignals(sigfd, [&stop](int sig) {
    if (sig != SIGCHLD && stop == 0) {
      stop = sig;
    }
  });
  return stop;
}

absl::StatusOr<std::unique_ptr<ProbeLoop>> ProbeLoop::Create(int sigfd) {
  auto loop = std::unique_ptr<ProbeLoop>(new ProbeLoop());
  loop->sigfd_ = sigfd;
  loop->epfd_.Reset(epoll_create1(EPOLL_CLOEXEC));
  if (!loop->epfd_) {
    const int err = errno;
    return core::SyscallError(err, "epoll_create1");
  }
  loop->tick_.Reset(timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK));
  if (!loop->tick_) {
    const int err = errno;
    return core::SyscallError(err, "timerfd_create");
  }
  itimerspec its{};
  its.it_interval.tv_nsec = 50'000'000;
  its.it_value.tv_nsec = 50'000'000;
  if (timerfd_settime(loop->tick_.get(), 0, &its, nullptr) != 0) {
    const int err = errno;
    return core::SyscallError(err, "timerfd_settime");
  }
  KW_RETURN_IF_ERROR(loop->Add(sigfd));
  KW_RETURN_IF_ERROR(loop->Add(loop->tick_.get()));
  return loop;
}

absl::Status ProbeLoop::Add(int fd) {
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = fd;
  if (epoll_ctl(epfd_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) {
    const int err = errno;
    return core::SyscallError(err, "epoll_ctl(ADD)");
  }
  return absl::OkStatus();
}

absl::StatusOr<ProbeLoop::Ready> ProbeLoop::Wait(int timeout_ms) {
  Ready r;
  std::array<epoll_event, 64> evs{};
  std::fflush(stdout);  // live lines before waiting, also into a pipe (| grep, | tee)
  const int n = epoll_wait(epfd_.get(), evs.data(), static_cast<int>(evs.size()), timeout_ms);
  if (n < 0) {
    const int err = errno;
    if (err == EINTR) {
      return r;
    }
    return core::SyscallError(err, "epoll_wait");
  }
  for (int i = 0; i < n; ++i) {
    const int fd = evs[static_cast<size_t>(i)].data.fd;
    if (fd == sigfd_) {
      DrainSignals(sigfd_, [&r](int sig) {
        if (sig == SIGCHLD) {
          r.child = true;
        } else if (r.stop_signal == 0) {
          r.stop_signal = sig;
        }
      });
    } else if (fd == tick_.get()) {
      uint64_t ticks = 0;
      (void)!read(fd, &ticks, sizeof(ticks));
      r.tick = true;
    } else {
      r.fds.push_back(fd);
    }
  }
  return r;
}

absl::StatusOr<std::unique_ptr<core::TraceWriter>> OpenRecording(const ProbeCmdOptions& opts,
                                                                 const ProbeSet& set, pid_t pid,
                                                                 uint64_t load_bias) {
  if (opts.output.empty()) {
    return std::unique_ptr<core::TraceWriter>();
  }
  core::SessionRecord rec = core::SessionRecordForThisHost();
  rec.command_line = opts.command_line;
  rec.pid = pid;
  rec.kwatch_version = KWATCH_VERSION;
  rec.mode = "probe";
  rec.backend = opts.backend;
  KW_ASSIGN_OR_RETURN(std::unique_ptr<core::TraceWriter> w,
                      core::TraceWriter::Create(opts.output, rec));
  KW_RETURN_IF_ERROR(AddProbes(*w, set.probes, load_bias));
  return w;
}

bool FinishRecording(core::TraceWriter* writer, const HitSink& sink, const ProbeRunInfo& info,
                     const std::string& path) {
  if (writer == nullptr) {
    return true;
  }
  if (!sink.record_error().ok()) {
    std::fprintf(stderr, "kwatch: error: recording to %s failed: %s\n", path.c_str(),
                 std::string(sink.record_error().message()).c_str());
    if (!writer->location_lost()) {  // never claim a file that no longer exists
      const std::string& where = writer->moved_to().empty() ? path : writer->moved_to();
      std::fprintf(stderr,
                   "kwatch: the recording %s holds the hits committed before the failure; "
                   "`kwatch report %s` reads it\n",
                   where.c_str(), where.c_str());
    }
    return false;
  }
  core::SessionEnd end;
  if (info.exit.has_value()) {
    end.exit_status = info.exit->ShellStatus();
  }
  end.exit_reason = info.stop_reason;
  if (absl::Status s = writer->Finish(end); !s.ok()) {
    std::fprintf(stderr, "kwatch: error: %s\n", std::string(s.message()).c_str());
    return false;
  }
  if (!writer->finish_warning().empty()) {
    std::fprintf(stderr, "kwatch: warning: %s\n", writer->finish_warning().c_str());
  }
  std::fprintf(stderr, "kwatch: recorded %llu probe hits to %s (kwatch report %s)\n",
               static_cast<unsigned long long>(writer->hits_committed()), path.c_str(),
               path.c_str());
  return true;
}

}  // namespace kwatch::cli
