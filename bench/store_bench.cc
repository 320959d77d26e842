// Trace store throughput: TraceWriter::Append and AppendHit (commits included) and
// TraceReader::ForEachEvent.
//
// BM_Append writes kAppendEvents events into a fresh recording per iteration and times Append
// plus the final Flush, i.e. every commit (WAL, synchronous=NORMAL, default batch of 8192);
// Finish (checkpoint, leaving WAL mode) is reported apart as finish_ms. BM_ForEachEvent reads a
// recording of kReadEvents events (written once, outside the timing) front to back;
// BM_ForEachEventWindow reads the last 1% of it through a time filter. The recordings live in
// $KWATCH_BENCH_DIR (default /tmp) and are removed at exit.
//
// BM_AppendHit/0 and /1 write kAppendHits probe hits of `kwatch probe 'tick i=%di r->len'`
// (two arguments, 4 threads) in hit blocks (schema 8) and in `hits` rows (the schema 7 form,
// what `kwatch export --sql` gives), timed the same way.
//
// Counters: items_per_second = events (hits) per second; bytes_per_event = file size / events.

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>

#include <benchmark/benchmark.h>

#include "core/event.h"
#include "core/store/trace_reader.h"
#include "core/store/trace_records.h"
#include "core/store/trace_writer.h"

namespace kwatch::core {
namespace {

constexpr uint64_t kAppendEvents = 2'000'000;
constexpr uint64_t kReadEvents = 10'000'000;

std::string BenchPath(const char* name) {
  const char* dir = std::getenv("KWATCH_BENCH_DIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/kwatch_store_bench_" +
         std::to_string(::getpid()) + "_" + name + ".kwdb";
}

// A plausible event stream: 4 threads on 2 CPUs, 64 code sites, one 64-byte watched struct.
AccessEvent MakeEvent(uint64_t i) {
  AccessEvent e;
  e.time_ns = 1'000'000'000ULL + i * 97;
  e.pid = 4242;
  e.tid = static_cast<pid_t>(4242 + (i & 3));
  e.cpu = static_cast<uint32_t>(i & 1);
  e.watch_id = static_cast<uint32_t>(i % 3 == 0);
  e.ip = RemoteAddr{0x55555555a000ULL + ((i * 7) & 63) * 0x13};
  e.trap_ip = e.ip + 4;
  e.addr = RemoteAddr{0x7ffff7dd0040ULL};
  e.len = 8;
  e.access_addr = e.addr + (i & 7);
  e.access_size = 4;
  e.kind = (i & 3) == 0 ? AccessKind::kRead : AccessKind::kWrite;
  e.value = i * 3;
  if ((i & 1) != 0) {
    e.old_value = i * 3 - 3;
  }
  e.value_exact = (i & 1) != 0;
  return e;
}

store::SessionRecord BenchSession() {
  store::SessionRecord s = store::SessionRecordForThisHost();
  s.command_line = "kwatch --rw bench -o bench.kwdb";
  s.pid = 4242;
  s.kwatch_version = "bench";
  s.mode = "watch";
  s.backend = "perf";
  return s;
}

store::WatchRecord BenchWatch(uint32_t id) {
  store::WatchRecord w;
  w.id = id;
  w.expr = "g_stats";
  w.address = RemoteAddr{0x7ffff7dd0040ULL};
  w.length = 64;
  w.kind = "rw";
  w.backend = "perf";
  return w;
}

uint64_t FileSize(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

void BM_Append(benchmark::State& state) {
  const std::string path = BenchPath("append");
  double finish_ms = 0;
  uint64_t size = 0;
  uint64_t wal_size = 0;
  for (auto _ : state) {
    auto writer = store::TraceWriter::Create(path, BenchSession());
    if (!writer.ok()) {
      state.SkipWithError(std::string(writer.status().message()).c_str());
      return;
    }
    store::TraceWriter& w = **writer;
    (void)w.AddWatch(BenchWatch(0));
    (void)w.AddWatch(BenchWatch(1));
    const auto t0 = std::chrono::steady_clock::now();
    bool ok = true;
    for (uint64_t i = 0; i < kAppendEvents && ok; ++i) {
      ok = w.Append(MakeEvent(i)).ok();
    }
    ok = ok && w.Flush().ok();
    const auto t1 = std::chrono::steady_clock::now();
    wal_size = FileSize(path + "-wal");
    ok = ok && w.Finish(store::SessionEnd{}).ok();
    const auto t2 = std::chrono::steady_clock::now();
    if (!ok) {
      state.SkipWithError("write failed");
      return;
    }
    state.SetIterationTime(std::chrono::duration<double>(t1 - t0).count());
    finish_ms = std::chrono::duration<double, std::milli>(t2 - t1).count();
    size = FileSize(path);
  }
  ::unlink(path.c_str());
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(kAppendEvents));
  state.counters["finish_ms"] = finish_ms;
  state.counters["wal_MiB_before_finish"] = static_cast<double>(wal_size) / (1 << 20);
  state.counters["bytes_per_event"] =
      static_cast<double>(size) / static_cast<double>(kAppendEvents);
}
BENCHMARK(BM_Append)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(3);

constexpr uint64_t kAppendHits = 2'000'000;

store::HitRecord MakeHit(uint64_t i) {
  store::HitRecord h;
  h.time_ns = 1'000'000'000ULL + i * 70;
  h.pid = 4242;
  h.tid = static_cast<pid_t>(4242 + (i & 3));
  h.probe_id = 1;
  h.ip = RemoteAddr{0x555555555149ULL};
  h.args = {{"i", std::to_string(i >> 2)}, {"r->len", std::to_string(100 + (i & 3))}};
  return h;
}

void BM_AppendHit(benchmark::State& state) {
  const auto storage =
      state.range(0) == 0 ? store::EventStorage::kBlocks : store::EventStorage::kRows;
  const std::string path = BenchPath("append_hit");
  uint64_t size = 0;
  for (auto _ : state) {
    store::SessionRecord session = BenchSession();
    session.mode = "probe";
    auto writer =
        store::TraceWriter::Create(path, session, store::TraceWriter::kDefaultBatchSize, storage);
    if (!writer.ok()) {
      state.SkipWithError(std::string(writer.status().message()).c_str());
      return;
    }
    store::TraceWriter& w = **writer;
    const auto t0 = std::chrono::steady_clock::now();
    bool ok = true;
    for (uint64_t i = 0; i < kAppendHits && ok; ++i) {
      ok = w.AppendHit(MakeHit(i)).ok();
    }
    ok = ok && w.Flush().ok();
    const auto t1 = std::chrono::steady_clock::now();
    ok = ok && w.Finish(store::SessionEnd{}).ok();
    if (!ok) {
      state.SkipWithError("write failed");
      return;
    }
    state.SetIterationTime(std::chrono::duration<double>(t1 - t0).count());
    size = FileSize(path);
  }
  ::unlink(path.c_str());
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(kAppendHits));
  state.counters["bytes_per_event"] = static_cast<double>(size) / static_cast<double>(kAppendHits);
}
BENCHMARK(BM_AppendHit)
    ->Arg(0)
    ->Arg(1)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->Iterations(3);

// The 10-million-event recording, written once per process.
const std::string& ReadFixture() {
  static const std::string* path = [] {
    auto* p = new std::string(BenchPath("read"));
    auto writer = store::TraceWriter::Create(*p, BenchSession());
    if (!writer.ok()) {
      return p;
    }
    (void)(*writer)->AddWatch(BenchWatch(0));
    (void)(*writer)->AddWatch(BenchWatch(1));
    for (uint64_t i = 0; i < kReadEvents; ++i) {
      (void)(*writer)->Append(MakeEvent(i));
    }
    (void)(*writer)->Finish(store::SessionEnd{});
    std::atexit([] { ::unlink(BenchPath("read").c_str()); });
    return p;
  }();
  return *path;
}

void ReadAll(benchmark::State& state, const store::EventFilter& filter, uint64_t expected) {
  auto reader = store::TraceReader::Open(ReadFixture());
  if (!reader.ok()) {
    state.SkipWithError(std::string(reader.status().message()).c_str());
    return;
  }
  uint64_t n = 0;
  uint64_t sum = 0;
  for (auto _ : state) {
    n = 0;
    const absl::Status s = (*reader)->ForEachEvent(filter, [&](const AccessEvent& e) {
      ++n;
      sum += e.access_addr.value;
      return true;
    });
    if (!s.ok() || n != expected) {
      state.SkipWithError("read failed or wrong count");
      return;
    }
  }
  benchmark::DoNotOptimize(sum);
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(n));
  state.counters["bytes_per_event"] =
      static_cast<double>(FileSize(ReadFixture())) / static_cast<double>(kReadEvents);
}

void BM_ForEachEvent(benchmark::State& state) {
  ReadAll(state, store::EventFilter{}, kReadEvents);
}
BENCHMARK(BM_ForEachEvent)->Unit(benchmark::kMillisecond)->Iterations(3);

void BM_ForEachEventWindow(benchmark::State& state) {
  store::EventFilter f;
  f.from_ns = MakeEvent(kReadEvents - kReadEvents / 100).time_ns;
  ReadAll(state, f, kReadEvents / 100);
}
BENCHMARK(BM_ForEachEventWindow)->Unit(benchmark::kMillisecond)->Iterations(10);

}  // namespace
}  // namespace kwatch::core

BENCHMARK_MAIN();
