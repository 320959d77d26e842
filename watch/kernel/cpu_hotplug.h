#pragma once

#include <vector>

#include "core/base/unique_fd.h"

namespace kwatch::watch::kernel {

// Hears of CPUs going offline and online from the kernel's uevents (NETLINK_KOBJECT_UEVENT:
// "offline@/devices/system/cpu/cpu1", in order, so a quick offline-online is seen too). Where
// the socket cannot be opened, fd() is -1 and the caller relies on polling OnlineCpus()
// (watch/perf_util.h) alone, which also covers hotplug that sends no uevent. Owns the socket.
// Not thread-safe.
class CpuHotplugMonitor {
 public:
  // Never fails: without uevents, the monitor is empty (fd() -1, Read() finds nothing).
  static CpuHotplugMonitor Open();

  // The socket to poll for input, or -1.
  int fd() const { return socket_ ? socket_.get() : -1; }

  struct Uevents {
    std::vector<int> offline;  // CPUs that went offline, in the kernel's order
    bool online = false;       // some CPU came online
  };
  // Reads every pending uevent (non-blocking).
  Uevents Read();

 private:
  explicit CpuHotplugMonitor(core::UniqueFd socket) : socket_(std::move(socket)) {}

  core::UniqueFd socket_;
};

}  // namespace kwatch::watch::kernel
