#include "watch/perf_util.h"

#include <fcntl.h>
#include <unistd.h>

#include <array>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "core/unique_fd.h"

namespace kwatch::watch {

std::string ReadSmallFile(const char* path) {
  core::UniqueFd fd(::open(path, O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) {
    return {};
  }
  std::array<char, 1024> buf{};
  const ssize_t n = ::read(fd.get(), buf.data(), buf.size());
  if (n <= 0) {
    return {};
  }
  return std::string(
      absl::StripAsciiWhitespace(absl::string_view(buf.data(), static_cast<size_t>(n))));
}

std::string ParanoidLevel() {
  std::string value = ReadSmallFile("/proc/sys/kernel/perf_event_paranoid");
  return value.empty() ? "unknown" : value;
}

std::string PerfPermissionAdvice() {
  return absl::StrCat(
      "needs root, or CAP_PERFMON (Linux >= 5.8) / CAP_SYS_ADMIN, or "
      "`sysctl kernel.perf_event_paranoid=1` (now ",
      ParanoidLevel(), ")");
}

std::vector<int> OnlineCpus() {
  std::vector<int> cpus;
  const std::string text = ReadSmallFile("/sys/devices/system/cpu/online");
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    const std::vector<absl::string_view> ends = absl::StrSplit(part, '-');
    int lo = 0;
    int hi = 0;
    if (ends.empty() || ends.size() > 2 || !absl::SimpleAtoi(ends.front(), &lo) ||
        !absl::SimpleAtoi(ends.back(), &hi) || lo < 0 || hi < lo) {
      cpus.clear();
      break;
    }
    for (int c = lo; c <= hi; ++c) {
      cpus.push_back(c);
    }
  }
  if (cpus.empty()) {
    const long n = ::sysconf(_SC_NPROCESSORS_ONLN);
    for (long c = 0; c < (n > 0 ? n : 1); ++c) {
      cpus.push_back(static_cast<int>(c));
    }
  }
  return cpus;
}

}  // namespace kwatch::watch
