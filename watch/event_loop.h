#pragma once

// The one wait of every session (watch::TargetSet, watch::kernel::KernelWatchSession and the
// probe sessions of watch/probe/): epoll over the session's signalfd, a periodic tick (a
// timerfd) and the fds its backend adds (perf rings, a pidfd, CPU-hotplug uevents).
//
// Signals: before it launches or attaches to a target, a session blocks SIGINT, SIGTERM,
// SIGHUP and SIGCHLD in its thread and reads them from a signalfd (BlockSessionSignals), so
// that they come in order with everything else. SIGINT, SIGTERM and SIGHUP stop the session
// (IsStopSignal). SIGCHLD says that a process the session traces changed state; several merge
// into one, so sessions poll their processes every round anyway.
//
// Ownership: the loop owns the signalfd, its epoll fd and its timerfd; the fds added are the
// caller's (closing one takes it out of the loop). Not thread-safe: one thread calls Wait, and
// TakeStopSignal from code that runs between two waits (a hit handler inside Process::Poll).

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/base/unique_fd.h"

namespace kwatch::watch {

// Blocks SIGINT, SIGTERM, SIGHUP and SIGCHLD in the calling thread and returns a signalfd
// (non-blocking) that reads them. Call it before a target is launched: a Ctrl-C from then on
// stops the session instead of killing kwatch, and no SIGCHLD is lost.
absl::StatusOr<core::UniqueFd> BlockSessionSignals();

// SIGINT, SIGTERM, SIGHUP: the signals that end a session.
bool IsStopSignal(int sig);

class EventLoop {
 public:
  static constexpr absl::Duration kDefaultTick = absl::Milliseconds(50);

  // Takes `sigfd` (from BlockSessionSignals) and ticks every `tick` (> 0) from now on.
  static absl::StatusOr<std::unique_ptr<EventLoop>> Create(core::UniqueFd sigfd,
                                                           absl::Duration tick = kDefaultTick);

  EventLoop(const EventLoop&) = delete;
  EventLoop& operator=(const EventLoop&) = delete;
  ~EventLoop() = default;

  // Wakes Wait when `fd` is readable. Adding an fd already in the loop does nothing.
  absl::Status Add(int fd);
  // Stops watching `fd` (one that stays readable or in error, e.g. a closed pipe's write end).
  // Removing an fd that is not in the loop does nothing.
  absl::Status Remove(int fd);

  // One thing that woke the loop.
  struct Event {
    enum class Kind : uint8_t {
      kSignal,  // `value`: the signal read from the signalfd
      kTick,    // the tick (once, however many intervals passed since the last wait)
      kFd,      // `value`: an added fd that is readable
    };
    Kind kind = Kind::kTick;
    int value = 0;
  };
  // What woke the loop, in the order epoll reported it (and the signalfd, within it). Empty
  // when the timeout passed or a signal handler interrupted the wait.
  struct Ready {
    std::vector<Event> events;

    bool child() const;       // SIGCHLD came
    int stop_signal() const;  // the first stop signal that came, 0: none
    bool tick() const;
  };

  // Waits up to `timeout` (0: does not block; absl::InfiniteDuration(): until something
  // comes) and reads what came: every signal waiting in the signalfd, the tick's count.
  // Does not flush anything: callers flush their output first.
  absl::StatusOr<Ready> Wait(absl::Duration timeout);

  // Without waiting: reads every signal waiting in the signalfd and returns the first stop
  // signal among them, or 0 (SIGCHLD is dropped: the sessions poll their processes anyway).
  int TakeStopSignal();

 private:
  EventLoop() = default;

  core::UniqueFd sigfd_;
  core::UniqueFd epfd_;
  core::UniqueFd tick_;
};

}  // namespace kwatch::watch
