#include "watch/profile/duration.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kwatch::watch::profile {

std::string FormatDuration(uint64_t ns) {
  struct Unit {
    uint64_t ns;
    const char* name;
  };
  static constexpr std::array<Unit, 3> kUnits = {
      {{1'000'000'000, "s"}, {1'000'000, "ms"}, {1'000, "us"}}};
  for (const Unit& u : kUnits) {
    if (ns >= u.ns) {
      std::string s = absl::StrFormat("%.3f", static_cast<double>(ns) / static_cast<double>(u.ns));
      while (s.back() == '0') {
        s.pop_back();
      }
      if (s.back() == '.') {
        s.pop_back();
      }
      return absl::StrCat(s, " ", u.name);
    }
  }
  return absl::StrCat(ns, " ns");
}

int64_t SinceNs(uint64_t t_ns, uint64_t origin_ns) {
  constexpr auto kMax = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  if (t_ns >= origin_ns) {
    return static_cast<int64_t>(std::min(t_ns - origin_ns, kMax));
  }
  return -static_cast<int64_t>(std::min(origin_ns - t_ns, kMax));
}

std::string FormatSince(uint64_t t_ns, uint64_t origin_ns) {
  if (t_ns >= origin_ns) {
    return FormatDuration(t_ns - origin_ns);
  }
  return absl::StrCat("-", FormatDuration(origin_ns - t_ns));
}

}  // namespace kwatch::watch::profile
