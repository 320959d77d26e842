#include "core/base/confinement.h"

#include <linux/capability.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/base/proc_status.h"

namespace kwatch::core {

std::string ConfinementAdviceFor(absl::string_view status, uid_t euid, int cap,
                                 absl::string_view cap_name) {
  std::vector<std::string> parts;
  uint64_t effective = 0;
  if (absl::SimpleHexAtoi(StatusFieldOf(status, "CapEff"), &effective)) {
    const auto has = [effective](int c) { return c < 64 && (effective >> c & 1) != 0; };
    const bool held = has(cap) || (cap == CAP_PERFMON && has(CAP_SYS_ADMIN));
    if (!held && euid == 0) {
      parts.push_back(absl::StrCat("kwatch runs as root without CAP_", cap_name,
                                   " (a container runtime drops it: `docker run --cap-add ",
                                   cap_name, "`, `podman run --cap-add ", cap_name,
                                   "`, or securityContext.capabilities.add in "
                                   "Kubernetes)"));
    }
  }
  if (StatusFieldOf(status, "Seccomp") == "2") {
    parts.emplace_back(
        "kwatch runs under a seccomp filter, which may refuse perf_event_open and ptrace (the "
        "default profiles of Docker and podman do without the capabilities): "
        "`--security-opt seccomp=unconfined`, or a profile that allows perf_event_open, "
        "ptrace, process_vm_readv and pidfd_getfd");
  }
  return absl::StrJoin(parts, "; ");
}

std::string ConfinementAdvice(int cap, absl::string_view cap_name) {
  std::ifstream in("/proc/self/status");
  std::stringstream text;
  text << in.rdbuf();
  return ConfinementAdviceFor(text.str(), ::geteuid(), cap, cap_name);
}

}  // namespace kwatch::core
