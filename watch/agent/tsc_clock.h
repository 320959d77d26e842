#pragma once

// The agent stamps records with rdtsc (no system call on a hit's path); kwatch converts them
// to CLOCK_MONOTONIC (core::MonotonicNs, the clock of every other event) with a calibration:
// pairs of (TSC, CLOCK_MONOTONIC) read together, one when the session starts and one at each
// drain. The slope comes from the first and the latest pair (the longest baseline), the
// offset from the latest (the nearest to the records being converted). Assumes an invariant
// TSC (constant_tsc and nonstop_tsc in /proc/cpuinfo: HasInvariantTsc), the same on every
// CPU, as the kernel does when it uses the TSC as its clocksource.
//
// Not thread-safe.

#include <cstdint>

namespace kwatch::watch::agent {

// rdtsc.
uint64_t ReadTsc();

// Whether /proc/cpuinfo lists constant_tsc and nonstop_tsc.
bool HasInvariantTsc();

struct TscSample {
  uint64_t tsc = 0;
  uint64_t mono_ns = 0;
};

class TscClock {
 public:
  // Takes two samples about a millisecond apart, for a first slope.
  TscClock();
  // From given samples (tests): `first` and `latest` must differ in both clocks.
  TscClock(TscSample first, TscSample latest);

  // A new latest sample (at each drain).
  void Recalibrate();
  void AddSample(TscSample s);

  // CLOCK_MONOTONIC nanoseconds of a TSC value (before the first sample too: extrapolated).
  uint64_t ToMonotonicNs(uint64_t tsc) const;
  // TSC ticks per microsecond, as calibrated.
  double ticks_per_us() const { return 1000.0 / ns_per_tick_; }

 private:
  // A sample whose two reads of CLOCK_MONOTONIC around rdtsc were the closest of a few.
  static TscSample Sample();
  void Fit();

  TscSample first_;
  TscSample latest_;
  double ns_per_tick_ = 1.0;
};

}  // namespace kwatch::watch::agent
