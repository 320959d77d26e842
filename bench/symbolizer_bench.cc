// Symbolization lookups, as the event path does them (core/symbolizer.h, core/symbols.h), on
// the kwatch binary itself (a large C++ program with full DWARF):
//  - BM_LocateCached: Symbolizer::Locate of an address seen before (every event after the
//    first from a site);
//  - BM_LocateFirst: a fresh Symbolizer per batch of distinct addresses, i.e. the first
//    lookup of each site: libdw function symbol + line table;
//  - BM_FunctionAt / BM_LineAt: the two libdw lookups alone;
//  - BM_SiteForTrap: first decode of the instruction before a trap address (Zydis, from the
//    function's start), as the perf backend does per new site.

#include <unistd.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "core/symbols/symbolizer.h"
#include "core/symbols/symbols.h"

namespace kwatch::core {
namespace {

std::string SelfPath() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

struct Fixture {
  std::unique_ptr<symbols::Symbols> symbols;
  std::vector<RemoteAddr> ips;  // addresses inside functions, spread over the text
};

const Fixture& TheFixture() {
  static const Fixture* f = [] {
    auto* fx = new Fixture;
    auto s = symbols::Symbols::ForFile(SelfPath());
    if (!s.ok()) {
      return fx;
    }
    fx->symbols = std::move(*s);
    // Addresses inside functions of this binary (link-time addresses), 61 bytes apart over
    // 256 KiB of text around main: about 4000 distinct sites in hundreds of functions.
    auto main_fn = fx->symbols->FindFunction("main");
    if (!main_fn.has_value()) {
      return fx;
    }
    const uint64_t from =
        main_fn->start.value > (128 << 10) ? main_fn->start.value - (128 << 10) : 0;
    for (uint64_t a = from; a < main_fn->start.value + (128 << 10); a += 61) {
      if (fx->symbols->FunctionAt(RemoteAddr{a}).has_value()) {
        fx->ips.push_back(RemoteAddr{a});
      }
    }
    return fx;
  }();
  return *f;
}

bool Ready(benchmark::State& state) {
  if (TheFixture().symbols == nullptr || TheFixture().ips.empty()) {
    state.SkipWithError("cannot read this binary's symbols");
    return false;
  }
  return true;
}

void BM_LocateCached(benchmark::State& state) {
  if (!Ready(state)) {
    return;
  }
  const Fixture& f = TheFixture();
  symbols::Symbolizer sym(*f.symbols);
  for (RemoteAddr ip : f.ips) {
    sym.Locate(ip);
  }
  size_t i = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(sym.Locate(f.ips[i]).line);
    i = i + 1 == f.ips.size() ? 0 : i + 1;
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_LocateCached);

void BM_LocateFirst(benchmark::State& state) {
  if (!Ready(state)) {
    return;
  }
  const Fixture& f = TheFixture();
  for (auto _ : state) {
    symbols::Symbolizer sym(*f.symbols);
    for (RemoteAddr ip : f.ips) {
      benchmark::DoNotOptimize(sym.Locate(ip).line);
    }
  }
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(f.ips.size()));
  state.counters["addresses"] = static_cast<double>(f.ips.size());
}
BENCHMARK(BM_LocateFirst)->Unit(benchmark::kMicrosecond);

void BM_FunctionAt(benchmark::State& state) {
  if (!Ready(state)) {
    return;
  }
  const Fixture& f = TheFixture();
  size_t i = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(f.symbols->FunctionAt(f.ips[i]));
    i = i + 1 == f.ips.size() ? 0 : i + 1;
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_FunctionAt);

void BM_LineAt(benchmark::State& state) {
  if (!Ready(state)) {
    return;
  }
  const Fixture& f = TheFixture();
  size_t i = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(f.symbols->LineAt(f.ips[i]));
    i = i + 1 == f.ips.size() ? 0 : i + 1;
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_LineAt);

void BM_SiteForTrap(benchmark::State& state) {
  if (!Ready(state)) {
    return;
  }
  const Fixture& f = TheFixture();
  for (auto _ : state) {
    symbols::Symbolizer sym(*f.symbols);
    for (size_t i = 1; i < f.ips.size(); i += 8) {
      benchmark::DoNotOptimize(sym.SiteForTrap(f.ips[i]));
    }
  }
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(f.ips.size() / 8));
}
BENCHMARK(BM_SiteForTrap)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace kwatch::core

BENCHMARK_MAIN();
