// Throughput of the debug-register allocator (drmgr/slot_allocator.h), pure logic: every
// Request and Release recomputes the whole decision, numbers the slots and returns the change
// list; Rotate does the same for one multiplexing turn.
//
// Arguments: the number of other live requests ("background"), one 8-byte watch in each of
// that many other threads of the same process, so the counting of shared scopes has work.

#include <cstdint>
#include <cstdlib>

#include <benchmark/benchmark.h>

#include "drmgr/slot_allocator.h"

namespace kwatch::drmgr {
namespace {

SlotRequest Watch(uint64_t addr, uint64_t len, Scope scope, DrKind kind = DrKind::kWrite,
                  ShortagePolicy policy = ShortagePolicy::kFallbackPages) {
  SlotRequest r;
  r.addr = core::RemoteAddr{addr};
  r.len = len;
  r.kind = kind;
  r.scope = scope;
  r.priority = DefaultPriority(ClientKind::kWatchpoint);
  r.policy = policy;
  return r;
}

constexpr Scope kThread = Scope::Thread(1000, 1001);

void AddBackground(SlotAllocator& alloc, ClientId client, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const Scope s = Scope::Thread(1000, static_cast<pid_t>(2000 + i));
    if (!alloc.Request(client, Watch(0x9000 + 8 * static_cast<uint64_t>(i), 8, s)).ok()) {
      std::abort();
    }
  }
}

void RequestRelease(benchmark::State& state, const SlotRequest& req, bool share) {
  SlotAllocator alloc;
  const ClientId client = alloc.AddClient(ClientKind::kWatchpoint, "bench");
  AddBackground(alloc, client, state.range(0));
  if (share && !alloc.Request(client, Watch(req.addr.value, req.len, kThread)).ok()) {
    std::abort();
  }
  size_t changes = 0;
  for (auto _ : state) {
    absl::StatusOr<Grant> g = alloc.Request(client, req);
    if (!g.ok() || g->state != RequestState::kHardware) {
      state.SkipWithError("request not granted");
      break;
    }
    absl::StatusOr<Changes> c = alloc.Release(g->id);
    if (!c.ok()) {
      state.SkipWithError("release failed");
      break;
    }
    changes += g->changes.slots.size() + c->slots.size();
  }
  state.SetItemsProcessed(state.iterations());  // request+release pairs
  state.counters["slot_changes"] =
      benchmark::Counter(static_cast<double>(changes), benchmark::Counter::kAvgIterations);
}

void BM_RequestRelease_OneChunk(benchmark::State& state) {
  RequestRelease(state, Watch(0x1000, 8, kThread), /*share=*/false);
}
BENCHMARK(BM_RequestRelease_OneChunk)->Arg(0)->Arg(8)->Arg(32);

// A 24-byte struct at an 8-aligned address: split into 3 slots.
void BM_RequestRelease_Split24(benchmark::State& state) {
  RequestRelease(state, Watch(0x1000, 24, kThread), /*share=*/false);
}
BENCHMARK(BM_RequestRelease_Split24)->Arg(0)->Arg(8)->Arg(32);

// A read-write request joining a write request's slot: the slot is re-armed read-write.
void BM_RequestRelease_Shared(benchmark::State& state) {
  RequestRelease(state, Watch(0x1000, 8, kThread, DrKind::kReadWrite), /*share=*/true);
}
BENCHMARK(BM_RequestRelease_Shared)->Arg(0)->Arg(8)->Arg(32);

// 16 multiplexed 8-byte watches on one thread (4 slots): one turn per iteration.
void BM_Rotate16(benchmark::State& state) {
  SlotAllocator alloc;
  const ClientId client = alloc.AddClient(ClientKind::kWatchpoint, "bench");
  for (uint64_t i = 0; i < 16; ++i) {
    if (!alloc
             .Request(client,
                      Watch(0x1000 + 8 * i, 8, kThread, DrKind::kWrite, ShortagePolicy::kMultiplex))
             .ok()) {
      std::abort();
    }
  }
  absl::Time now = absl::UnixEpoch();
  size_t changes = 0;
  for (auto _ : state) {
    now += alloc.rotate_interval();
    changes += alloc.Rotate(now).slots.size();
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["slot_changes"] =
      benchmark::Counter(static_cast<double>(changes), benchmark::Counter::kAvgIterations);
}
BENCHMARK(BM_Rotate16);

void BM_Snapshot(benchmark::State& state) {
  SlotAllocator alloc;
  const ClientId client = alloc.AddClient(ClientKind::kWatchpoint, "bench");
  AddBackground(alloc, client, state.range(0));
  for (auto _ : state) {
    benchmark::DoNotOptimize(alloc.Snapshot());
  }
}
BENCHMARK(BM_Snapshot)->Arg(8)->Arg(32);

}  // namespace
}  // namespace kwatch::drmgr

BENCHMARK_MAIN();
