#pragma once

#include <cstdint>
#include <string>

namespace kwatch::watch::profile {

// "0 ns", "900 ns", "1.5 ms", "240 ms", "2.25 s": the largest unit (ns, us, ms, s) not
// exceeding the value, at most 3 decimals, trailing zeros dropped. The one duration format of
// every report (text, GUI).
std::string FormatDuration(uint64_t ns);

// `t_ns` - `origin_ns` as a signed count: negative for a time before the origin (an event a
// clock stamped before the session's start), saturated at the int64 range.
int64_t SinceNs(uint64_t t_ns, uint64_t origin_ns);

// FormatDuration of SinceNs: "2.25 s" after the origin, "-1.5 ms" before it.
std::string FormatSince(uint64_t t_ns, uint64_t origin_ns);

}  // namespace kwatch::watch::profile
