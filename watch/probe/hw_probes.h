#pragma once

// Probes as execute breakpoints in the debug registers (`kwatch probe --hw`): drmgr's slots,
// placed by the stop applier as perf events with sigtrap. The code is never patched.

#include <sys/types.h>
#include <sys/user.h>

#include <csignal>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/base/remote_addr.h"
#include "core/event.h"
#include "core/probe/fetch.h"
#include "core/ptrace/process.h"
#include "core/symbols/symbolizer.h"
#include "drmgr/allocator_types.h"
#include "watch/probe/hit_sink.h"
#include "watch/probe/probe_set.h"

namespace kwatch::drmgr {
class SlotAllocator;
}  // namespace kwatch::drmgr
namespace kwatch::watch {
class StopBackend;
struct Watch;
}  // namespace kwatch::watch

namespace kwatch::watch::probe {

// "#3 tick": a probe as --hw's messages name it.
std::string HwProbeName(const ProbeDef& p);

// "#1-#4" / "#2" / "#1, #3"
std::string HwIdList(const std::vector<uint32_t>& ids);

// Why `probes` cannot run with --hw (InvalidArgument for a return probe; ResourceExhausted,
// naming who would get which register, when they need more than the 4 debug registers),
// decided as drmgr would with all 4 free. OK otherwise.
absl::Status CheckHwProbes(const std::vector<ProbeDef>& probes);

// The probes of a --hw session in the debug registers of one traced process: one drmgr
// execute request per probe (process scope, 1 byte; probes at one address share a register)
// made real in the debug registers of every thread, threads created later included, by the
// stop applier (watch::StopBackend: execute breakpoints as perf events with sigtrap, which
// close with kwatch even when it is killed). The code is never written. At each SIGTRAP
// (TRAP_PERF) of a probe's breakpoint, `on_hit` runs while the thread is stopped at the probed
// instruction, before it runs; the thread then resumes with the RF flag the kernel set for an
// execute breakpoint (arch/x86/kernel/hw_breakpoint.c), so the instruction runs once without
// trapping again: registers are never written back.
//
// Registers itself as the process's first signal interceptor at Arm (before the applier);
// `proc`, `symbolizer` and `probes` must outlive it. Used on the thread that owns `proc`.
class HwProbes : public core::ptrace::SignalInterceptor {
 public:
  struct Hit {
    const ProbeDef* probe = nullptr;
    pid_t tid = 0;
    uint64_t time_ns = 0;                    // CLOCK_MONOTONIC at the trap
    core::RemoteAddr ip;                     // the probed instruction (absolute)
    const user_regs_struct* regs = nullptr;  // the thread's, at the probed instruction
  };
  using HitFn = std::function<void(const Hit&)>;

  HwProbes(core::ptrace::Process& proc, core::symbols::Symbolizer& symbolizer,
           const std::vector<ProbeDef>& probes, uint64_t load_bias, HitFn on_hit);
  ~HwProbes() override;
  HwProbes(const HwProbes&) = delete;
  HwProbes& operator=(const HwProbes&) = delete;

  // Stops the target, arms every probe, resumes it. All or nothing. ResourceExhausted when
  // the registers do not suffice, the kernel's ENOSPC (registers held by another tool)
  // included: the message says which probes got which register and which did not fit.
  absl::Status Arm();
  // Removes the breakpoints from every thread (the target keeps running). Safe to call twice.
  void Disarm();
  // After exec: the breakpoints went with the old image (remove_on_exec); their events close.
  void Forget();

  // The debug register (0-3) probe `id` (ProbeDef::id) holds, -1 when none.
  int RegisterOf(uint32_t id) const;
  // Debug registers of the process the kernel said are held outside kwatch.
  int external_slots() const;
  // drmgr's decisions (for `kwatch slots`); nullptr before Arm.
  const drmgr::SlotAllocator* allocator() const { return alloc_.get(); }
  // The applier (its breakpoints, for tests); nullptr before Arm.
  const watch::StopBackend* backend() const { return backend_.get(); }
  // Traps that named no probe's breakpoint, or stopped away from its address (dropped).
  uint64_t stray_traps() const;

  // ---- core::SignalInterceptor ----
  bool Claims(pid_t tid, const siginfo_t& si) override;
  absl::Status Handle(pid_t tid, const siginfo_t& si) override;
  absl::StatusOr<bool> HandleInPlace(pid_t tid, const siginfo_t& si) override;

 private:
  absl::Status Deliver(pid_t tid);

  core::ptrace::Process& proc_;
  core::symbols::Symbolizer& symbolizer_;
  const std::vector<ProbeDef>& probes_;
  uint64_t bias_;
  HitFn on_hit_;
  std::unique_ptr<drmgr::SlotAllocator> alloc_;
  std::unique_ptr<watch::StopBackend> backend_;
  std::map<size_t, drmgr::RequestId> request_of_;  // index in probes_ -> request
  std::vector<watch::Watch> no_watches_;  // the applier's watch list: none, probes own requests
  std::vector<core::AccessEvent> events_;
  uint64_t off_address_ = 0;  // traps of a probe's register away from its address
  bool armed_ = false;
};

// A --hw hit as the INT3 path shows it: the probe's arguments evaluated with core/probe/fetch.h
// against the stopped thread's registers (and its floating-point registers when an argument
// needs them) and memory, read through `read`.
ProbeHit EvaluateHwHit(const HwProbes::Hit& h, pid_t pid, uint64_t load_bias,
                       const core::symbols::MemoryReader& read);

}  // namespace kwatch::watch::probe
