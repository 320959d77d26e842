#include "watch/perf_breakpoint.h"

#include <unistd.h>

#include <csignal>
#include <cstdint>
#include <ctime>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "core/base/clock.h"
#include "tests/test_util.h"
#include "tests/watch/debug_traps.h"

namespace kwatch::watch {
namespace {

using ::testing::HasSubstr;

// Watched variables, each alone in its cache line so that no other store touches them.
alignas(64) volatile uint64_t g_write_target = 0;
alignas(64) volatile uint64_t g_read_target = 42;
alignas(64) volatile uint64_t g_thread_target = 0;
alignas(64) volatile uint64_t g_toggle_target = 0;
alignas(64) volatile uint64_t g_slots[5] = {};
alignas(64) volatile uint64_t g_sink = 0;

// Upper bound of the code size of the small functions below, for the IP checks.
constexpr uint64_t kMaxFunctionBytes = 512;

__attribute__((noinline)) void WriteTarget(volatile uint64_t* target, int n) {
  for (int i = 0; i < n; ++i) {
    *target = static_cast<uint64_t>(i);
  }
}

__attribute__((noinline)) uint64_t ReadTarget(int n) {
  uint64_t sum = 0;
  for (int i = 0; i < n; ++i) {
    sum += g_read_target;
  }
  return sum;
}

__attribute__((noinline)) void ExecutedFunction() {
  g_sink = g_sink + 1;
}

uint64_t Addr(const volatile void* p) {
  return reinterpret_cast<uintptr_t>(p);
}

template <typename F>
uint64_t CodeAddr(F* f) {
  return reinterpret_cast<uintptr_t>(f);
}

uint32_t Tid() {
  return static_cast<uint32_t>(::gettid());
}

// About one hit in millions arrives as a spurious #DB that the kernel turns into a SIGTRAP;
// absorb it instead of dying (see DESIGN.md).
void OnSigtrap(int /*sig*/) {}
void AbsorbSpuriousSigtrap() {
  struct sigaction sa = {};
  sa.sa_handler = OnSigtrap;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  ::sigaction(SIGTRAP, &sa, nullptr);
}

BreakpointRequest SelfRequest(const volatile void* addr, drmgr::DrKind kind) {
  BreakpointRequest req;
  req.addr = core::RemoteAddr{Addr(addr)};
  req.len = 8;
  req.kind = kind;
  req.tid = ::gettid();
  req.inherit = false;
  req.ring_pages = 64;  // 256 KiB: about 5400 samples
  return req;
}

std::vector<PerfSample> DrainAll(PerfBreakpoint& bp) {
  std::vector<PerfSample> out;
  PerfRing* ring = bp.ring();
  EXPECT_NE(ring, nullptr);
  if (ring != nullptr) {
    ring->Drain([&](const PerfSample& s) { out.push_back(s); });
  }
  return out;
}

class PerfBreakpointTest : public ::testing::Test {
 protected:
  void SetUp() override { AbsorbSpuriousSigtrap(); }
};

TEST_F(PerfBreakpointTest, CountsEveryWriteOfThisThreadExactly) {
  constexpr int kWrites = 1000;
  auto bp = PerfBreakpoint::Open(SelfRequest(&g_write_target, drmgr::DrKind::kWrite));
  KW_REQUIRE_FEATURE(bp.ok(), bp.status().ToString());
  ASSERT_NE((*bp)->ring(), nullptr);
  EXPECT_EQ((*bp)->fds().size(), 1u);  // not inherited: one event, one ring
  EXPECT_EQ((*bp)->ring()->Pending(), 0u);
  KW_REQUIRE_DEBUG_TRAPS();

  const uint64_t t0 = core::MonotonicNs();
  WriteTarget(&g_write_target, kWrites);
  const uint64_t t1 = core::MonotonicNs();

  const std::vector<PerfSample> samples = DrainAll(**bp);
  ASSERT_EQ(samples.size(), static_cast<size_t>(kWrites));
  EXPECT_EQ((*bp)->ring()->lost(), 0u);
  EXPECT_EQ((*bp)->ring()->Pending(), 0u);
  const uint64_t fn = CodeAddr(&WriteTarget);
  const long cpus = ::sysconf(_SC_NPROCESSORS_CONF);
  for (const PerfSample& s : samples) {
    ASSERT_EQ(s.addr, Addr(&g_write_target));
    ASSERT_EQ(s.tid, Tid());
    ASSERT_EQ(s.pid, static_cast<uint32_t>(::getpid()));
    // A data breakpoint traps after the store: the IP is inside the writing function.
    ASSERT_GE(s.ip, fn);
    ASSERT_LT(s.ip, fn + kMaxFunctionBytes);
    ASSERT_LT(static_cast<long>(s.cpu), cpus);
    // CLOCK_MONOTONIC domain (a clock check, not a timing check: 1 ms slack either side).
    ASSERT_GE(s.time + 1'000'000, t0);
    ASSERT_LE(s.time, t1 + 1'000'000);
  }
  absl::StatusOr<uint64_t> count = (*bp)->Count();
  ASSERT_TRUE(count.ok()) << count.status();
  EXPECT_EQ(*count, static_cast<uint64_t>(kWrites));
}

TEST_F(PerfBreakpointTest, ReadWriteBreakpointCountsReads) {
  constexpr int kReads = 700;
  auto bp = PerfBreakpoint::Open(SelfRequest(&g_read_target, drmgr::DrKind::kReadWrite));
  KW_REQUIRE_FEATURE(bp.ok(), bp.status().ToString());
  ASSERT_NE((*bp)->ring(), nullptr);
  KW_REQUIRE_DEBUG_TRAPS();

  g_sink = ReadTarget(kReads);

  const std::vector<PerfSample> samples = DrainAll(**bp);
  ASSERT_EQ(samples.size(), static_cast<size_t>(kReads));
  const uint64_t fn = CodeAddr(&ReadTarget);
  for (const PerfSample& s : samples) {
    ASSERT_EQ(s.addr, Addr(&g_read_target));
    ASSERT_EQ(s.tid, Tid());
    ASSERT_GE(s.ip, fn);
    ASSERT_LT(s.ip, fn + kMaxFunctionBytes);
  }
  EXPECT_EQ((*bp)->ring()->lost(), 0u);
  absl::StatusOr<uint64_t> count = (*bp)->Count();
  ASSERT_TRUE(count.ok()) << count.status();
  EXPECT_EQ(*count, static_cast<uint64_t>(kReads));
}

TEST_F(PerfBreakpointTest, CountingOnlyHasNoRing) {
  BreakpointRequest req = SelfRequest(&g_write_target, drmgr::DrKind::kWrite);
  req.ring_pages = 0;
  auto bp = PerfBreakpoint::Open(req);
  KW_REQUIRE_FEATURE(bp.ok(), bp.status().ToString());
  EXPECT_EQ((*bp)->ring(), nullptr);
  ASSERT_EQ((*bp)->fds().size(), 1u);
  EXPECT_EQ((*bp)->fds().front(), (*bp)->fd());
  EXPECT_EQ((*bp)->request().ring_pages, 0u);
  const absl::StatusOr<uint64_t> count = (*bp)->Count();
  ASSERT_TRUE(count.ok()) << count.status();
  EXPECT_EQ(*count, 0u);  // nothing written yet
  EXPECT_TRUE((*bp)->Disable().ok());
  EXPECT_TRUE((*bp)->Enable().ok());
}

TEST_F(PerfBreakpointTest, CallchainSamplesCarryTheWritersFrames) {
  constexpr int kWrites = 5;
  BreakpointRequest req = SelfRequest(&g_write_target, drmgr::DrKind::kWrite);
  req.callchain_frames = 16;
  auto bp = PerfBreakpoint::Open(req);
  // The kernel takes a callchain on a breakpoint event (kernel watches' --stack use it).
  KW_REQUIRE_FEATURE(bp.ok(), bp.status().ToString());
  EXPECT_EQ((*bp)->request().callchain_frames, 16u);
  KW_REQUIRE_DEBUG_TRAPS();
  WriteTarget(&g_write_target, kWrites);
  std::vector<PerfCallchain> chains;
  (*bp)->ring()->DrainRecords([&](std::span<const uint8_t> record) {
    PerfSample s;
    PerfCallchain chain;
    if (ParseCallchainSample(record, s, chain)) {
      EXPECT_EQ(s.tid, Tid());
      chains.push_back(chain);
    }
  });
  ASSERT_EQ(chains.size(), static_cast<size_t>(kWrites));
  for (const PerfCallchain& c : chains) {
    // A user access: no kernel frames; frame 0 is inside WriteTarget, frame 1 in this test.
    EXPECT_TRUE(c.kernel.empty());
    ASSERT_GE(c.user.size(), 2u);
    EXPECT_GE(c.user[0], CodeAddr(&WriteTarget));
    EXPECT_LT(c.user[0], CodeAddr(&WriteTarget) + 256);
  }
}

TEST_F(PerfBreakpointTest, CountingOnlyCountsEveryWrite) {
  BreakpointRequest req = SelfRequest(&g_write_target, drmgr::DrKind::kWrite);
  req.ring_pages = 0;
  auto bp = PerfBreakpoint::Open(req);
  KW_REQUIRE_FEATURE(bp.ok(), bp.status().ToString());
  KW_REQUIRE_DEBUG_TRAPS();
  WriteTarget(&g_write_target, 321);
  absl::StatusOr<uint64_t> count = (*bp)->Count();
  ASSERT_TRUE(count.ok()) << count.status();
  EXPECT_EQ(*count, 321u);
}

TEST_F(PerfBreakpointTest, ExecuteBreakpointReportsTheFunctionAddress) {
  constexpr int kCalls = 200;
  BreakpointRequest req = SelfRequest(nullptr, drmgr::DrKind::kExec);
  req.addr = core::RemoteAddr{CodeAddr(&ExecutedFunction)};
  req.len = 1;
  auto bp = PerfBreakpoint::Open(req);
  KW_REQUIRE_FEATURE(bp.ok(), bp.status().ToString());
  ASSERT_NE((*bp)->ring(), nullptr);
  KW_REQUIRE_DEBUG_TRAPS();
  for (int i = 0; i < kCalls; ++i) {
    ExecutedFunction();
  }
  const std::vector<PerfSample> samples = DrainAll(**bp);
  ASSERT_EQ(samples.size(), static_cast<size_t>(kCalls));
  for (const PerfSample& s : samples) {
    // Execute breakpoints fault before the instruction runs.
    ASSERT_EQ(s.ip, CodeAddr(&ExecutedFunction));
    ASSERT_EQ(s.tid, Tid());
  }
}

TEST_F(PerfBreakpointTest, DisableAndEnable) {
  auto bp = PerfBreakpoint::Open(SelfRequest(&g_toggle_target, drmgr::DrKind::kWrite));
  KW_REQUIRE_FEATURE(bp.ok(), bp.status().ToString());
  ASSERT_TRUE((*bp)->Disable().ok());
  WriteTarget(&g_toggle_target, 100);
  ASSERT_TRUE((*bp)->Enable().ok());
  KW_REQUIRE_DEBUG_TRAPS();
  WriteTarget(&g_toggle_target, 50);
  EXPECT_EQ(DrainAll(**bp).size(), 50u);
  absl::StatusOr<uint64_t> count = (*bp)->Count();
  ASSERT_TRUE(count.ok()) << count.status();
  EXPECT_EQ(*count, 50u);
}

TEST_F(PerfBreakpointTest, InheritedIntoThreadsCreatedLater) {
  constexpr int kWrites = 500;
  BreakpointRequest req = SelfRequest(&g_thread_target, drmgr::DrKind::kWrite);
  req.inherit = true;
  auto bp = PerfBreakpoint::Open(req);
  KW_REQUIRE_FEATURE(bp.ok(), bp.status().ToString());
  ASSERT_NE((*bp)->ring(), nullptr);
  EXPECT_GE((*bp)->fds().size(), 1u);  // one event per online CPU
  KW_REQUIRE_DEBUG_TRAPS();

  uint32_t child_tid = 0;
  std::thread child([&child_tid] {
    child_tid = Tid();
    WriteTarget(&g_thread_target, kWrites);
  });
  child.join();
  ASSERT_NE(child_tid, 0u);
  ASSERT_NE(child_tid, Tid());

  const std::vector<PerfSample> samples = DrainAll(**bp);
  ASSERT_EQ(samples.size(), static_cast<size_t>(kWrites));
  for (const PerfSample& s : samples) {
    ASSERT_EQ(s.tid, child_tid);
    ASSERT_EQ(s.pid, static_cast<uint32_t>(::getpid()));
    ASSERT_EQ(s.addr, Addr(&g_thread_target));
  }
  EXPECT_EQ((*bp)->ring()->lost(), 0u);
  absl::StatusOr<uint64_t> count = (*bp)->Count();
  ASSERT_TRUE(count.ok()) << count.status();
  EXPECT_EQ(*count, static_cast<uint64_t>(kWrites));  // the child has exited
}

TEST_F(PerfBreakpointTest, InheritedWatchWithRingIsOneEventPerCpu) {
  // Linux refuses to mmap an inherited per-task event, so PerfBreakpoint opens one per CPU.
  BreakpointRequest req = SelfRequest(&g_thread_target, drmgr::DrKind::kWrite);
  req.inherit = true;
  auto bp = PerfBreakpoint::Open(req);
  KW_REQUIRE_FEATURE(bp.ok(), bp.status().ToString());
  ASSERT_NE((*bp)->ring(), nullptr);
  EXPECT_EQ((*bp)->fds().size(), static_cast<size_t>(::sysconf(_SC_NPROCESSORS_ONLN)));
  EXPECT_EQ((*bp)->fds().front(), (*bp)->fd());
  EXPECT_TRUE((*bp)->Disable().ok());
  EXPECT_TRUE((*bp)->Enable().ok());
  const absl::StatusOr<uint64_t> count = (*bp)->Count();
  EXPECT_TRUE(count.ok()) << count.status();
  EXPECT_EQ((*bp)->ring()->Pending(), 0u);

  // Counting only needs no ring, so one inherited event covers every CPU.
  req.ring_pages = 0;
  auto counting = PerfBreakpoint::Open(req);
  ASSERT_TRUE(counting.ok()) << counting.status();
  EXPECT_EQ((*counting)->fds().size(), 1u);
  EXPECT_EQ((*counting)->ring(), nullptr);
}

TEST_F(PerfBreakpointTest, FifthBreakpointOnAThreadIsResourceExhausted) {
  std::vector<std::unique_ptr<PerfBreakpoint>> held;
  // A CPU-wide breakpoint of another process (a kernel watch test running in parallel)
  // holds a slot of every thread on its CPU for a moment: wait for the four to be free.
  constexpr size_t kSlots = drmgr::kNumDebugRegisters;
  absl::Status last = absl::OkStatus();
  for (int attempt = 0; attempt < 100 && held.size() < kSlots; ++attempt) {
    held.clear();
    for (int i = 0; i < drmgr::kNumDebugRegisters; ++i) {
      BreakpointRequest req = SelfRequest(&g_slots[i], drmgr::DrKind::kWrite);
      req.ring_pages = 0;
      auto bp = PerfBreakpoint::Open(req);
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
  BreakpointRequest fifth = SelfRequest(&g_slots[4], drmgr::DrKind::kWrite);
  fifth.ring_pages = 0;
  auto bp = PerfBreakpoint::Open(fifth);
  ASSERT_FALSE(bp.ok());
  EXPECT_EQ(bp.status().code(), absl::StatusCode::kResourceExhausted) << bp.status();
  const std::string msg(bp.status().message());
  EXPECT_THAT(msg, HasSubstr("4 debug registers"));
  EXPECT_THAT(msg, HasSubstr("thread " + std::to_string(::gettid())));
  EXPECT_THAT(msg, HasSubstr("perf_event_open(breakpoint 0x"));
  EXPECT_THAT(msg, HasSubstr("len 8 write, tid " + std::to_string(::gettid())));

  held.pop_back();  // a slot frees as soon as its event closes
  EXPECT_TRUE(PerfBreakpoint::Open(fifth).ok());
}

TEST_F(PerfBreakpointTest, MisalignedRangeIsInvalidArgument) {
  BreakpointRequest req = SelfRequest(&g_slots[0], drmgr::DrKind::kWrite);
  req.addr = req.addr + 4;
  auto bp = PerfBreakpoint::Open(req);
  ASSERT_FALSE(bp.ok());
  EXPECT_EQ(bp.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bp.status().message()), HasSubstr("not aligned to 8 bytes"));

  req = SelfRequest(&g_slots[0], drmgr::DrKind::kWrite);
  req.len = 3;
  bp = PerfBreakpoint::Open(req);
  ASSERT_FALSE(bp.ok());
  EXPECT_EQ(bp.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(PerfBreakpointTest, KernelAddressWithExcludeKernelIsExplained) {
  BreakpointRequest req = SelfRequest(&g_slots[0], drmgr::DrKind::kWrite);
  req.addr = core::RemoteAddr{0xffffffff81000000ULL};
  req.exclude_kernel = true;
  auto bp = PerfBreakpoint::Open(req);
  ASSERT_FALSE(bp.ok());
  EXPECT_EQ(bp.status().code(), absl::StatusCode::kInvalidArgument) << bp.status();
  EXPECT_THAT(std::string(bp.status().message()), HasSubstr("kernel address"));
}

TEST_F(PerfBreakpointTest, ExitedThreadIsNotFound) {
  pid_t gone = 0;
  std::thread t([&gone] { gone = ::gettid(); });
  t.join();
  BreakpointRequest req = SelfRequest(&g_slots[0], drmgr::DrKind::kWrite);
  req.tid = gone;
  auto bp = PerfBreakpoint::Open(req);
  ASSERT_FALSE(bp.ok());
  EXPECT_EQ(bp.status().code(), absl::StatusCode::kNotFound) << bp.status();
  EXPECT_THAT(std::string(bp.status().message()),
              HasSubstr("thread " + std::to_string(gone) + " exited"));
}

TEST_F(PerfBreakpointTest, RingPagesMustBeAPowerOfTwo) {
  BreakpointRequest req = SelfRequest(&g_slots[0], drmgr::DrKind::kWrite);
  req.ring_pages = 3;
  auto bp = PerfBreakpoint::Open(req);
  ASSERT_FALSE(bp.ok());
  EXPECT_EQ(bp.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kwatch::watch
