#pragma once

#include <cstdint>
#include <vector>

namespace kwatch::gui {

// The ticks of a time axis showing [t0_ns, t1_ns] over `width_px` pixels.
struct TimeTicks {
  uint64_t step_ns = 0;            // 1, 2 or 5 x 10^k ns (0: no ticks)
  std::vector<uint64_t> ticks_ns;  // the multiples of step_ns in [t0_ns, t1_ns], ascending
};

// Ticks at least `min_gap_px` apart: the step is the smallest 1, 2 or 5 x 10^k ns (k <= 19) that
// is at least (t1_ns - t0_ns) * min_gap_px / width_px, so there are at most
// width_px / min_gap_px + 1 ticks (and never more than 2 when even 10^19 ns is closer), for any
// span up to the whole uint64 range. No ticks when t1_ns < t0_ns or width_px or min_gap_px < 1.
TimeTicks TimeAxisTicks(uint64_t t0_ns, uint64_t t1_ns, int width_px, int min_gap_px);

}  // namespace kwatch::gui
