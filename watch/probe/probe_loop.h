#pragma once

// The waiting part shared by the probe sessions: epoll over the command's signalfd, a 50 ms
// tick and a backend's fds, and the clock the sessions use.

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/base/unique_fd.h"

namespace kwatch::watch::probe {

// epoll over the signalfd, a 50 ms tick and the backend's fds. Owns the epoll and timer fds;
// the signalfd is the caller's. Not thread-safe.
class ProbeLoop {
 public:
  static absl::StatusOr<std::unique_ptr<ProbeLoop>> Create(int sigfd);
  absl::Status Add(int fd);
  // Waits up to `timeout_ms` (after flushing stdout); fills what happened. A stop signal sets
  // `stop_signal`.
  struct Ready {
    bool child = false;  // SIGCHLD
    bool tick = false;
    int stop_signal = 0;
    std::vector<int> fds;  // other fds that are readable
  };
  absl::StatusOr<Ready> Wait(int timeout_ms);

 private:
  ProbeLoop() = default;
  int sigfd_ = -1;
  core::UniqueFd epfd_;
  core::UniqueFd tick_;
};

// CLOCK_MONOTONIC in ns.
uint64_t NowNs();

// Reads what waits in the signalfd without blocking: the first SIGINT/SIGTERM/SIGHUP, or 0
// (SIGCHLD is dropped: the sessions poll the target every round anyway).
int ReadStopSignal(int sigfd);

}  // namespace kwatch::watch::probe
