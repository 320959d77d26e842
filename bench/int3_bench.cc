// Cost of one probe hit through kwatch's ptrace INT3 engine (core/probe/int3_engine.h), on
// tests/targets/uprobe_loop N (tick() called N times), next to the same program unprobed.
//
// Each iteration launches the program under a Process (stopped at its entry point), registers
// the probe, runs the program to its exit while handling its traps, and times that run. The
// unprobed case does the same with no probe. Per hit = (probed - unprobed) / N, reported as
// the counter ns_per_hit (and the whole run as Time). Variants:
//  - entry, emulated: a pre handler on tick's first instruction, emulated in kwatch (one stop);
//  - entry, out of line: the same instruction run from the XOL area (one stop);
//  - entry + post handler: out of line followed by a second trap for the post handler;
//  - return probe: tick%return (an entry trap plus a trampoline trap per call).
// The handler counts hits; the run fails (SkipWithError) unless it counted exactly N.
//
// BM_PtraceFloor is the floor under any ptrace backend on this machine: a forked child
// executes N `int3` instructions and a minimal tracer only waits and continues (wait4 +
// PTRACE_CONT per trap), or also reads and writes the registers as an emulating tracer must
// (+ PTRACE_GETREGS/SETREGS). Argument 0 lets the scheduler place tracer and child, 1 pins
// both to the CPU the benchmark started on. kwatch's per-hit cost is this floor plus its
// own work; compare the two (run the whole binary under `taskset -c 0` to pin kwatch too).

#include <sched.h>
#include <sys/ptrace.h>
#include <sys/types.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "absl/strings/str_cat.h"
#include "core/probe/int3_engine.h"
#include "core/ptrace/process.h"
#include "core/symbols/symbols.h"

namespace kwatch::core {
namespace {

constexpr int kCalls = 20000;

enum class Variant { kNone, kEmulated, kOutOfLine, kPost, kReturn };

std::string LoopPath() {
  return std::string(KWATCH_TARGETS_DIR) + "/uprobe_loop";
}

// One launched run; returns its wall time in ns, or -1 with `error` set.
double RunOnce(Variant v, std::string& error) {
  auto p = ptrace::Process::Launch({LoopPath(), absl::StrCat(kCalls)});
  if (!p.ok()) {
    error = std::string(p.status().message());
    return -1;
  }
  std::unique_ptr<ptrace::Process> proc = std::move(*p);
  if (absl::Status s = proc->RunToEntry(); !s.ok()) {
    error = std::string(s.message());
    return -1;
  }
  auto syms = symbols::Symbols::ForProcess(proc->pid());
  if (!syms.ok()) {
    error = std::string(syms.status().message());
    return -1;
  }
  auto tick = (*syms)->FindFunction("tick");
  if (!tick.has_value()) {
    error = "no function tick in uprobe_loop";
    return -1;
  }
  uint64_t hits = 0;
  auto engine = std::make_unique<probe::Int3Engine>(*proc);
  (void)engine->StopWorld();
  absl::StatusOr<probe::ProbeId> id = probe::ProbeId{0};
  auto count = [&hits](const probe::ProbeContext&) { ++hits; };
  switch (v) {
    case Variant::kNone:
      break;
    case Variant::kEmulated:
      id = engine->Register(tick->start, {.pre = count},
                            {.execution = probe::ProbeExecution::kEmulate});
      break;
    case Variant::kOutOfLine:
      id = engine->Register(tick->start, {.pre = count},
                            {.execution = probe::ProbeExecution::kOutOfLine});
      break;
    case Variant::kPost:
      id = engine->Register(tick->start, {.pre = count, .post = [](const probe::ProbeContext&) {}},
                            {.execution = probe::ProbeExecution::kOutOfLine});
      break;
    case Variant::kReturn:
      id = engine->RegisterReturn(tick->start, {.pre = count});
      break;
  }
  if (!id.ok()) {
    error = std::string(id.status().message());
    return -1;
  }
  const auto start = std::chrono::steady_clock::now();
  (void)engine->ResumeWorld();
  while (proc->alive()) {
    auto events = proc->Poll(/*block=*/true);
    if (!events.ok()) {
      error = std::string(events.status().message());
      return -1;
    }
    for (const ptrace::ProcessEvent& e : *events) {
      if (e.kind == ptrace::ProcessEvent::Kind::kThreadExited) {
        engine->OnThreadExit(e.tid);
      }
    }
  }
  const auto end = std::chrono::steady_clock::now();
  engine.reset();
  if (v != Variant::kNone && hits != static_cast<uint64_t>(kCalls)) {
    error = absl::StrCat("counted ", hits, " hits, expected ", kCalls);
    return -1;
  }
  return static_cast<double>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(end - start).count());
}

double Unprobed() {
  static double ns = [] {
    std::string error;
    std::vector<double> runs;
    for (int i = 0; i < 3; ++i) {
      runs.push_back(RunOnce(Variant::kNone, error));
    }
    std::sort(runs.begin(), runs.end());
    return runs[1];
  }();
  return ns;
}

void BM_Int3Hit(benchmark::State& state, Variant v) {
  double total = 0;
  for (auto _ : state) {
    std::string error;
    const double ns = RunOnce(v, error);
    if (ns < 0) {
      state.SkipWithError(error.c_str());
      return;
    }
    state.SetIterationTime(ns / 1e9);
    total += ns;
  }
  const double per_run = total / static_cast<double>(state.iterations());
  state.counters["calls"] = kCalls;
  state.counters["ns_per_hit"] =
      v == Variant::kNone ? per_run / kCalls : (per_run - Unprobed()) / kCalls;
}

// The child of BM_PtraceFloor: stops for its tracer, then traps `calls` times.
[[noreturn]] void TrapLoop(int calls) {
  ::ptrace(PTRACE_TRACEME, 0, nullptr, nullptr);
  ::raise(SIGSTOP);
  for (int i = 0; i < calls; ++i) {
    __asm__ volatile("int3");
  }
  ::_exit(0);
}

// One traced run of TrapLoop; returns ns per trap, or -1 with `error` set.
double FloorRun(bool pin, bool regs, std::string& error) {
  cpu_set_t old_set;
  CPU_ZERO(&old_set);
  ::sched_getaffinity(0, sizeof old_set, &old_set);
  if (pin) {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(::sched_getcpu(), &one);
    ::sched_setaffinity(0, sizeof one, &one);  // the child inherits it
  }
  const pid_t child = ::fork();
  if (child == 0) {
    TrapLoop(kCalls);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  ::ptrace(PTRACE_SETOPTIONS, child, nullptr, PTRACE_O_EXITKILL);
  const auto start = std::chrono::steady_clock::now();
  ::ptrace(PTRACE_CONT, child, nullptr, nullptr);
  int traps = 0;
  for (;;) {
    if (::waitpid(child, &status, __WALL) != child || WIFEXITED(status) || WIFSIGNALED(status)) {
      break;
    }
    if (regs) {
      user_regs_struct r{};
      ::ptrace(PTRACE_GETREGS, child, nullptr, &r);
      ::ptrace(PTRACE_SETREGS, child, nullptr, &r);
    }
    ++traps;
    ::ptrace(PTRACE_CONT, child, nullptr, nullptr);
  }
  const auto end = std::chrono::steady_clock::now();
  ::sched_setaffinity(0, sizeof old_set, &old_set);
  if (traps != kCalls) {
    error = absl::StrCat("saw ", traps, " traps, expected ", kCalls);
    return -1;
  }
  return static_cast<double>(
             std::chrono::duration_cast<std::chrono::nanoseconds>(end - start).count()) /
         kCalls;
}

void BM_PtraceFloor(benchmark::State& state, bool regs) {
  const bool pin = state.range(0) != 0;
  double total = 0;
  for (auto _ : state) {
    std::string error;
    const double ns = FloorRun(pin, regs, error);
    if (ns < 0) {
      state.SkipWithError(error.c_str());
      return;
    }
    state.SetIterationTime(ns * kCalls / 1e9);
    total += ns;
  }
  state.counters["ns_per_hit"] = total / static_cast<double>(state.iterations());
}

BENCHMARK_CAPTURE(BM_PtraceFloor, wait_cont, false)
    ->ArgName("pinned")
    ->Arg(0)
    ->Arg(1)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->Iterations(5);
BENCHMARK_CAPTURE(BM_PtraceFloor, wait_regs_cont, true)
    ->ArgName("pinned")
    ->Arg(0)
    ->Arg(1)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->Iterations(5);

BENCHMARK_CAPTURE(BM_Int3Hit, unprobed, Variant::kNone)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->Iterations(5);
BENCHMARK_CAPTURE(BM_Int3Hit, entry_emulated, Variant::kEmulated)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->Iterations(5);
BENCHMARK_CAPTURE(BM_Int3Hit, entry_out_of_line, Variant::kOutOfLine)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->Iterations(5);
BENCHMARK_CAPTURE(BM_Int3Hit, entry_with_post_handler, Variant::kPost)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->Iterations(5);
BENCHMARK_CAPTURE(BM_Int3Hit, return_probe, Variant::kReturn)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->Iterations(5);

}  // namespace
}  // namespace kwatch::core

BENCHMARK_MAIN();
