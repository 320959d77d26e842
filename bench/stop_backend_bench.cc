// Cost of making drmgr's decisions real in stop mode: StopBackend::Apply of one process-scope
// slot on a target with N threads (stop every thread, PTRACE_POKEUSER of DRn and DR7 in each,
// resume), alternately arming and disarming the slot. Measured on tests/targets/stop_target.
//
//   stop_backend_bench [--benchmark_filter=...]
#include <signal.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "absl/strings/str_cat.h"
#include "core/expr.h"
#include "core/process.h"
#include "core/symbolizer.h"
#include "core/symbols.h"
#include "drmgr/slot_allocator.h"
#include "watch/stop_backend.h"

namespace {

using kwatch::core::Process;

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
    for (const kwatch::core::ProcessEvent& e : *ev) {
      if (e.kind == kwatch::core::ProcessEvent::Kind::kExited) {
        return false;
      }
      if (e.kind == kwatch::core::ProcessEvent::Kind::kSignal && e.signal == SIGUSR1) {
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
  auto symbols = kwatch::core::Symbols::ForProcess((*proc)->pid());
  if (!symbols.ok()) {
    state.SkipWithError(std::string(symbols.status().message()).c_str());
    return;
  }
  auto expr = kwatch::core::ParseExpr("g_rec.a");
  auto target = (*symbols)->Resolve(*expr, [&](kwatch::core::RemoteAddr a, std::span<uint8_t> o) {
    return (*proc)->ReadMemory(a, o);
  });
  if (!target.ok()) {
    state.SkipWithError(std::string(target.status().message()).c_str());
    return;
  }
  kwatch::core::Symbolizer symbolizer(**symbols);
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
BENCHMARK(BM_ApplyOnThreads)
    ->Arg(1)
    ->Arg(4)
    ->Arg(16)
    ->Arg(64)
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
