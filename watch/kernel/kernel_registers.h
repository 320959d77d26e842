#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/ptrace/process.h"
#include "drmgr/debug_regs.h"
#include "watch/kernel/kernel_event.h"
#include "watch/kernel/kernel_session.h"
#include "watch/kernel/kernel_slots.h"

namespace kwatch::watch::kernel {

// Kernel watches: asks drmgr for a register for every watch on every CPU of `cpus` and opens
// them as CPU-wide breakpoints of `kind` (kernel and user accesses; callchains of up to
// `callchain_frames` frames, 0 for none). Fills each watch's `cpus` in arming order. Errors:
// KernelSlots::Request's, for the first (watch, CPU) that cannot be armed.
absl::StatusOr<std::unique_ptr<KernelSlots>> ArmKernelWatches(drmgr::DrKind kind,
                                                              uint16_t callchain_frames,
                                                              std::span<KernelWatch> watches,
                                                              std::span<const int> cpus);

// --kernel-accesses: asks drmgr for the watches' registers in `proc`'s scope and opens each
// on every thread of `proc` (stopped by the caller, so that no thread is missed), inherited
// by new threads, for the kernel's accesses only (exclude_user). `proc` outlives the slots.
// Errors: KernelSlots::RequestForProcess's, for the first watch that cannot be armed.
absl::StatusOr<std::unique_ptr<KernelSlots>> ArmKernelAccesses(drmgr::DrKind kind,
                                                               uint16_t callchain_frames,
                                                               std::span<const KernelWatch> watches,
                                                               core::ptrace::Process& proc);

// The KernelRegisters of a session, as drmgr hands them out (KernelSlots), published for
// `kwatch slots` whenever they change (drmgr/slot_registry.h: kernel watches as target 0 with
// their registers per CPU, --kernel-accesses with the process's pid). A publication that fails
// is passed to `on_publish_error` (the session goes on); the publication is removed when this
// object is destroyed. Owns the slots; called from the session's thread only.
class PublishedRegisters final : public KernelRegisters {
 public:
  PublishedRegisters(std::unique_ptr<KernelSlots> slots, pid_t target, std::string command_line,
                     std::function<void(const absl::Status&)> on_publish_error);
  PublishedRegisters(const PublishedRegisters&) = delete;
  PublishedRegisters& operator=(const PublishedRegisters&) = delete;
  ~PublishedRegisters() override;

  std::vector<ArmedBreakpoint> Armed() override;
  absl::Status Request(size_t w, uint64_t addr, uint64_t len, int cpu) override {
    return slots_->Request(w, addr, len, cpu);
  }
  std::vector<ClosedBreakpoint> ReleaseCpu(int cpu) override;
  void CloseAll() override { slots_->armed().clear(); }
  void Changed() override;

 private:
  std::unique_ptr<KernelSlots> slots_;
  pid_t target_;  // --kernel-accesses: the process; 0 for kernel watches
  std::string command_line_;
  std::function<void(const absl::Status&)> on_publish_error_;
  bool published_ = false;
};

}  // namespace kwatch::watch::kernel
