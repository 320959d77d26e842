#pragma once

#include <cstdint>
#include <string>

namespace kwatch::watch::profile {

// "0 ns", "900 ns", "1.5 ms", "240 ms", "2.25 s": the largest unit (ns, us, ms, s) not
// exceeding the value, at most 3 decimals, trailing zeros dropped. The one duration format of
// every report (text, GUI).
std::string FormatDuration(uint64_t ns);

}  // namespace kwatch::watch::profile
