// Cost of one uprobe hit on the tests/targets/uprobe_loop fixture (tick() called N times):
// the target's run time with the probe, minus an unprobed run, divided by the hits.
//   Unprobed            the fixture alone (reported as its own time per call)
//   RawCounting         a raw uprobe PMU event in counting mode (what `perf stat -e` costs)
//   KwatchSampling      kwatch's uprobe backend: each hit samples the user registers and
//                       512 bytes of stack into a ring that a thread drains meanwhile
//   KwatchReturn        the same on the return probe
#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>
#include <poll.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <benchmark/benchmark.h>

#include "absl/strings/str_cat.h"
#include "core/base/unique_fd.h"
#include "core/symbols/symbols.h"
#include "watch/uprobe_event.h"

namespace {

#ifndef KWATCH_TARGETS_DIR
#define KWATCH_TARGETS_DIR "build/default/tests/targets"
#endif

const std::string kTarget = std::string(KWATCH_TARGETS_DIR) + "/uprobe_loop";

uint64_t TickFileOffset() {
  auto syms = kwatch::core::symbols::Symbols::ForFile(kTarget);
  if (!syms.ok()) {
    return 0;
  }
  auto fn = (*syms)->FindFunction("tick");
  if (!fn) {
    return 0;
  }
  elf_version(EV_CURRENT);
  kwatch::core::UniqueFd fd(::open(kTarget.c_str(), O_RDONLY | O_CLOEXEC));
  Elf* elf = elf_begin(fd.get(), ELF_C_READ, nullptr);
  size_t n = 0;
  elf_getphdrnum(elf, &n);
  uint64_t off = 0;
  for (size_t i = 0; i < n; ++i) {
    GElf_Phdr ph;
    if (gelf_getphdr(elf, static_cast<int>(i), &ph) != nullptr && ph.p_type == PT_LOAD &&
        fn->start.value >= ph.p_vaddr && fn->start.value < ph.p_vaddr + ph.p_filesz) {
      off = fn->start.value - ph.p_vaddr + ph.p_offset;
    }
  }
  elf_end(elf);
  return off;
}

// Seconds the fixture takes to run `calls` calls of tick().
double RunFixture(int64_t calls) {
  const auto start = std::chrono::steady_clock::now();
  const std::string cmd = absl::StrCat(kTarget, " ", calls, " >/dev/null");
  if (std::system(cmd.c_str()) != 0) {  // NOLINT(concurrency-mt-unsafe): single-threaded here
    return -1;
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

enum class Mode { kNone, kCounting, kSampling, kReturn };

void Uprobe(benchmark::State& state, Mode mode) {
  const int64_t calls = state.range(0);
  const uint64_t offset = TickFileOffset();
  if (offset == 0) {
    state.SkipWithError("cannot find tick() in the fixture");
    return;
  }
  double base_total = 0;
  double probed_total = 0;
  uint64_t hits = 0;
  for (auto _ : state) {
    state.PauseTiming();
    const double base = RunFixture(calls);
    state.ResumeTiming();
    std::unique_ptr<kwatch::watch::UprobeEvent> ev;
    if (mode != Mode::kNone) {
      kwatch::watch::UprobeRequest req;
      req.path = kTarget;
      req.file_offset = offset;
      req.is_return = mode == Mode::kReturn;
      req.ring_pages = mode == Mode::kCounting ? 0 : 256;
      auto opened = kwatch::watch::UprobeEvent::Open(req);
      if (!opened.ok()) {
        state.SkipWithError(std::string(opened.status().message()).c_str());
        return;
      }
      ev = std::move(*opened);
    }
    std::atomic<bool> done{false};
    std::thread drainer;
    uint64_t sampled = 0;
    if (ev != nullptr && mode != Mode::kCounting) {
      drainer = std::thread([&] {
        std::vector<pollfd> pfds;
        for (const int fd : ev->fds()) {
          pfds.push_back({fd, POLLIN, 0});
        }
        while (!done.load()) {
          ::poll(pfds.data(), pfds.size(), 10);
          sampled += ev->Drain([](const kwatch::watch::UprobeHit&) {});
        }
        sampled += ev->Drain([](const kwatch::watch::UprobeHit&) {});
      });
    }
    const double probed = RunFixture(calls);
    done = true;
    if (drainer.joinable()) {
      drainer.join();
    }
    if (base < 0 || probed < 0) {
      state.SkipWithError("the fixture failed");
      return;
    }
    base_total += base;
    probed_total += probed;
    hits += mode == Mode::kCounting ? static_cast<uint64_t>(calls) : sampled;
    if (ev != nullptr && ev->lost() > 0) {
      state.counters["lost"] = static_cast<double>(ev->lost());
    }
  }
  const double per_call_us =
      (probed_total - base_total) / static_cast<double>(state.iterations() * calls) * 1e6;
  state.counters["us_per_hit"] =
      mode == Mode::kNone ? base_total / static_cast<double>(state.iterations() * calls) * 1e6
                          : per_call_us;
  state.counters["hits"] = static_cast<double>(hits);
}

BENCHMARK_CAPTURE(Uprobe, Unprobed, Mode::kNone)->Arg(20000)->Iterations(3)->UseRealTime();
BENCHMARK_CAPTURE(Uprobe, RawCounting, Mode::kCounting)->Arg(20000)->Iterations(3)->UseRealTime();
BENCHMARK_CAPTURE(Uprobe, KwatchSampling, Mode::kSampling)
    ->Arg(20000)
    ->Iterations(3)
    ->UseRealTime();
BENCHMARK_CAPTURE(Uprobe, KwatchReturn, Mode::kReturn)->Arg(20000)->Iterations(3)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
