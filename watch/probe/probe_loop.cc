#include "watch/probe/probe_loop.h"

#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <ctime>

#include "core/base/status_macros.h"
#include "core/base/syscall_status.h"

namespace kwatch::watch::probe {

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

}  // namespace kwatch::watch::probe
