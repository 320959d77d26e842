// Costs of stop mode (watch/stop_backend.h), measured on tests/targets/stop_target:
//  - BM_ApplyOnThreads: making drmgr's decisions real, StopBackend::Apply of one process-scope
//    slot on a target with N threads (stop every thread, open or close one sigtrap breakpoint
//    in each, resume), alternately arming and disarming the slot;
//  - BM_HitCost: one access end to end where debug traps are delivered (the debug exception,
//    the SIGTRAP stop, kwatch decoding the access and reading old and new values, the resume),
//    over `count N` (N stores and N loads of g_rec.a under a read-write slot); skipped on
//    machines that never deliver debug traps.
//
//   stop_backend_bench [--benchmark_filter=...]
#include <signal.h>
#include <time.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "absl/strings/str_cat.h"
#include "core/ptrace/process.h"
#include "core/symbols/expr.h"
#include "core/symbols/symbolizer.h"
#include "core/symbols/symbols.h"
#include "drmgr/slot_allocator.h"
#include "watch/stop_backend.h"

namespace {

using kwatch::core::ptrace::Process;

#ifndef KWATCH_TARGETS_DIR
#define KWATCH_TARGETS_DIR "build/default/tests/targets"
#endif

// Runs `proc` until its SIGUSR1 milestone (its threads are started).
bool WaitMilestone(Process& proc) {
  for (;;) {
    auto ev = proc.Poll(true);
    if (!ev.ok()) {
      return false;
    }
    for (const kwatch::core::ptrace::ProcessEvent& e : *ev) {
      if (e.kind == kwatch::core::ptrace::ProcessEvent::Kind::kExited) {
        return false;
      }
      if (e.kind == kwatch::core::ptrace::ProcessEvent::Kind::kSignal && e.signal == SIGUSR1) {
        return true;
      }
    }
  }
}

void BM_ApplyOnThreads(benchmark::State& state) {
  const int64_t threads = state.range(0);
  auto proc = Process::Launch({std::string(KWATCH_TARGETS_DIR) + "/stop_target", "threads",
                               absl::StrCat(threads - 1), "0"});
  if (!proc.ok() || !(*proc)->RunToEntry().ok() || !(*proc)->ResumeAll().ok() ||
      !WaitMilestone(**proc)) {
    state.SkipWithError("cannot start stop_target");
    return;
  }
  auto symbols = kwatch::core::symbols::Symbols::ForProcess((*proc)->pid());
  if (!symbols.ok()) {
    state.SkipWithError(std::string(symbols.status().message()).c_str());
    return;
  }
  auto expr = kwatch::core::symbols::ParseExpr("g_rec.a");
  auto target = (*symbols)->Resolve(*expr, [&](kwatch::core::RemoteAddr a, std::span<uint8_t> o) {
    return (*proc)->ReadMemory(a, o);
  });
  if (!target.ok()) {
    state.SkipWithError(std::string(target.status().message()).c_str());
    return;
  }
  kwatch::core::symbols::Symbolizer symbolizer(**symbols);
  std::vector<kwatch::watch::Watch> watches(1);
  watches[0].target = *target;
  kwatch::drmgr::SlotAllocator alloc;
  const auto client = alloc.AddClient(kwatch::drmgr::ClientKind::kWatchpoint, "bench");
  kwatch::drmgr::SlotRequest req;
  req.addr = target->addr;
  req.len = target->length;
  req.scope = kwatch::drmgr::Scope::Process((*proc)->pid());
  auto grant = alloc.Request(client, req);
  if (!grant.ok()) {
    state.SkipWithError(std::string(grant.status().message()).c_str());
    return;
  }
  auto release = alloc.Release(grant->id);
  if (!release.ok()) {
    state.SkipWithError("release refused");
    return;
  }
  kwatch::watch::StopBackend backend(**proc, watches, symbolizer, {{grant->id, 0}});
  (void)backend.Arm();
  bool arm = true;
  for (auto _ : state) {
    const absl::Status s = backend.Apply(arm ? grant->changes : *release);
    if (!s.ok()) {
      state.SkipWithError(std::string(s.message()).c_str());
      break;
    }
    arm = !arm;
  }
  state.counters["threads"] = static_cast<double>(threads);
  state.counters["per_thread"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * static_cast<double>(threads),
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  backend.Disarm();
  (void)(*proc)->Kill();
}
uint64_t NowNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ULL + static_cast<uint64_t>(ts.tv_nsec);
}

void BM_HitCost(benchmark::State& state) {
  const int64_t n = state.range(0);
  uint64_t hits = 0;
  for (auto _ : state) {
    auto proc = Process::Launch(
        {std::string(KWATCH_TARGETS_DIR) + "/stop_target", "count", absl::StrCat(n)});
    if (!proc.ok() || !(*proc)->RunToEntry().ok() || !(*proc)->ResumeAll().ok() ||
        !WaitMilestone(**proc)) {
      state.SkipWithError("cannot start stop_target");
      return;
    }
    auto symbols = kwatch::core::symbols::Symbols::ForProcess((*proc)->pid());
    if (!symbols.ok()) {
      state.SkipWithError(std::string(symbols.status().message()).c_str());
      return;
    }
    const auto read = [&](kwatch::core::RemoteAddr a, std::span<uint8_t> o) {
      return (*proc)->ReadMemory(a, o);
    };
    auto target = (*symbols)->Resolve(*kwatch::core::symbols::ParseExpr("g_rec.a"), read);
    auto go = (*symbols)->Resolve(*kwatch::core::symbols::ParseExpr("g_go"), read);
    if (!target.ok() || !go.ok()) {
      state.SkipWithError("cannot resolve g_rec.a and g_go");
      return;
    }
    kwatch::core::symbols::Symbolizer symbolizer(**symbols);
    std::vector<kwatch::watch::Watch> watches(1);
    watches[0].target = *target;
    kwatch::drmgr::SlotAllocator alloc;
    const auto client = alloc.AddClient(kwatch::drmgr::ClientKind::kWatchpoint, "bench");
    kwatch::drmgr::SlotRequest req;
    req.addr = target->addr;
    req.len = target->length;
    req.kind = kwatch::drmgr::DrKind::kReadWrite;
    req.scope = kwatch::drmgr::Scope::Process((*proc)->pid());
    auto grant = alloc.Request(client, req);
    kwatch::watch::StopBackend backend(**proc, watches, symbolizer, {{grant->id, 0}});
    if (!backend.Arm().ok() || !backend.Apply(grant->changes).ok()) {
      state.SkipWithError("cannot arm");
      return;
    }
    const uint64_t one = 1;
    if (!(*proc)
             ->WriteMemory(go->addr, std::span<const uint8_t>(
                                         reinterpret_cast<const uint8_t*>(&one), sizeof(one)))
             .ok()) {
      state.SkipWithError("cannot write g_go");
      return;
    }
    const uint64_t t0 = NowNs();
    while ((*proc)->alive()) {
      if (!(*proc)->Poll(true).ok()) {
        break;
      }
    }
    state.SetIterationTime(static_cast<double>(NowNs() - t0) / 1e9);
    std::vector<kwatch::core::AccessEvent> events;
    backend.Collect(events);
    if (events.size() != static_cast<size_t>(2 * n)) {
      state.SkipWithError(absl::StrCat("counted ", events.size(), " of ", 2 * n,
                                       " accesses: this machine does not deliver every debug trap")
                              .c_str());
      return;
    }
    hits += events.size();
  }
  state.counters["per_hit"] = benchmark::Counter(
      static_cast<double>(hits), benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_HitCost)->Arg(2000)->Unit(benchmark::kMillisecond)->UseManualTime();

BENCHMARK(BM_ApplyOnThreads)
    ->Arg(1)
    ->Arg(4)
    ->Arg(16)
    ->Arg(64)
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
