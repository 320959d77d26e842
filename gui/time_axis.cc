#include "gui/time_axis.h"

#include <array>

namespace kwatch::gui {

TimeTicks TimeAxisTicks(uint64_t t0_ns, uint64_t t1_ns, int width_px, int min_gap_px) {
  TimeTicks out;
  if (t1_ns < t0_ns || width_px < 1 || min_gap_px < 1) {
    return out;
  }
  // In double: (t1 - t0) * min_gap_px may not fit in 64 bits; a step's exact value matters less
  // than never running past the largest one.
  const double min_step =
      static_cast<double>(t1_ns - t0_ns) / static_cast<double>(width_px) * min_gap_px;
  constexpr uint64_t kLargestDecade = 10'000'000'000'000'000'000ULL;  // 10^19 ns
  uint64_t step = kLargestDecade;
  bool found = false;
  for (uint64_t decade = 1; !found; decade *= 10) {
    for (const uint64_t m : std::array<uint64_t, 3>{1, 2, 5}) {
      if (decade == kLargestDecade && m > 1) {
        break;  // 2 x 10^19 is beyond uint64
      }
      if (static_cast<double>(decade * m) >= min_step) {
        step = decade * m;
        found = true;
        break;
      }
    }
    if (decade == kLargestDecade) {
      break;
    }
  }
  out.step_ns = step;
  const uint64_t rem = t0_ns % step;
  if (rem != 0 && t0_ns > UINT64_MAX - (step - rem)) {
    return out;  // no multiple of the step left in range
  }
  uint64_t t = rem == 0 ? t0_ns : t0_ns + (step - rem);
  while (t <= t1_ns) {
    out.ticks_ns.push_back(t);
    if (t1_ns - t < step) {
      break;
    }
    t += step;
  }
  return out;
}

}  // namespace kwatch::gui
