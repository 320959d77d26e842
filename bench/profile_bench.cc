// Ingest rate of the storage-profiling model (watch/profile), in memory, on one core.
//
// The workload: one watched 128-byte structure with 16 leaf fields over two cache lines
// (longs, ints, shorts, bitfields, a char array), 4 threads and 50 accessing instructions,
// accesses skewed towards a few hot fields (like a real server's counters), 40% writes,
// every event carrying a value, times advancing 64 ns per event on average (so the automatic
// time axis keeps doubling its width as the run goes on). The events are generated once;
// the loop feeds them round and round, shifting their times forward on each lap.
//
// BM_ProfileIngest: page-mode events (exact accessed bytes). BM_ProfileIngestPerfMode: perf
// stream events (only the watched 8-byte range is known). BM_ProfileSnapshot: the cost of the
// copy a GUI takes (the profile after 1M events). items_per_second is events/s.

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include <benchmark/benchmark.h>

#include "core/event.h"
#include "watch/profile/storage_profile.h"

namespace kwatch::watch {
namespace {

constexpr uint64_t kBase = 0x601040;  // 64-byte aligned: fields sit in lines 0x601040, 0x601080
constexpr uint64_t kStart = 1'000'000'000;
constexpr size_t kEvents = size_t{1} << 16;

profile::WatchedObject Stats() {
  profile::WatchedObject o;
  o.id = 0;
  o.expr = "g_stats";
  o.addr = core::RemoteAddr{kBase};
  o.length = 128;
  o.type_name = "struct server_stats";
  o.fields = {
      {".requests", "long", 0, 8, 0, 0, 0, true},
      {".bytes_in", "long", 8, 8, 0, 0, 0, true},
      {".bytes_out", "long", 16, 8, 0, 0, 0, true},
      {".errors", "int", 24, 4, 0, 0, 0, true},
      {".active", "int", 28, 4, 0, 0, 0, true},
      {".state", "unsigned int", 32, 4, 0, 4, 0, true},
      {".prio", "unsigned int", 32, 4, 4, 4, 0, true},
      {".flags", "unsigned int", 32, 4, 8, 8, 0, true},
      {".port", "short", 36, 2, 0, 0, 0, true},
      {".backlog", "short", 38, 2, 0, 0, 0, true},
      {".name", "char[16]", 40, 16, 0, 0, 0, true},
      {".last_ns", "long", 56, 8, 0, 0, 0, true},
      {".hits", "long", 64, 8, 0, 0, 0, true},
      {".misses", "long", 72, 8, 0, 0, 0, true},
      {".evictions", "long", 80, 8, 0, 0, 0, true},
      {".lock", "int", 88, 4, 0, 0, 0, true},
  };
  return o;
}

std::vector<core::AccessEvent> Workload(bool perf_mode) {
  const profile::WatchedObject o = Stats();
  std::mt19937_64 rng(42);
  // Skewed field choice: weight 16, 8, 8, 4, ... (hot counters first).
  std::vector<double> weights;
  for (size_t f = 0; f < o.fields.size(); ++f) {
    weights.push_back(f < 3 ? 16.0 / static_cast<double>(f + 1) : 1.0);
  }
  std::discrete_distribution<size_t> pick_field(weights.begin(), weights.end());
  std::vector<core::AccessEvent> events(kEvents);
  uint64_t t = kStart;
  for (core::AccessEvent& ev : events) {
    const size_t f = pick_field(rng);
    const core::symbols::FieldLayout& fl = o.fields[f];
    const bool write = rng() % 10 < 4;
    t += 1 + rng() % 127;
    ev.time_ns = t;
    ev.pid = 1000;
    ev.tid = static_cast<pid_t>(1001 + rng() % 4);
    ev.watch_id = 0;
    // 50 sites: 3 per field (one of them writes), plus 2 that read whole lines (memcpy).
    const uint64_t site = rng() % 25 == 0 ? 48 + rng() % 2 : f * 3 + (write ? 0 : 1 + rng() % 2);
    ev.ip = core::RemoteAddr{0x401000 + site * 0x10};
    ev.trap_ip = ev.ip + 4;
    const uint64_t size = site >= 48 ? 8 : std::min<uint64_t>(fl.size, 8);
    const uint64_t off = site >= 48 ? (site - 48) * 64 : fl.offset;
    ev.kind = write && site < 48 ? core::AccessKind::kWrite : core::AccessKind::kRead;
    if (perf_mode) {
      ev.addr = core::RemoteAddr{kBase + off / 8 * 8};
      ev.len = 8;
      ev.access_addr = ev.addr;
      ev.access_size = 0;
    } else {
      ev.addr = core::RemoteAddr{kBase + off / 8 * 8};
      ev.len = 8;
      ev.access_addr = core::RemoteAddr{kBase + off};
      ev.access_size = static_cast<uint32_t>(size);
    }
    ev.value = rng();
    ev.value_exact = false;
  }
  return events;
}

// Adds events[i] and moves on; after the last event, shifts all times by one lap.
void Feed(profile::StorageProfile& profile, std::vector<core::AccessEvent>& events, size_t& i) {
  profile.Add(events[i]);
  if (++i == events.size()) {
    i = 0;
    const uint64_t lap_ns = events.back().time_ns - events.front().time_ns + 64;
    for (core::AccessEvent& ev : events) {
      ev.time_ns += lap_ns;
    }
  }
}

void Ingest(benchmark::State& state, bool perf_mode) {
  std::vector<core::AccessEvent> events = Workload(perf_mode);
  profile::ProfileOptions opts;
  opts.start_ns = kStart;
  profile::StorageProfile profile({Stats()}, opts);
  size_t i = 0;
  for (auto _ : state) {
    Feed(profile, events, i);
  }
  benchmark::DoNotOptimize(profile.events());
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
  state.counters["threads"] = static_cast<double>(profile.threads().size());
  state.counters["sites"] = static_cast<double>(profile.ObjectSites(0).size());
  state.counters["bucket_ms"] = static_cast<double>(profile.bins().width_ns()) / 1e6;
  state.counters["false_sharing"] = static_cast<double>(profile.FalseSharing().size());
}

void BM_ProfileIngest(benchmark::State& state) {
  Ingest(state, false);
}
BENCHMARK(BM_ProfileIngest);

void BM_ProfileIngestPerfMode(benchmark::State& state) {
  Ingest(state, true);
}
BENCHMARK(BM_ProfileIngestPerfMode);

void BM_ProfileSnapshot(benchmark::State& state) {
  std::vector<core::AccessEvent> events = Workload(false);
  profile::ProfileOptions opts;
  opts.start_ns = kStart;
  profile::StorageProfile profile({Stats()}, opts);
  size_t i = 0;
  for (int n = 0; n < 1'000'000; ++n) {
    Feed(profile, events, i);
  }
  for (auto _ : state) {
    auto snap = std::make_shared<const profile::StorageProfile>(profile);
    benchmark::DoNotOptimize(snap.get());
  }
}
BENCHMARK(BM_ProfileSnapshot)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace kwatch::watch

BENCHMARK_MAIN();
