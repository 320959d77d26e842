#include "watch/kernel/capability.h"

#include <unistd.h>

#include <cstdint>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/kernel/kallsyms.h"

namespace kwatch::watch::kernel {

bool CapEffAllowsKernelEvents(absl::string_view proc_status) {
  for (absl::string_view line : absl::StrSplit(proc_status, '\n')) {
    if (absl::ConsumePrefix(&line, "CapEff:")) {
      uint64_t caps = 0;
      if (!absl::SimpleHexAtoi(absl::StripAsciiWhitespace(line), &caps)) {
        return false;
      }
      constexpr int kCapSysAdmin = 21;
      constexpr int kCapPerfmon = 38;
      return (caps & (1ULL << kCapSysAdmin)) != 0 || (caps & (1ULL << kCapPerfmon)) != 0;
    }
  }
  return false;
}

bool HasPerfmonCapability() {
  if (geteuid() == 0) {
    return true;
  }
  auto status = core::kernel::ReadWholeFile("/proc/self/status");
  return status.ok() && CapEffAllowsKernelEvents(*status);
}

}  // namespace kwatch::watch::kernel
