#include "watch/hw_probe.h"

#include <sys/utsname.h>
#include <unistd.h>

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "core/base/remote_addr.h"
#include "drmgr/debug_regs.h"
#include "tests/test_util.h"
#include "watch/perf_breakpoint.h"

namespace kwatch::watch {
namespace {

using ::testing::HasSubstr;

std::string KernelRelease() {
  utsname u{};
  EXPECT_EQ(::uname(&u), 0);
  return u.release;
}

TEST(HwProbe, KernelAcceptsHardwareBreakpoints) {
  const DebugTrapProbe& probe = ProbeDebugTraps();
  // Perf hardware breakpoints are accepted on every machine kwatch supports (CI included),
  // whether or not the hypervisor then delivers their traps.
  KW_REQUIRE_FEATURE(probe.accepted, probe.detail);
  EXPECT_EQ(probe.writes, kDebugTrapProbeWrites);
}

TEST(HwProbe, ResultIsConsistent) {
  const DebugTrapProbe& probe = ProbeDebugTraps();
  SCOPED_TRACE(probe.detail);
  if (!probe.accepted) {
    EXPECT_FALSE(probe.delivered);
    EXPECT_EQ(probe.counted, 0u);
  } else {
    EXPECT_EQ(probe.writes, kDebugTrapProbeWrites);
    // All or nothing: a machine delivers every trap or none of them.
    EXPECT_TRUE(probe.counted == 0 || probe.counted == probe.writes) << probe.counted;
  }
  EXPECT_EQ(probe.delivered, probe.accepted && probe.counted == probe.writes);
  EXPECT_THAT(probe.detail, HasSubstr("kernel " + KernelRelease()));
  if (probe.accepted && !probe.delivered) {
    EXPECT_THAT(probe.detail, HasSubstr("hypervisor does not deliver debug-register traps"));
  }
}

TEST(HwProbe, CachedOncePerProcess) {
  const DebugTrapProbe* first = &ProbeDebugTraps();
  const DebugTrapProbe* second = &ProbeDebugTraps();
  EXPECT_EQ(first, second);
  const DebugTrapProbe* from_thread = nullptr;
  std::thread t([&from_thread] { from_thread = &ProbeDebugTraps(); });
  t.join();
  EXPECT_EQ(from_thread, first);
}

TEST(HwProbe, LeavesNoBreakpointBehind) {
  ProbeDebugTraps();
  // All 4 debug registers of this thread are free again: 4 breakpoints open, a fifth does not.
  alignas(64) static volatile uint64_t slots[drmgr::kNumDebugRegisters + 1] = {};
  const auto open = [](volatile uint64_t& slot) {
    BreakpointRequest req;
    req.addr = core::RemoteAddr{reinterpret_cast<uintptr_t>(&slot)};
    req.len = 8;
    req.kind = drmgr::DrKind::kWrite;
    req.tid = ::gettid();
    req.inherit = false;
    req.ring_pages = 0;
    return PerfBreakpoint::Open(req);
  };
  std::vector<std::unique_ptr<PerfBreakpoint>> held;
  // A CPU-wide breakpoint of another process (a kernel watch test running in parallel)
  // holds a slot of every thread on its CPU for a moment: wait for the four to be free.
  constexpr size_t kSlots = drmgr::kNumDebugRegisters;
  absl::Status last = absl::OkStatus();
  for (int attempt = 0; attempt < 100 && held.size() < kSlots; ++attempt) {
    held.clear();
    for (int i = 0; i < drmgr::kNumDebugRegisters; ++i) {
      auto bp = open(slots[i]);
      if (!bp.ok()) {
        last = bp.status();
        break;
      }
      held.push_back(*std::move(bp));
    }
    if (held.size() < kSlots) {
      ::usleep(50 * 1000);
    }
  }
  KW_REQUIRE_FEATURE(held.size() == kSlots, last.ToString());
  auto fifth = open(slots[drmgr::kNumDebugRegisters]);
  ASSERT_FALSE(fifth.ok());
  EXPECT_EQ(fifth.status().code(), absl::StatusCode::kResourceExhausted) << fifth.status();
}

}  // namespace
}  // namespace kwatch::watch
