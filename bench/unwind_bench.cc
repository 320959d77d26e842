// Cost of one backtrace in stop mode (core/unwind.h), on tests/targets/unwind_levels stopped
// at the entry of its pause() call (8 frames: pause, level3, level2, level1, main, two in
// glibc's start code, _start):
//  - BM_Unwind: Unwinder::Unwind of that thread (libdw CFI walk; the stack page is read once
//    per unwind through /proc/PID/mem);
//  - BM_UnwindSymbolized: the same plus Symbolizer::Locate of each frame (cached), as
//    `--stack` prints it.

#include <sys/syscall.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "core/ptrace/process.h"
#include "core/symbols/symbolizer.h"
#include "core/symbols/symbols.h"
#include "core/symbols/unwind.h"

namespace kwatch::core {
namespace {

// Remembers the thread that entered pause() and its registers at that syscall-entry stop.
class PauseCatcher : public ptrace::SignalInterceptor {
 public:
  explicit PauseCatcher(const ptrace::Process* proc) : proc_(proc) {}
  bool Claims(pid_t /*tid*/, const siginfo_t& /*si*/) override { return false; }
  absl::Status Handle(pid_t /*tid*/, const siginfo_t& /*si*/) override { return absl::OkStatus(); }
  absl::Status OnSyscallStop(pid_t tid, const ptrace::SyscallStop& stop, bool /*world*/) override {
    if (stop.entry && stop.nr == SYS_pause && paused == 0) {
      auto r = proc_->GetRegs(tid);
      if (!r.ok()) {
        return r.status();
      }
      regs = *r;
      paused = tid;
    }
    return absl::OkStatus();
  }
  pid_t paused = 0;
  user_regs_struct regs{};

 private:
  const ptrace::Process* proc_;
};

struct Fixture {
  std::string error;
  std::unique_ptr<ptrace::Process> proc;
  std::unique_ptr<symbols::Symbols> symbols;
  std::unique_ptr<symbols::Unwinder> unwinder;
  std::unique_ptr<PauseCatcher> catcher;
  pid_t tid = 0;
  user_regs_struct regs{};
};

// The target then sleeps in pause() for the whole run (its stack does not change; it is
// killed at exit through PTRACE_O_EXITKILL): each unwind starts from the registers of the
// syscall-entry stop and reads the stack through /proc/PID/mem.
Fixture& TheFixture() {
  static Fixture* f = [] {
    auto* fx = new Fixture;
    auto p = ptrace::Process::Launch({std::string(KWATCH_TARGETS_DIR) + "/unwind_levels", "pause"});
    if (!p.ok()) {
      fx->error = std::string(p.status().message());
      return fx;
    }
    fx->proc = *std::move(p);
    ptrace::Process* proc = fx->proc.get();
    absl::Status s = proc->RunToEntry();
    auto symbols = symbols::Symbols::ForProcess(proc->pid());
    auto unwinder = symbols::Unwinder::ForProcess(
        proc->pid(),
        [proc](RemoteAddr a, std::span<uint8_t> out) { return proc->ReadMemory(a, out); });
    if (!s.ok() || !symbols.ok() || !unwinder.ok()) {
      fx->error = "cannot start unwind_levels, or read its modules";
      return fx;
    }
    fx->symbols = *std::move(symbols);
    fx->unwinder = *std::move(unwinder);
    fx->catcher = std::make_unique<PauseCatcher>(proc);
    proc->SetInterceptor(fx->catcher.get());
    proc->SetSyscallStops(true);
    if (!proc->ResumeAll().ok()) {
      fx->error = "cannot resume unwind_levels";
      return fx;
    }
    while (fx->catcher->paused == 0 && proc->alive()) {
      if (!proc->Poll(/*block=*/true).ok()) {
        break;
      }
    }
    if (fx->catcher->paused == 0) {
      fx->error = "unwind_levels never reached pause()";
      return fx;
    }
    fx->tid = fx->catcher->paused;
    fx->regs = fx->catcher->regs;
    return fx;
  }();
  return *f;
}

bool Ready(benchmark::State& state) {
  if (!TheFixture().error.empty()) {
    state.SkipWithError(TheFixture().error.c_str());
    return false;
  }
  return true;
}

void BM_Unwind(benchmark::State& state) {
  if (!Ready(state)) {
    return;
  }
  Fixture& f = TheFixture();
  size_t frames = 0;
  for (auto _ : state) {
    auto r = f.unwinder->Unwind(f.tid, f.regs);
    if (!r.ok()) {
      state.SkipWithError(std::string(r.status().message()).c_str());
      return;
    }
    frames = r->size();
    benchmark::DoNotOptimize(r->data());
  }
  state.counters["frames"] = static_cast<double>(frames);
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
}
BENCHMARK(BM_Unwind);

void BM_UnwindSymbolized(benchmark::State& state) {
  if (!Ready(state)) {
    return;
  }
  Fixture& f = TheFixture();
  symbols::Symbolizer symbolizer(*f.symbols);
  for (auto _ : state) {
    auto r = f.unwinder->Unwind(f.tid, f.regs);
    if (!r.ok()) {
      state.SkipWithError(std::string(r.status().message()).c_str());
      return;
    }
    for (size_t i = 0; i < r->size(); ++i) {
      benchmark::DoNotOptimize(&symbolizer.Locate(i == 0 ? (*r)[i] : (*r)[i] - 1));
    }
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
}
BENCHMARK(BM_UnwindSymbolized);

}  // namespace
}  // namespace kwatch::core

BENCHMARK_MAIN();
