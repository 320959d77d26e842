#include "watch/trap_breakpoints.h"

#include <linux/hw_breakpoint.h>
#include <linux/perf_event.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "core/base/unique_fd.h"
#include "core/ptrace/trap_origin.h"
#include "tests/test_util.h"
#include "tests/watch/debug_traps.h"

namespace kwatch::watch {
namespace {

TEST(TrapBreakpoints, SigDataNamesTheRegisterUnderKwatchsMagic) {
  for (int reg = 0; reg < 4; ++reg) {
    const uint64_t d = TrapSigData(reg, 12345);
    EXPECT_TRUE(core::ptrace::IsKwatchSigData(d));
    EXPECT_EQ(TrapSigDataRegister(d), reg);
    EXPECT_NE(d, TrapSigData(reg, 12346));
  }
  EXPECT_EQ(TrapSigDataRegister(0x1234), -1);
  siginfo_t si{};
  si.si_signo = SIGTRAP;
  si.si_code = core::ptrace::kTrapPerf;
  const uint64_t d = TrapSigData(2, 7);
  std::memcpy(reinterpret_cast<char*>(&si) + core::ptrace::kSiPerfDataOffset, &d, sizeof(d));
  EXPECT_TRUE(IsTrapBreakpointSignal(si));
  si.si_code = TRAP_HWBKPT;
  EXPECT_FALSE(IsTrapBreakpointSignal(si));
}

volatile uint64_t g_watched;
volatile uint64_t g_other;
siginfo_t g_seen;
volatile int g_traps;

void OnTrap(int /*sig*/, siginfo_t* si, void* /*uc*/) {
  g_seen = *si;
  g_traps = g_traps + 1;
}

// On the test's own thread: the kernel counts the breakpoints (a fifth register is refused
// with ENOSPC, nothing left open), Clear frees a register, and a hit sends this thread
// SIGTRAP TRAP_PERF with the breakpoint's address and sig_data.
TEST(TrapBreakpoints, EachRegisterIsAnEventTheKernelCountsAndThatStopsTheThread) {
  const pid_t tid = gettid();
  const auto addr = core::RemoteAddr{reinterpret_cast<uint64_t>(&g_watched)};
  // A kernel watch of a test running in parallel takes a register of every thread for a
  // moment: start with all four free.
  for (int attempt = 0; attempt < 50 && ::kwatch::testing::FreeDebugRegisters(tid, addr.value) < 4;
       ++attempt) {
    ::usleep(100 * 1000);
  }
  core::UniqueFd held = kwatch::testing::HoldBreakpointSlot(tid, addr.value);
  ASSERT_TRUE(held);
  TrapBreakpoints bps;
  for (int reg = 0; reg < 3; ++reg) {
    const absl::Status s = bps.Set(tid, reg, {addr, 8, drmgr::DrKind::kWrite});
    ASSERT_TRUE(s.ok()) << s;
  }
  EXPECT_EQ(bps.open_events(), 3u);
  const absl::Status full = bps.Set(tid, 3, {addr, 8, drmgr::DrKind::kWrite});
  EXPECT_TRUE(absl::IsResourceExhausted(full)) << full;
  EXPECT_NE(full.message().find("perf_event_open(breakpoint DR3"), absl::string_view::npos) << full;
  EXPECT_EQ(bps.open_events(), 3u);
  EXPECT_FALSE(bps.SlotOf(tid, 3).has_value());
  held.Reset();
  bps.Clear(tid, 1);
  bps.Clear(tid, 2);
  EXPECT_EQ(bps.open_events(), 1u);
  EXPECT_TRUE(absl::IsInvalidArgument(bps.Set(tid, 3, {addr + 1, 8, drmgr::DrKind::kWrite})));

  // One breakpoint left, in DR0: a hit stops this thread with its data.
  ASSERT_EQ(bps.Events().size(), 1u);
  const TrapBreakpoints::Event e = bps.Events()[0];
  EXPECT_EQ(e.reg, 0);
  EXPECT_EQ(bps.Fired(tid, e.sig_data), 0);
  EXPECT_EQ(bps.Fired(tid, TrapSigData(0, 999)), -1);  // not an open breakpoint's
  EXPECT_EQ(bps.Fired(tid + 1, e.sig_data), -1);
  struct sigaction sa {};
  struct sigaction old {};
  sa.sa_sigaction = OnTrap;
  sa.sa_flags = SA_SIGINFO;
  ASSERT_EQ(::sigaction(SIGTRAP, &sa, &old), 0);
  g_traps = 0;
  g_other = 1;  // not watched
  g_watched = 42;
  std::atomic_signal_fence(std::memory_order_seq_cst);  // the handler ran right after the store
  const int traps = g_traps;
  const siginfo_t seen = g_seen;
  bps.DropAll();
  g_watched = 43;  // closed: no trap
  const int after = g_traps;
  ASSERT_EQ(::sigaction(SIGTRAP, &old, nullptr), 0);
  EXPECT_EQ(bps.open_events(), 0u);
  EXPECT_EQ(after, traps);
  KW_REQUIRE_DEBUG_TRAPS();
  ASSERT_EQ(traps, 1);
  EXPECT_EQ(seen.si_code, core::ptrace::kTrapPerf);
  EXPECT_EQ(seen.si_addr, const_cast<uint64_t*>(&g_watched));
  EXPECT_EQ(core::ptrace::SiPerfData(seen), e.sig_data);
  EXPECT_TRUE(IsTrapBreakpointSignal(seen));
}

}  // namespace
}  // namespace kwatch::watch
