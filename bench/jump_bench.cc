// Cost of one jump-probe hit through a trampoline built by core/probe/trampoline.h, in this
// process, without the agent: a small function is copied into an RWX mapping, jump-patched to
// its trampoline, and called in a loop. The trampoline calls an entry of this bench instead of
// kwatch_agent_jump_hit.
//  - BM_Unprobed: the function alone (the baseline);
//  - BM_JumpProbe/empty: a hit whose entry returns at once (the trampoline's own cost: saving
//    and restoring KwRegs, pushfq/popfq, the call, the displaced instructions);
//  - BM_JumpProbe/two_regs: the entry reads two registers of KwRegs (rdi and rsi, the
//    function's two arguments) and stores their sum, as a two-argument fetch would.
// Per hit = BM_JumpProbe - BM_Unprobed. The target, with the agent's work (fetch
// program and ring record) on top, is 50 ns.

#include <sys/mman.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "absl/strings/str_cat.h"
#include "agent/abi.h"
#include "core/probe/jump_optimizer.h"
#include "core/probe/trampoline.h"

namespace kwatch::core {
namespace {

uint64_t g_sink = 0;
uint64_t g_hits = 0;

void EmptyEntry(uint32_t /*index*/, agent::KwRegs* /*regs*/) {}

void TwoRegisterEntry(uint32_t /*index*/, agent::KwRegs* regs) {
  g_sink += regs->rdi + regs->rsi;
  ++g_hits;
}

// push %rbp; mov %rsp,%rbp; lea (%rdi,%rsi),%rax; pop %rbp; ret
constexpr std::array<uint8_t, 10> kFunction = {0x55, 0x48, 0x89, 0xe5, 0x48,
                                               0x8d, 0x04, 0x37, 0x5d, 0xc3};
using Fn = int64_t (*)(int64_t, int64_t);

// An RWX mapping holding the function at +0 and its trampoline at +0x800.
class Area {
 public:
  Area() {
    void* p =
        mmap(nullptr, 4096, PROT_READ | PROT_WRITE | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    base_ = p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p);
    if (base_ != nullptr) {
      std::memcpy(base_, kFunction.data(), kFunction.size());
    }
  }
  ~Area() {
    if (base_ != nullptr) {
      munmap(base_, 4096);
    }
  }
  Area(const Area&) = delete;
  Area& operator=(const Area&) = delete;
  Area(Area&&) = delete;
  Area& operator=(Area&&) = delete;

  // Patches the function to a trampoline calling `entry`; "" or what failed.
  std::string Probe(void (*entry)(uint32_t, agent::KwRegs*)) {
    if (base_ == nullptr) {
      return "mmap RWX failed";
    }
    const RemoteAddr fn{reinterpret_cast<uint64_t>(base_)};
    const probe::JumpDecision d = probe::PlanJumpProbe(probe::FunctionCode{"f", fn, kFunction}, fn);
    if (!d.plan) {
      return d.reason;
    }
    auto t = probe::BuildTrampoline(*d.plan, fn + 0x800, 0,
                                    RemoteAddr{reinterpret_cast<uint64_t>(entry)});
    auto patch = probe::BuildJumpPatch(*d.plan, fn + 0x800);
    if (!t.ok() || !patch.ok()) {
      return absl::StrCat(t.ok() ? patch.status().message() : t.status().message());
    }
    std::memcpy(base_ + 0x800, t->code.data(), t->code.size());
    for (const probe::PatchStep& s : probe::ArmSteps(*patch)) {
      std::memcpy(reinterpret_cast<void*>(s.addr.value),  // NOLINT(performance-no-int-to-ptr)
                  s.bytes.data(), s.bytes.size());
    }
    return "";
  }
  Fn Function() const { return reinterpret_cast<Fn>(base_); }

 private:
  uint8_t* base_ = nullptr;
};

void BM_Unprobed(benchmark::State& state) {  // NOLINT(readability-identifier-naming)
  Area area;
  const Fn fn = area.Function();
  int64_t i = 0;
  for (auto _ : state) {  // NOLINT(clang-analyzer-deadcode.DeadStores)
    benchmark::DoNotOptimize(fn(i, 3));
    ++i;
  }
}
BENCHMARK(BM_Unprobed);

void BM_JumpProbe(benchmark::State& state) {  // NOLINT(readability-identifier-naming)
  Area area;
  const bool two = state.range(0) == 1;
  const std::string error = area.Probe(two ? TwoRegisterEntry : EmptyEntry);
  if (!error.empty()) {
    state.SkipWithError(error.c_str());
    return;
  }
  state.SetLabel(two ? "two_regs" : "empty");
  const Fn fn = area.Function();
  g_hits = 0;
  int64_t i = 0;
  int64_t wrong = 0;
  for (auto _ : state) {  // NOLINT(clang-analyzer-deadcode.DeadStores)
    const int64_t r = fn(i, 3);
    wrong += r != i + 3 ? 1 : 0;
    ++i;
  }
  if (wrong != 0 || (two && g_hits != static_cast<uint64_t>(i))) {
    state.SkipWithError("the probed function returned a wrong value or a hit was missed");
  }
  benchmark::DoNotOptimize(g_sink);
}
BENCHMARK(BM_JumpProbe)->Arg(0)->Arg(1);

}  // namespace
}  // namespace kwatch::core

BENCHMARK_MAIN();
