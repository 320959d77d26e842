// Cost of a probe hit handled inside the target by libkwatch-agent.so (docs/agent.md), in
// this process: the benchmark loads the agent into itself and acts as its own kwatch
// (tests/agent/local_controller.h), with the probed code of tests/agent/fixtures.S.
//
//  - Int3Floor: an int3 into an empty SIGTRAP handler and back, no agent (the floor under
//    any in-process INT3 path on this host). Runs first, before the agent is loaded.
//  - Call: the probed function unprobed (a call of kwt_jfunc).
//  - AgentInt3Hit: an INT3 probe with two register arguments (%di, %si), resumed out of
//    line; ratio_to_floor = its time / the floor's, measured in the same run.
//  - AgentJumpHit: a jump probe with two register arguments through a trampoline written
//    as docs/agent.md specifies (kwt_tramp): the whole call, trampoline included.
//  - AgentJumpHitDeref: the same with a third argument read through a pointer (safe read).
//  - AgentJumpFilteredOut: AgentJumpHit's probe with `if a % 1000 == 7` as the agent's filter
//    program, false at every hit: no record is written (issue 18 asks <= 2x AgentJumpHit).
//  - AgentJumpFilteredIn: the same condition true at every hit (`a % 1000 == 1`): the filter's
//    cost on top of AgentJumpHit.
//  - AgentJumpReturn: a call of kwt_jfunc with a return probe through the trampoline (entry and
//    return in the agent, a record at the return): the floor under a per-call watch.
//  - AgentPerCallArmDisarm: the same return probe numbering a per-call watch and a chained
//    lookup probe that arms a global in this thread's perf breakpoint at the entry
//    (PERF_EVENT_IOC_MODIFY_ATTRIBUTES) and disarms it at the return (PERF_EVENT_IOC_DISABLE):
//    what `kwatch --in FUNC` adds per call in the target (issue 19 asks <= 5 us). Counter
//    `added_us`: its time minus AgentJumpReturn's, same run.
// Times are CPU times (Google Benchmark's default, and ratio_to_floor from this thread's CPU
// clock). Records go into the thread's ring; every 256 hits the benchmark consumes them (tail =
// head, as a drain that keeps up), so that none is lost; the counter `lost` says if one was.

#include <linux/hw_breakpoint.h>
#include <linux/perf_event.h>

#include <csignal>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <memory>
#include <vector>

#include <benchmark/benchmark.h>

#include "tests/agent/fixtures.h"
#include "tests/agent/local_controller.h"

namespace kwatch::agent {
namespace {

using testing::LocalController;
using testing::OpBegin;
using testing::OpDeref;
using testing::OpEnd;
using testing::OpReg;
using testing::OpStore;
using testing::ProbeSpec;

double g_floor_ns = 0;

void EmptyTrap(int /*sig*/, siginfo_t* /*info*/, void* /*uc*/) {}

// This thread's CPU time: user and kernel (the trap, the signal delivery, sigreturn), not the
// time it waited for a CPU, so that a loaded machine changes the figures less.
double NowNs() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e9 + static_cast<double>(ts.tv_nsec);
}

void Int3Floor(benchmark::State& state) {
  struct sigaction sa {};
  struct sigaction old {};
  sa.sa_sigaction = EmptyTrap;
  sa.sa_flags = SA_SIGINFO;
  sigaction(SIGTRAP, &sa, &old);
  const double t0 = NowNs();
  for (auto _ : state) {  // NOLINT(clang-analyzer-deadcode.DeadStores)
    kwt_own_int3();
  }
  g_floor_ns = (NowNs() - t0) / static_cast<double>(state.iterations());
  sigaction(SIGTRAP, &old, nullptr);
  state.counters["ns_per_hit"] =
      benchmark::Counter(static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(Int3Floor);

void Call(benchmark::State& state) {
  uint64_t sum = 0;
  for (auto _ : state) {  // NOLINT(clang-analyzer-deadcode.DeadStores)
    sum += kwt_jfunc(sum, 1);
    benchmark::DoNotOptimize(sum);
  }
}
BENCHMARK(Call);

// The agent, its probes and patches, made once for the benchmarks that follow.
struct Setup {
  std::unique_ptr<LocalController> c;
  uint32_t int3 = 0;
  uint32_t jump = 0;
  uint32_t jump_deref = 0;
  uint32_t filtered_out = 0;
  uint32_t filtered_in = 0;
  uint32_t ret_only = 0;
  uint32_t ret_call = 0;
  bool ok = false;
};

alignas(8) volatile uint64_t g_watched = 0;  // AgentPerCallArmDisarm's object (never written)
double g_return_ns = 0;

Setup& Agent() {
  static Setup s = [] {
    Setup s;
    testing::Layout l;
    l.ring_bytes = 1 << 20;
    l.call_watches = 1;
    l.call_sample_type = PERF_SAMPLE_IP | PERF_SAMPLE_TID | PERF_SAMPLE_TIME;
    s.c = LocalController::Create(l);
    if (s.c->LoadAgent(KWATCH_AGENT_PATH) != 0) {
      return s;
    }
    const uint64_t xol = LocalController::MapNear(Addr(&kwt_args), 4096);
    LocalController::WriteXol(xol, Addr(&kwt_args), 1);
    ProbeSpec i3;
    i3.addr = Addr(&kwt_args);
    i3.insn_len = 1;
    i3.xol_addr = xol;
    i3.fetch = {OpBegin(0),    OpReg(kKwRdi), OpStore(8), OpBegin(1),
                OpReg(kKwRsi), OpStore(8),    OpEnd()};
    s.int3 = s.c->AddProbe(i3);
    ProbeSpec j = i3;
    j.addr = Addr(&kwt_jfunc);
    j.flags |= kKwProbeJump;
    j.insn_len = 6;
    j.xol_addr = Addr(kwt_tramp_displaced);
    s.jump = s.c->AddProbe(j);
    ProbeSpec jd = j;
    jd.in_hash = false;  // same address: selected by the trampoline's index
    jd.fetch = {OpBegin(0), OpReg(kKwRdi), OpStore(8), OpBegin(1), OpReg(kKwRsi), OpStore(8),
                OpBegin(2), OpReg(kKwRdx), OpDeref(),  OpStore(8), OpEnd()};
    s.jump_deref = s.c->AddProbe(jd);
    // `a % 1000 == K` over %rdi as a long, as watch/probe/agent_filter.cc compiles it.
    const auto filter = [](int64_t k) {
      return std::vector<KwFetchOp>{
          KwFetchOp{kKwOpReg, kKwRdi, 8, 0},       KwFetchOp{kKwFilterPushAcc, 64, 64, 1},
          KwFetchOp{kKwFilterPushImm, 0, 0, 1000}, KwFetchOp{kKwFilterBinary, kKwFilterModS, 0, 0},
          KwFetchOp{kKwFilterPushImm, 0, 0, k},    KwFetchOp{kKwFilterBinary, kKwFilterEq, 0, 0},
          KwFetchOp{kKwFilterEnd, 0, 0, 0},
      };
    };
    ProbeSpec out = j;
    out.in_hash = false;
    out.filter = filter(7);
    s.filtered_out = s.c->AddProbe(out);
    ProbeSpec in = j;
    in.in_hash = false;
    in.filter = filter(1);
    s.filtered_in = s.c->AddProbe(in);
    ProbeSpec ret = j;
    ret.in_hash = false;
    ret.flags |= kKwProbeReturn;
    ret.fetch = {};
    ret.record_bytes = 0;
    s.ret_only = s.c->AddProbe(ret);
    ret.call_watch = 1;
    s.ret_call = s.c->AddProbe(ret);
    ProbeSpec arm = j;
    arm.in_hash = false;
    arm.flags = kKwProbeUsed | kKwProbeEnabled | kKwProbeJump | kKwProbeCallArm;
    arm.call_watch = 1;
    arm.record_bytes = 16;
    arm.fetch = {OpBegin(0), KwFetchOp{kKwOpImm, 0, 0, static_cast<int64_t>(Addr(&g_watched))},
                 OpStore(8), OpEnd()};
    const uint32_t arm_index = s.c->AddProbe(arm);
    s.c->Chain(s.ret_call, arm_index);
    KwCallWatch& cw = s.c->call_watch(0);
    cw.function = s.ret_call;
    cw.first = 0;
    cw.bp_type = HW_BREAKPOINT_W;
    cw.bp_len = 8;
    s.c->SetState(kKwStateActive);
    s.c->PatchInt3(Addr(&kwt_args), s.int3);
    kwt_jump_entry = s.c->ctl().jump_entry;
    kwt_tramp_index = s.jump;
    s.c->PatchJump(Addr(&kwt_jfunc), 6, Addr(&kwt_tramp), s.jump);
    s.ok = true;
    return s;
  }();
  return s;
}

// Consumes every record (a drain that keeps up).
void Consume(LocalController& c) {
  for (uint32_t i = 0; i < c.ctl().ring_count; ++i) {
    KwRing& r = c.ring(i);
    r.tail.store(r.head.load(std::memory_order_acquire), std::memory_order_release);
  }
}

template <typename F>
void RunHits(benchmark::State& state, uint32_t probe, F hit) {
  Setup& s = Agent();
  if (!s.ok) {
    state.SkipWithError("kwatch_agent_init failed");
    return;
  }
  KwProbe& p = s.c->probe(probe);
  const uint64_t hits0 = p.hits.load();
  const uint64_t lost0 = p.lost.load();
  const uint64_t filtered0 = p.filtered.load();
  uint64_t n = 0;
  const double t0 = NowNs();
  for (auto _ : state) {  // NOLINT(clang-analyzer-deadcode.DeadStores)
    hit();
    if ((++n & 255) == 0) {
      Consume(*s.c);
    }
  }
  const double per_hit = (NowNs() - t0) / static_cast<double>(state.iterations());
  Consume(*s.c);
  if (g_floor_ns > 0) {
    state.counters["ratio_to_floor"] = per_hit / g_floor_ns;
  }
  const uint64_t hits = p.hits.load() - hits0 + p.filtered.load() - filtered0;
  if (hits != static_cast<uint64_t>(state.iterations())) {
    state.SkipWithError("the probe did not count every hit");
  }
  state.counters["lost"] = static_cast<double>(p.lost.load() - lost0);
  state.counters["ns_per_hit"] =
      benchmark::Counter(static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

void AgentInt3Hit(benchmark::State& state) {
  RunHits(state, Agent().int3, [] { benchmark::DoNotOptimize(kwt_args(1, 2, nullptr)); });
}
BENCHMARK(AgentInt3Hit);

void AgentJumpHit(benchmark::State& state) {
  kwt_tramp_index = Agent().jump;
  RunHits(state, Agent().jump, [] { benchmark::DoNotOptimize(kwt_jfunc(1, 2)); });
}
BENCHMARK(AgentJumpHit);

void AgentJumpHitDeref(benchmark::State& state) {
  static const uint64_t value = 42;
  kwt_tramp_index = Agent().jump_deref;
  // kwt_jfunc(a, b) called with a third argument in %rdx, which it ignores and the probe reads.
  auto* with_pointer = reinterpret_cast<uint64_t (*)(uint64_t, uint64_t, const uint64_t*)>(
      reinterpret_cast<void*>(&kwt_jfunc));
  RunHits(state, Agent().jump_deref,
          [with_pointer] { benchmark::DoNotOptimize(with_pointer(1, 2, &value)); });
  kwt_tramp_index = Agent().jump;
}
BENCHMARK(AgentJumpHitDeref);

void JumpThrough(benchmark::State& state, uint32_t probe) {
  kwt_tramp_index = probe;
  RunHits(state, probe, [] { benchmark::DoNotOptimize(kwt_jfunc(1, 2)); });
  kwt_tramp_index = Agent().jump;
}

void AgentJumpFilteredOut(benchmark::State& state) {
  JumpThrough(state, Agent().filtered_out);
  if (Agent().c->probe(Agent().filtered_out).hits.load() != 0) {
    state.SkipWithError("a hit passed a filter that is false at every hit");
  }
}
BENCHMARK(AgentJumpFilteredOut);

void AgentJumpFilteredIn(benchmark::State& state) {
  JumpThrough(state, Agent().filtered_in);
}
BENCHMARK(AgentJumpFilteredIn);

// Calls of kwt_jfunc through the trampoline of probe `index`; ns per call.
double RunCalls(benchmark::State& state, uint32_t index) {
  Setup& s = Agent();
  if (!s.ok) {
    state.SkipWithError("kwatch_agent_init failed");
    return 0;
  }
  kwt_tramp_index = index;
  uint64_t n = 0;
  const double t0 = NowNs();
  for (auto _ : state) {  // NOLINT(clang-analyzer-deadcode.DeadStores)
    benchmark::DoNotOptimize(kwt_jfunc(1, 2));
    if ((++n & 255) == 0) {
      Consume(*s.c);
    }
  }
  const double per_call = (NowNs() - t0) / static_cast<double>(state.iterations());
  Consume(*s.c);
  kwt_tramp_index = s.jump;
  state.counters["ns_per_call"] =
      benchmark::Counter(static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  return per_call;
}

void AgentJumpReturn(benchmark::State& state) {
  g_return_ns = RunCalls(state, Agent().ret_only);
}
BENCHMARK(AgentJumpReturn);

void AgentPerCallArmDisarm(benchmark::State& state) {
  const uint64_t calls0 = Agent().ok ? Agent().c->call_watch(0).calls.load() : 0;
  const double per_call = RunCalls(state, Agent().ret_call);
  if (!Agent().ok) {
    return;
  }
  if (Agent().c->call_watch(0).calls.load() - calls0 != static_cast<uint64_t>(state.iterations())) {
    state.SkipWithError("the agent did not number every call");
  }
  if (g_return_ns > 0) {
    state.counters["added_us"] = (per_call - g_return_ns) / 1000.0;
  }
}
BENCHMARK(AgentPerCallArmDisarm);

}  // namespace
}  // namespace kwatch::agent

BENCHMARK_MAIN();
