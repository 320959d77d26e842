// Cost of one watched access in page-protection mode, measured on the
// tests/targets/field_writer fixture: from arming to the target's exit, minus the same run
// unwatched (from resuming it to its exit), divided by the faults taken.
//
//   page_watch_bench [--benchmark_filter=...]
#include <chrono>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "absl/strings/str_cat.h"
#include "core/ptrace/process.h"
#include "watch/page_backend.h"
#include "watch/session.h"

namespace {

using kwatch::core::ptrace::Process;

#ifndef KWATCH_TARGETS_DIR
#define KWATCH_TARGETS_DIR "build/default/tests/targets"
#endif

struct RunStats {
  double seconds = 0;
  uint64_t events = 0;
  uint64_t unrelated = 0;
};

// Launches field_writer 1 ITERS, optionally watching `expr` (page backend), runs it to its end.
RunStats RunOnce(int64_t iters, const std::string& expr, kwatch::drmgr::DrKind kind,
                 benchmark::State& state) {
  RunStats stats;
  auto proc = Process::Launch({std::string(KWATCH_TARGETS_DIR) + "/field_writer", "1",
                               absl::StrCat(iters), "--truth", "/dev/null"});
  if (!proc.ok()) {
    state.SkipWithError(std::string(proc.status().message()).c_str());
    return stats;
  }
  if (!(*proc)->RunToEntry().ok()) {
    state.SkipWithError("target did not reach its entry point");
    return stats;
  }
  std::unique_ptr<kwatch::watch::WatchSession> session;
  // Timed from the moment the target runs again (symbol loading is not part of a hit).
  auto start = std::chrono::steady_clock::now();
  if (!expr.empty()) {
    kwatch::watch::WatchRequest req;
    req.expr = expr;
    req.kind = kind;
    kwatch::watch::SessionOptions opts;
    opts.backend = kwatch::watch::BackendKind::kPage;
    auto s = kwatch::watch::WatchSession::Create(**proc, {req}, opts);
    start = std::chrono::steady_clock::now();
    if (!s.ok() || !(*s)->Arm().ok()) {
      state.SkipWithError("cannot arm the page watch");
      return stats;
    }
    session = std::move(*s);
  } else {
    (void)(*proc)->ResumeAll();
  }
  while ((*proc)->alive()) {
    if (!(*proc)->Poll(/*block=*/true).ok()) {
      state.SkipWithError("lost the target");
      return stats;
    }
  }
  if (session != nullptr) {
    stats.events = session->Drain([](const kwatch::core::AccessEvent&) {});
    stats.unrelated = session->unrelated();
  }
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return stats;
}

void PageWatch(benchmark::State& state, const std::string& expr, kwatch::drmgr::DrKind kind) {
  const int64_t iters = state.range(0);
  double watched = 0;
  double baseline = 0;
  uint64_t events = 0;
  uint64_t unrelated = 0;
  for (auto _ : state) {
    const RunStats base = RunOnce(iters, "", kind, state);
    const RunStats w = RunOnce(iters, expr, kind, state);
    baseline += base.seconds;
    watched += w.seconds;
    events += w.events;
    unrelated += w.unrelated;
    state.SetIterationTime(w.seconds);
  }
  const uint64_t faults = events + unrelated;
  state.counters["events"] =
      benchmark::Counter(static_cast<double>(events), benchmark::Counter::kAvgIterations);
  state.counters["faults"] =
      benchmark::Counter(static_cast<double>(faults), benchmark::Counter::kAvgIterations);
  state.counters["ns_per_fault"] =
      faults == 0 ? 0 : (watched - baseline) * 1e9 / static_cast<double>(faults);
}

// Every iteration of the fixture stores to g_stats.hits (emulated mov), so each store faults.
void BM_PageWatchWrite(benchmark::State& state) {
  PageWatch(state, "g_stats.hits", kwatch::drmgr::DrKind::kWrite);
}
BENCHMARK(BM_PageWatchWrite)
    ->Arg(2000)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->Iterations(3);

// Read-write: every access to the page faults (loads and read-modify-writes too).
void BM_PageWatchReadWrite(benchmark::State& state) {
  PageWatch(state, "g_stats.flags", kwatch::drmgr::DrKind::kReadWrite);
}
BENCHMARK(BM_PageWatchReadWrite)
    ->Arg(2000)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->Iterations(3);

}  // namespace

BENCHMARK_MAIN();
