#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/base/unique_fd.h"
#include "core/kernel/bpf_access_values.h"
#include "core/ptrace/process.h"
#include "watch/event_loop.h"
#include "watch/kernel/cpu_hotplug.h"
#include "watch/kernel/drain_values.h"
#include "watch/kernel/kernel_event.h"
#include "watch/perf_breakpoint.h"

namespace kwatch::watch::kernel {

// One debug register in use by a kernel session: its perf breakpoint and the watches its
// events go to (several when one register serves watches of equal ranges).
struct ArmedBreakpoint {
  PerfBreakpoint* bp = nullptr;
  std::span<const size_t> watches;
};

// What a breakpoint had seen when it was closed.
struct ClosedBreakpoint {
  uint64_t count = 0;  // what the kernel counted (0 when it could not be read)
  uint64_t lost = 0;   // what its ring lost
  std::vector<size_t> watches;
};

// The debug registers of a kernel session: who holds which register is decided elsewhere (drmgr,
// applied by the command's slot manager); this interface arms, lists and closes them. The
// session owns its KernelRegisters and calls it from its thread only.
class KernelRegisters {
 public:
  virtual ~KernelRegisters() = default;

  // The breakpoints armed now (valid until the next call that changes them).
  virtual std::vector<ArmedBreakpoint> Armed() = 0;
  // Arms watch `w`'s `len` bytes at `addr` on `cpu` (kernel watches). On error, the registers
  // of other requests are as before; ResourceExhausted when none is free.
  virtual absl::Status Request(size_t w, uint64_t addr, uint64_t len, int cpu) = 0;
  // Releases and closes every breakpoint on `cpu` (drain their rings first).
  virtual std::vector<ClosedBreakpoint> ReleaseCpu(int cpu) = 0;
  // Closes every breakpoint.
  virtual void CloseAll() = 0;
  // The registers held changed (also called once when the session starts).
  virtual void Changed() = 0;

 protected:
  // Copied and moved only as part of an implementation (no slicing through the interface).
  KernelRegisters() = default;
  KernelRegisters(const KernelRegisters&) = default;
  KernelRegisters& operator=(const KernelRegisters&) = default;
  KernelRegisters(KernelRegisters&&) = default;
  KernelRegisters& operator=(KernelRegisters&&) = default;
};

struct KernelSessionOptions {
  uint64_t count = 0;         // stop after this many delivered events (0: no limit)
  double duration = 0;        // stop after this many seconds (0: no limit)
  bool callchains = false;    // the breakpoints' samples carry callchains
  bool kill_on_exit = false;  // Finish kills a launched target (else detaches from it)
  // Read each watch's bytes at the access: a BPF program on every breakpoint
  // (core/kernel/bpf_access_values.h); drain-time values, when there are any, stay the
  // fallback.
  bool access_values = false;
};

// How a session ended (Finish).
struct KernelSessionEnd {
  std::string stop_reason;
  uint64_t lost = 0;
  std::optional<int> exit_status;  // a launched target's shell status, when it ended
};

// A session of breakpoints whose samples carry kernel IPs: kernel watches (CPU-wide
// breakpoints, one per watch and CPU, `target` null) or the kernel's accesses to a process's
// memory (`target`: the process, per-thread breakpoints that exclude user code). Drains the
// breakpoints' rings into the sink (events in time order, each watch's value at drain time when
// `values` reads kernel memory), stops on the event count, the duration, SIGINT/SIGTERM/SIGHUP
// or the target's end (or exec), and follows CPU hotplug for kernel watches: the kernel drops
// a CPU-bound event when its CPU goes offline (it counts nothing after the CPU comes back; seen
// on 6.18), so the breakpoints of a CPU that goes offline are closed and new ones opened when a
// CPU comes online; a CPU that cannot be armed within about a second is said once and left.
//
// Owns the registers, the drain-time values and an EventLoop (with the signalfd); the sink and
// the target are the caller's and outlive the session. Blocks SIGINT, SIGTERM, SIGHUP and
// SIGCHLD in the calling thread (BlockSessionSignals). Not thread-safe: one thread calls Step
// and Finish.
class KernelWatchSession {
 public:
  // `watches[i]` is watch i of `registers`; kernel watches list the CPUs they hold.
  static absl::StatusOr<std::unique_ptr<KernelWatchSession>> Create(
      const KernelSessionOptions& opts, std::vector<KernelWatch> watches,
      std::unique_ptr<KernelRegisters> registers, std::unique_ptr<DrainValues> values,
      core::ptrace::Process* target, KernelEventSink& sink);

  KernelWatchSession(const KernelWatchSession&) = delete;
  KernelWatchSession& operator=(const KernelWatchSession&) = delete;
  ~KernelWatchSession() = default;

  // One iteration: waits up to `timeout` (and at most one 50 ms tick) for events, signals and
  // hotplug, then drains every ring, re-arms CPUs that came online and checks the target and
  // the limits. Returns false once the session should end (then call Finish); an error for a
  // failed system call (the session cannot go on; Finish is not needed).
  absl::StatusOr<bool> Step(absl::Duration timeout = absl::Seconds(1));

  // Drains what is left, disables the breakpoints, sends the summary to the sink, closes the
  // breakpoints and lets a target go (killed if launched and kill_on_exit, else detached).
  absl::StatusOr<KernelSessionEnd> Finish();

  // CLOCK_MONOTONIC at the session's start, in ns (events carry the same clock).
  uint64_t start_ns() const { return start_ns_; }
  const std::vector<KernelWatch>& watches() const { return watches_; }
  bool values_shown() const {
    return access_ != nullptr || (values_ != nullptr && values_->Enabled());
  }

 private:
  KernelWatchSession(const KernelSessionOptions& opts, std::vector<KernelWatch> watches,
                     std::unique_ptr<KernelRegisters> registers,
                     std::unique_ptr<DrainValues> values, core::ptrace::Process* target,
                     KernelEventSink& sink);

  absl::Status Init();
  absl::Status Watch(int fd);
  // Ends the session with `reason` unless it already ends.
  void Stop(absl::string_view reason);
  void Drain();
  // Loads the programs of values at the access (opts_.access_values), then runs them on every
  // armed breakpoint not yet attached; a refusal ends values at the access, said once.
  void StartAccessValues();
  void AttachAccessValues();
  // Kernel watches only: closes the breakpoints of a CPU that went offline.
  void RetireCpu(int cpu);
  // Kernel watches only: matches the breakpoints to the online CPUs.
  absl::Status SyncCpus();
  // The target's end (Cancelled, with the stop reason) or exec.
  absl::Status PollTarget();
  bool FollowsHotplug() const { return target_ == nullptr; }

  KernelSessionOptions opts_;
  std::vector<KernelWatch> watches_;
  std::unique_ptr<KernelRegisters> registers_;
  std::unique_ptr<DrainValues> values_;
  // Values at the access (null when not asked for or refused), each watch's program (the first
  // watch of its range: watches sharing a register share it), the perf fds it runs on.
  std::unique_ptr<core::kernel::BpfAccessValues> access_;
  std::vector<size_t> range_of_;
  absl::flat_hash_set<int> attached_;
  core::ptrace::Process* target_;
  KernelEventSink& sink_;

  std::unique_ptr<EventLoop> loop_;           // with the signalfd
  std::optional<CpuHotplugMonitor> hotplug_;  // kernel watches

  uint64_t start_ns_ = 0;
  uint64_t deadline_ns_ = 0;  // 0: none
  uint64_t delivered_ = 0;
  std::string stop_reason_;
  std::set<int> refused_cpus_;    // CPUs that came online and could not be armed (said once)
  std::map<int, int> cpu_tries_;  // CPU -> failed attempts to arm it
  uint64_t closed_lost_ = 0;      // what the rings of closed breakpoints had lost
};

}  // namespace kwatch::watch::kernel
