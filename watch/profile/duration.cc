#include "watch/profile/duration.h"

#include <array>

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

}  // namespace kwatch::watch::profile
