#pragma once

#include <cstdint>
#include <ctime>

namespace kwatch::core {

// CLOCK_MONOTONIC in nanoseconds: the clock of every event timestamp kwatch takes itself, of
// perf samples (use_clockid) and of session durations. Async-signal-safe (vDSO, no lock).
inline uint64_t MonotonicNs() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ULL + static_cast<uint64_t>(ts.tv_nsec);
}

}  // namespace kwatch::core
