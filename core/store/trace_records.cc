#include "core/store/trace_records.h"

#include <sys/utsname.h>

#include <ctime>

namespace kwatch::core::store {
namespace {

uint64_t ClockNs(clockid_t clock) {
  timespec ts{};
  ::clock_gettime(clock, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ULL + static_cast<uint64_t>(ts.tv_nsec);
}

}  // namespace

uint64_t WallClockNs() {
  return ClockNs(CLOCK_REALTIME);
}

uint64_t MonotonicClockNs() {
  return ClockNs(CLOCK_MONOTONIC);
}

SessionRecord SessionRecordForThisHost() {
  SessionRecord s;
  utsname u{};
  if (::uname(&u) == 0) {
    s.kernel = u.release;
    s.host = u.nodename;
  }
  s.start_wall_ns = WallClockNs();
  s.start_mono_ns = MonotonicClockNs();
  return s;
}

}  // namespace kwatch::core::store
