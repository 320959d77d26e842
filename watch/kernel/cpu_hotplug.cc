#include "watch/kernel/cpu_hotplug.h"

#include <linux/netlink.h>
#include <sys/socket.h>

#include <array>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace kwatch::watch::kernel {

CpuHotplugMonitor CpuHotplugMonitor::Open() {
  core::UniqueFd sock(
      socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, NETLINK_KOBJECT_UEVENT));
  sockaddr_nl sa{};
  sa.nl_family = AF_NETLINK;
  sa.nl_groups = 1;  // the kernel's uevents
  if (sock && bind(sock.get(), reinterpret_cast<const sockaddr*>(&sa), sizeof(sa)) == 0) {
    return CpuHotplugMonitor(std::move(sock));
  }
  return CpuHotplugMonitor(core::UniqueFd());
}

CpuHotplugMonitor::Uevents CpuHotplugMonitor::Read() {
  Uevents out;
  if (!socket_) {
    return out;
  }
  std::array<char, 8192> msg{};
  ssize_t n = 0;
  while ((n = recv(socket_.get(), msg.data(), msg.size() - 1, 0)) > 0) {
    msg[static_cast<size_t>(n)] = '\0';
    absl::string_view head(msg.data());  // "ACTION@DEVPATH", then KEY=VALUE strings
    int cpu = -1;
    if (absl::ConsumePrefix(&head, "offline@/devices/system/cpu/cpu") &&
        absl::SimpleAtoi(head, &cpu)) {
      out.offline.push_back(cpu);
    } else if (absl::StartsWith(head, "online@/devices/system/cpu/cpu")) {
      out.online = true;
    }
  }
  return out;
}

}  // namespace kwatch::watch::kernel
