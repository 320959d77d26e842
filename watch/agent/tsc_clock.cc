#include "watch/agent/tsc_clock.h"

#include <x86intrin.h>

#include <cmath>
#include <ctime>
#include <string>

#include "absl/strings/match.h"
#include "core/base/clock.h"
#include "core/ptrace/maps.h"

namespace kwatch::watch::agent {

uint64_t ReadTsc() {
  return __rdtsc();
}

bool HasInvariantTsc() {
  auto text = core::ptrace::ReadSmallFile("/proc/cpuinfo");
  return text.ok() && absl::StrContains(*text, " constant_tsc") &&
         absl::StrContains(*text, " nonstop_tsc");
}

TscSample TscClock::Sample() {
  TscSample best;
  uint64_t best_width = ~uint64_t{0};
  for (int i = 0; i < 5; ++i) {
    const uint64_t before = core::MonotonicNs();
    const uint64_t tsc = ReadTsc();
    const uint64_t after = core::MonotonicNs();
    if (after - before < best_width) {
      best_width = after - before;
      best = TscSample{.tsc = tsc, .mono_ns = before + (after - before) / 2};
    }
  }
  return best;
}

TscClock::TscClock() {
  first_ = Sample();
  const timespec ms{0, 1'000'000};
  nanosleep(&ms, nullptr);
  latest_ = Sample();
  Fit();
}

TscClock::TscClock(TscSample first, TscSample latest) : first_(first), latest_(latest) {
  Fit();
}

void TscClock::Recalibrate() {
  AddSample(Sample());
}

void TscClock::AddSample(TscSample s) {
  latest_ = s;
  Fit();
}

void TscClock::Fit() {
  if (latest_.tsc > first_.tsc && latest_.mono_ns > first_.mono_ns) {
    ns_per_tick_ = static_cast<double>(latest_.mono_ns - first_.mono_ns) /
                   static_cast<double>(latest_.tsc - first_.tsc);
  }
}

uint64_t TscClock::ToMonotonicNs(uint64_t tsc) const {
  const double delta = tsc >= latest_.tsc ? static_cast<double>(tsc - latest_.tsc)
                                          : -static_cast<double>(latest_.tsc - tsc);
  const double ns = static_cast<double>(latest_.mono_ns) + delta * ns_per_tick_;
  return ns <= 0 ? 0 : static_cast<uint64_t>(std::llround(ns));
}

}  // namespace kwatch::watch::agent
