// Cost of a watched write in stream mode, and of draining the perf ring.
//
// The write benchmarks store to one 8-byte global per iteration. BM_UnwatchedWrite is the
// baseline; the other three arm a hardware write breakpoint on the global for this thread:
// counting only (raw syscalls), sampling into a ring drained by a minimal hand-written loop
// (raw syscalls), and the same through PerfBreakpoint + PerfRing::Drain. Both ring variants
// drain every kDrainEvery writes, so they differ only in the code under test.
//
// Counters: ns_per_hit = wall time per watched write (one write = one hit when the debug
// registers trap); hits = samples (or counts) actually delivered; lost = PERF_RECORD_LOST.
// If hits != iterations the label says so.
//
// On a machine whose hypervisor does not deliver debug-register traps (ProbeDebugTraps()),
// an armed breakpoint never fires and its write costs nothing: the three armed benchmarks
// then skip with the probe's explanation instead of reporting meaningless numbers, and only
// the baseline and the ring-drain benchmarks run.

#include <linux/hw_breakpoint.h>
#include <linux/perf_event.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <array>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "core/base/clock.h"
#include "core/base/unique_fd.h"
#include "core/base/unique_mmap.h"
#include "watch/hw_probe.h"
#include "watch/perf_breakpoint.h"
#include "watch/perf_ring.h"

namespace kwatch::watch {
namespace {

alignas(64) volatile uint64_t g_target = 0;

constexpr int kDrainEvery = 256;
constexpr size_t kRingPages = 64;

void ReportWrites(benchmark::State& state, uint64_t elapsed_ns, uint64_t hits, uint64_t lost) {
  const auto iterations = static_cast<uint64_t>(state.iterations());
  state.SetItemsProcessed(static_cast<int64_t>(iterations));
  state.counters["ns_per_hit"] =
      iterations == 0 ? 0.0 : static_cast<double>(elapsed_ns) / static_cast<double>(iterations);
  state.counters["hits"] = static_cast<double>(hits);
  state.counters["lost"] = static_cast<double>(lost);
  if (hits != iterations) {
    state.SetLabel("hits != writes: " + std::to_string(hits) + " of " + std::to_string(iterations) +
                   " delivered");
  }
}

// Whether armed-write numbers would mean anything here; if not, skips `state` with the reason.
bool RequireDebugTraps(benchmark::State& state) {
  const DebugTrapProbe& probe = ProbeDebugTraps();
  if (!probe.delivered) {
    state.SkipWithError(probe.detail.c_str());
    return false;
  }
  return true;
}

// A raw breakpoint on g_target for this thread: sample_period 0 = counting only.
core::UniqueFd OpenRawBreakpoint(uint64_t sample_period) {
  perf_event_attr attr{};
  attr.type = PERF_TYPE_BREAKPOINT;
  attr.size = sizeof(attr);
  attr.bp_type = HW_BREAKPOINT_W;
  attr.bp_addr = reinterpret_cast<uintptr_t>(&g_target);
  attr.bp_len = HW_BREAKPOINT_LEN_8;
  attr.sample_period = sample_period;
  attr.sample_type =
      PERF_SAMPLE_IP | PERF_SAMPLE_TID | PERF_SAMPLE_TIME | PERF_SAMPLE_ADDR | PERF_SAMPLE_CPU;
  attr.exclude_kernel = 1;
  attr.exclude_hv = 1;
  attr.use_clockid = 1;
  attr.clockid = CLOCK_MONOTONIC;
  attr.wakeup_events = 1;
  return core::UniqueFd(
      static_cast<int>(::syscall(SYS_perf_event_open, &attr, 0, -1, -1, PERF_FLAG_FD_CLOEXEC)));
}

// The minimal consumer the kwatch ring is compared with.
struct RawRing {
  perf_event_mmap_page* meta = nullptr;
  const uint8_t* data = nullptr;
  uint64_t size = 0;
};

size_t RawDrain(const RawRing& r, uint64_t* addr_sum, uint64_t* lost) {
  const uint64_t head = __atomic_load_n(&r.meta->data_head, __ATOMIC_ACQUIRE);
  uint64_t tail = r.meta->data_tail;
  size_t n = 0;
  alignas(8) std::array<uint8_t, 64> buf{};
  while (tail < head) {
    const uint64_t off = tail & (r.size - 1);
    perf_event_header hdr{};
    std::memcpy(&hdr, r.data + off, sizeof(hdr));
    const uint8_t* rec = r.data + off;
    if (off + hdr.size > r.size && hdr.size <= buf.size()) {
      const size_t first = r.size - off;
      std::memcpy(buf.data(), rec, first);
      std::memcpy(buf.data() + first, r.data, hdr.size - first);
      rec = buf.data();
    }
    if (hdr.type == PERF_RECORD_SAMPLE) {
      uint64_t addr = 0;
      std::memcpy(&addr, rec + 32, sizeof(addr));
      *addr_sum += addr;
      ++n;
    } else if (hdr.type == PERF_RECORD_LOST) {
      uint64_t l = 0;
      std::memcpy(&l, rec + 16, sizeof(l));
      *lost += l;
    }
    tail += hdr.size;
  }
  __atomic_store_n(&r.meta->data_tail, tail, __ATOMIC_RELEASE);
  return n;
}

void BM_UnwatchedWrite(benchmark::State& state) {
  uint64_t i = 0;
  const uint64_t t0 = core::MonotonicNs();
  for (auto _ : state) {
    g_target = i++;
  }
  const uint64_t t1 = core::MonotonicNs();
  ReportWrites(state, t1 - t0, static_cast<uint64_t>(state.iterations()), 0);
}
BENCHMARK(BM_UnwatchedWrite);

void BM_RawPerfCountingWrite(benchmark::State& state) {
  if (!RequireDebugTraps(state)) {
    return;
  }
  core::UniqueFd fd = OpenRawBreakpoint(0);
  if (!fd.valid()) {
    state.SkipWithError("perf_event_open(breakpoint) failed");
    return;
  }
  uint64_t i = 0;
  const uint64_t t0 = core::MonotonicNs();
  for (auto _ : state) {
    g_target = i++;
  }
  const uint64_t t1 = core::MonotonicNs();
  uint64_t count = 0;
  if (::read(fd.get(), &count, sizeof(count)) != static_cast<ssize_t>(sizeof(count))) {
    state.SkipWithError("read(perf count) failed");
    return;
  }
  ReportWrites(state, t1 - t0, count, 0);
}
BENCHMARK(BM_RawPerfCountingWrite);

void BM_RawPerfRingWrite(benchmark::State& state) {
  if (!RequireDebugTraps(state)) {
    return;
  }
  core::UniqueFd fd = OpenRawBreakpoint(1);
  if (!fd.valid()) {
    state.SkipWithError("perf_event_open(breakpoint) failed");
    return;
  }
  const auto page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t size = (1 + kRingPages) * page;
  void* mem = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (mem == MAP_FAILED) {
    state.SkipWithError("mmap(perf ring) failed");
    return;
  }
  core::UniqueMmap map(mem, size);
  RawRing ring{static_cast<perf_event_mmap_page*>(mem), static_cast<uint8_t*>(mem) + page,
               kRingPages * page};
  uint64_t addr_sum = 0;
  uint64_t lost = 0;
  uint64_t hits = 0;
  uint64_t i = 0;
  int until_drain = kDrainEvery;
  const uint64_t t0 = core::MonotonicNs();
  for (auto _ : state) {
    g_target = i++;
    if (--until_drain == 0) {
      hits += RawDrain(ring, &addr_sum, &lost);
      until_drain = kDrainEvery;
    }
  }
  hits += RawDrain(ring, &addr_sum, &lost);
  const uint64_t t1 = core::MonotonicNs();
  benchmark::DoNotOptimize(addr_sum);
  ReportWrites(state, t1 - t0, hits, lost);
}
BENCHMARK(BM_RawPerfRingWrite);

void BM_KwatchStreamWrite(benchmark::State& state) {
  if (!RequireDebugTraps(state)) {
    return;
  }
  BreakpointRequest req;
  req.addr = core::RemoteAddr{reinterpret_cast<uintptr_t>(&g_target)};
  req.len = 8;
  req.kind = drmgr::DrKind::kWrite;
  req.tid = ::gettid();
  req.inherit = false;
  req.ring_pages = kRingPages;
  auto bp = PerfBreakpoint::Open(req);
  if (!bp.ok()) {
    state.SkipWithError(bp.status().ToString().c_str());
    return;
  }
  PerfRing* ring = (*bp)->ring();
  uint64_t addr_sum = 0;
  uint64_t hits = 0;
  uint64_t i = 0;
  int until_drain = kDrainEvery;
  const auto sink = [&addr_sum](const PerfSample& s) { addr_sum += s.addr; };
  const uint64_t t0 = core::MonotonicNs();
  for (auto _ : state) {
    g_target = i++;
    if (--until_drain == 0) {
      hits += ring->Drain(sink);
      until_drain = kDrainEvery;
    }
  }
  hits += ring->Drain(sink);
  const uint64_t t1 = core::MonotonicNs();
  benchmark::DoNotOptimize(addr_sum);
  ReportWrites(state, t1 - t0, hits, ring->lost());
}
BENCHMARK(BM_KwatchStreamWrite);

// A watch per call (`--in FUNC`): what arming and disarming one call's object costs in perf
// stream mode, besides its hits. Each iteration is one call: a breakpoint on this call's object
// (one of two globals, alternating, as calls alternate objects), one write to it, its ring
// drained, the breakpoint gone. Open/close is a new event (perf_event_open, mmap of the
// 64-page thread ring, munmap, close) per call; Retarget keeps one event and moves it
// (PERF_EVENT_IOC_MODIFY_ATTRIBUTES, enable, disable), as PerfBackend parks a thread's events
// between its calls. ns_per_call - ns_per_hit (BM_KwatchStreamWrite) is the arming cost.
alignas(64) volatile uint64_t g_call_objects[16] = {};

BreakpointRequest CallRequest(int call) {
  BreakpointRequest req;
  req.addr = core::RemoteAddr{reinterpret_cast<uintptr_t>(&g_call_objects[(call % 2) * 8])};
  req.len = 8;
  req.kind = drmgr::DrKind::kWrite;
  req.tid = ::gettid();
  req.inherit = false;
  req.ring_pages = kRingPages;
  return req;
}

void ReportCalls(benchmark::State& state, uint64_t elapsed_ns, uint64_t hits) {
  const auto calls = static_cast<uint64_t>(state.iterations());
  state.counters["ns_per_call"] =
      calls == 0 ? 0.0 : static_cast<double>(elapsed_ns) / static_cast<double>(calls);
  state.counters["hits"] = static_cast<double>(hits);
  if (hits != calls) {
    state.SetLabel("hits != calls: " + std::to_string(hits) + " of " + std::to_string(calls));
  }
}

void BM_PerCallArmOpenClose(benchmark::State& state) {
  if (!RequireDebugTraps(state)) {
    return;
  }
  uint64_t hits = 0;
  int call = 0;
  const auto sink = [](const PerfSample& /*s*/) {};
  const uint64_t t0 = core::MonotonicNs();
  for (auto _ : state) {
    const BreakpointRequest req = CallRequest(call);
    auto bp = PerfBreakpoint::Open(req);
    if (!bp.ok()) {
      state.SkipWithError(bp.status().ToString().c_str());
      return;
    }
    g_call_objects[(call % 2) * 8] = static_cast<uint64_t>(call);
    hits += (*bp)->ring()->Drain(sink);
    ++call;
  }
  ReportCalls(state, core::MonotonicNs() - t0, hits);
}
BENCHMARK(BM_PerCallArmOpenClose);

void BM_PerCallArmRetarget(benchmark::State& state) {
  if (!RequireDebugTraps(state)) {
    return;
  }
  auto bp = PerfBreakpoint::Open(CallRequest(1));
  if (!bp.ok() || !(*bp)->Disable().ok()) {
    state.SkipWithError(bp.ok() ? "disable failed" : bp.status().ToString().c_str());
    return;
  }
  uint64_t hits = 0;
  int call = 0;
  const auto sink = [](const PerfSample& /*s*/) {};
  const uint64_t t0 = core::MonotonicNs();
  for (auto _ : state) {
    const BreakpointRequest req = CallRequest(call);
    if (absl::Status s = (*bp)->Retarget(req.addr, req.len, req.kind); !s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      return;
    }
    (void)(*bp)->Enable();
    g_call_objects[(call % 2) * 8] = static_cast<uint64_t>(call);
    hits += (*bp)->ring()->Drain(sink);
    (void)(*bp)->Disable();
    ++call;
  }
  ReportCalls(state, core::MonotonicNs() - t0, hits);
}
BENCHMARK(BM_PerCallArmRetarget);

// Synthetic ring (no kernel): K sample records, the first one wrapping around the end.
void BM_RingDrain(benchmark::State& state) {
  const auto records = static_cast<size_t>(state.range(0));
  constexpr size_t kPage = 4096;
  constexpr size_t kDataSize = size_t{256} * 1024;
  std::vector<uint64_t> mem((kPage + kDataSize) / sizeof(uint64_t), 0);
  auto* meta = reinterpret_cast<perf_event_mmap_page*>(mem.data());
  uint8_t* data = reinterpret_cast<uint8_t*>(mem.data()) + kPage;
  const uint64_t start = kDataSize - 16;
  uint64_t pos = start;
  for (size_t r = 0; r < records; ++r) {
    std::array<uint8_t, kPerfSampleRecordSize> rec{};
    perf_event_header hdr{};
    hdr.type = PERF_RECORD_SAMPLE;
    hdr.misc = PERF_RECORD_MISC_USER;
    hdr.size = kPerfSampleRecordSize;
    std::memcpy(rec.data(), &hdr, sizeof(hdr));
    const uint64_t ip = 0x401000 + r;
    const uint64_t addr = 0x601040;
    std::memcpy(rec.data() + 8, &ip, 8);
    std::memcpy(rec.data() + 32, &addr, 8);
    for (uint8_t b : rec) {
      data[pos % kDataSize] = b;
      ++pos;
    }
  }
  meta->data_head = pos;
  PerfRing ring = PerfRing::OverMemory(mem.data(), kPage, kDataSize);
  uint64_t addr_sum = 0;
  size_t drained = 0;
  for (auto _ : state) {
    meta->data_tail = start;  // make the same records pending again
    drained += ring.Drain([&addr_sum](const PerfSample& s) { addr_sum += s.addr; });
  }
  benchmark::DoNotOptimize(addr_sum);
  if (drained != records * static_cast<size_t>(state.iterations())) {
    state.SkipWithError("drained the wrong number of records");
    return;
  }
  state.SetItemsProcessed(static_cast<int64_t>(drained));
  state.SetBytesProcessed(static_cast<int64_t>(drained * kPerfSampleRecordSize));
}
BENCHMARK(BM_RingDrain)->Arg(1)->Arg(16)->Arg(256)->Arg(4096);

// About one hit in millions is a spurious #DB that the kernel turns into a SIGTRAP with no
// breakpoint behind it (DESIGN.md): absorb it rather than die mid-run.
void OnSigtrap(int /*sig*/) {}

}  // namespace
}  // namespace kwatch::watch

int main(int argc, char** argv) {
  struct sigaction sa = {};
  sa.sa_handler = kwatch::watch::OnSigtrap;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  ::sigaction(SIGTRAP, &sa, nullptr);

  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) {
    return 1;
  }
  // Probed here, on the thread that runs the benchmarks, before any breakpoint is armed.
  benchmark::AddCustomContext("debug_traps", kwatch::watch::ProbeDebugTraps().detail);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
