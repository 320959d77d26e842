#include "watch/event_loop.h"

#include <pthread.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <climits>
#include <csignal>
#include <ctime>

#include "core/base/status_macros.h"
#include "core/base/syscall_status.h"

namespace kwatch::watch {

namespace {

constexpr std::array<int, 4> kSessionSignals = {SIGINT, SIGTERM, SIGHUP, SIGCHLD};

// Reads every signal waiting in `sigfd` (several per read: one read is the common case).
template <typename F>
void DrainSignals(int sigfd, F&& on_signal) {
  std::array<signalfd_siginfo, 16> si{};
  for (;;) {
    const ssize_t n = ::read(sigfd, si.data(), sizeof(si));
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

// epoll_wait's timeout in ms: 0 for none, -1 for an infinite one.
int TimeoutMs(absl::Duration timeout) {
  if (timeout == absl::InfiniteDuration()) {
    return -1;
  }
  return static_cast<int>(
      std::clamp<int64_t>(absl::ToInt64Milliseconds(timeout), 0, int64_t{INT_MAX}));
}

}  // namespace

absl::StatusOr<core::UniqueFd> BlockSessionSignals() {
  sigset_t mask;
  sigemptyset(&mask);
  for (const int sig : kSessionSignals) {
    sigaddset(&mask, sig);
  }
  pthread_sigmask(SIG_BLOCK, &mask, nullptr);
  core::UniqueFd sigfd(::signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK));
  if (!sigfd) {
    const int err = errno;
    return core::SyscallError(err, "signalfd");
  }
  return sigfd;
}

bool IsStopSignal(int sig) {
  return sig == SIGINT || sig == SIGTERM || sig == SIGHUP;
}

absl::StatusOr<std::unique_ptr<EventLoop>> EventLoop::Create(core::UniqueFd sigfd,
                                                             absl::Duration tick) {
  auto loop = std::unique_ptr<EventLoop>(new EventLoop());
  loop->sigfd_ = std::move(sigfd);
  loop->epfd_.Reset(::epoll_create1(EPOLL_CLOEXEC));
  if (!loop->epfd_) {
    const int err = errno;
    return core::SyscallError(err, "epoll_create1");
  }
  loop->tick_.Reset(::timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK));
  if (!loop->tick_) {
    const int err = errno;
    return core::SyscallError(err, "timerfd_create");
  }
  const int64_t tick_ns = std::max<int64_t>(1, absl::ToInt64Nanoseconds(tick));
  itimerspec its{};
  its.it_interval.tv_sec = tick_ns / 1'000'000'000;
  its.it_interval.tv_nsec = tick_ns % 1'000'000'000;
  its.it_value = its.it_interval;
  if (::timerfd_settime(loop->tick_.get(), 0, &its, nullptr) != 0) {
    const int err = errno;
    return core::SyscallError(err, "timerfd_settime");
  }
  KW_RETURN_IF_ERROR(loop->Add(loop->sigfd_.get()));
  KW_RETURN_IF_ERROR(loop->Add(loop->tick_.get()));
  return loop;
}

absl::Status EventLoop::Add(int fd) {
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = fd;
  if (::epoll_ctl(epfd_.get(), EPOLL_CTL_ADD, fd, &ev) != 0 && errno != EEXIST) {
    const int err = errno;
    return core::SyscallError(err, "epoll_ctl(ADD)");
  }
  return absl::OkStatus();
}

absl::Status EventLoop::Remove(int fd) {
  if (::epoll_ctl(epfd_.get(), EPOLL_CTL_DEL, fd, nullptr) != 0 && errno != ENOENT) {
    const int err = errno;
    return core::SyscallError(err, "epoll_ctl(DEL)");
  }
  return absl::OkStatus();
}

bool EventLoop::Ready::child() const {
  return std::any_of(events.begin(), events.end(), [](const Event& e) {
    return e.kind == Event::Kind::kSignal && e.value == SIGCHLD;
  });
}

int EventLoop::Ready::stop_signal() const {
  for (const Event& e : events) {
    if (e.kind == Event::Kind::kSignal && IsStopSignal(e.value)) {
      return e.value;
    }
  }
  return 0;
}

bool EventLoop::Ready::tick() const {
  return std::any_of(events.begin(), events.end(),
                     [](const Event& e) { return e.kind == Event::Kind::kTick; });
}

absl::StatusOr<EventLoop::Ready> EventLoop::Wait(absl::Duration timeout) {
  Ready r;
  std::array<epoll_event, 64> evs{};
  const int n =
      ::epoll_wait(epfd_.get(), evs.data(), static_cast<int>(evs.size()), TimeoutMs(timeout));
  if (n < 0) {
    const int err = errno;
    if (err == EINTR) {
      return r;
    }
    return core::SyscallError(err, "epoll_wait");
  }
  for (int i = 0; i < n; ++i) {
    const int fd = evs[static_cast<size_t>(i)].data.fd;
    if (fd == sigfd_.get()) {
      DrainSignals(sigfd_.get(), [&r](int sig) {
        r.events.push_back({Event::Kind::kSignal, sig});
      });
    } else if (fd == tick_.get()) {
      uint64_t ticks = 0;  // how many intervals passed: not used
      const ssize_t got = ::read(fd, &ticks, sizeof(ticks));
      (void)got;
      r.events.push_back({Event::Kind::kTick, 0});
    } else {
      r.events.push_back({Event::Kind::kFd, fd});
    }
  }
  return r;
}

int EventLoop::TakeStopSignal() {
  int stop = 0;
  DrainSignals(sigfd_.get(), [&stop](int sig) {
    if (stop == 0 && IsStopSignal(sig)) {
      stop = sig;
    }
  });
  return stop;
}

}  // namespace kwatch::watch
