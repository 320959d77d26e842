// Cost of an `--if` condition per event (watch/condition.h), over 1024 events with varied
// values, threads and old values (some missing), as stop mode evaluates them:
//  - BM_ConditionSimple: 'new > 0x800000' (values are 24-bit: about half match);
//  - BM_ConditionTypical: 'new & 0x8000 && tid == 1234 || new != old';
//  - BM_ConditionArithmetic: '(new - old) * 3 / (old | 1) >= -5 && (addr & 7) == 0' (signed);
//  - BM_ConditionParse: Condition::Parse of the typical text.

#include <cstdint>
#include <vector>

#include <benchmark/benchmark.h>

#include "core/event.h"
#include "watch/condition.h"

namespace kwatch::watch {
namespace {

const std::vector<core::AccessEvent>& Events() {
  static const auto* events = [] {
    auto* v = new std::vector<core::AccessEvent>;
    uint64_t x = 0x9e3779b97f4a7c15;
    for (int i = 0; i < 1024; ++i) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      core::AccessEvent e;
      e.pid = 1000;
      e.tid = (x & 1) != 0 ? 1234 : 1235;
      e.cpu = static_cast<uint32_t>(x >> 60) & 1;
      e.access_addr = core::RemoteAddr{0x601040 + (x & 0xf)};
      e.access_size = 8;
      e.len = 8;
      e.value = x >> 40;
      if (i % 16 != 0) {
        e.old_value = (x >> 40) + (x & 3);
      }
      v->push_back(e);
    }
    return v;
  }();
  return *events;
}

ConditionOptions SignedOptions(bool is_signed) {
  ConditionOptions o;
  o.signed_values = is_signed;
  return o;
}

void Run(benchmark::State& state, const char* text, bool is_signed) {
  auto c = Condition::Parse(text, SignedOptions(is_signed));
  if (!c.ok()) {
    state.SkipWithError("parse error");
    return;
  }
  const std::vector<core::AccessEvent>& events = Events();
  size_t i = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(c->Matches(events[i]));
    i = (i + 1) & 1023;
  }
  state.counters["matched%"] =
      100.0 * static_cast<double>(c->stats().matched) / static_cast<double>(c->stats().evaluated);
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
}

void BM_ConditionSimple(benchmark::State& state) {
  Run(state, "new > 0x800000", false);
}
BENCHMARK(BM_ConditionSimple);

void BM_ConditionTypical(benchmark::State& state) {
  Run(state, "new & 0x8000 && tid == 1234 || new != old", false);
}
BENCHMARK(BM_ConditionTypical);

void BM_ConditionArithmetic(benchmark::State& state) {
  Run(state, "(new - old) * 3 / (old | 1) >= -5 && (addr & 7) == 0", true);
}
BENCHMARK(BM_ConditionArithmetic);

void BM_ConditionParse(benchmark::State& state) {
  for (auto _ : state) {
    auto c = Condition::Parse("new & 0x8000 && tid == 1234 || new != old");
    benchmark::DoNotOptimize(c.ok());
  }
}
BENCHMARK(BM_ConditionParse);

}  // namespace
}  // namespace kwatch::watch

BENCHMARK_MAIN();
