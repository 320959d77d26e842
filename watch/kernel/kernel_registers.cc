#include "watch/kernel/kernel_registers.h"

#include <utility>

#include "core/base/status_macros.h"
#include "drmgr/slot_registry.h"
#include "watch/perf_breakpoint.h"

namespace kwatch::watch::kernel {

namespace {

std::vector<std::string> Labels(std::span<const KernelWatch> watches) {
  std::vector<std::string> labels;
  labels.reserve(watches.size());
  for (const KernelWatch& w : watches) {
    labels.push_back(w.display);
  }
  return labels;
}

}  // namespace

absl::StatusOr<std::unique_ptr<KernelSlots>> ArmKernelWatches(drmgr::DrKind kind,
                                                              uint16_t callchain_frames,
                                                              std::span<KernelWatch> watches,
                                                              std::span<const int> cpus) {
  BreakpointRequest opened;
  opened.kind = kind;
  opened.tid = -1;
  opened.inherit = false;
  opened.exclude_kernel = false;
  opened.exclude_user = false;
  opened.callchain_frames = callchain_frames;
  auto slots = std::make_unique<KernelSlots>(opened, Labels(watches));
  for (size_t i = 0; i < watches.size(); ++i) {
    KernelWatch& w = watches[i];
    for (const int cpu : cpus) {
      KW_RETURN_IF_ERROR(slots->Request(i, w.addr, w.len, cpu));
      w.cpus.push_back(cpu);
    }
  }
  return slots;
}

absl::StatusOr<std::unique_ptr<KernelSlots>> ArmKernelAccesses(drmgr::DrKind kind,
                                                               uint16_t callchain_frames,
                                                               std::span<const KernelWatch> watches,
                                                               core::ptrace::Process& proc) {
  BreakpointRequest opened;
  opened.kind = kind;
  opened.inherit = true;
  opened.exclude_kernel = false;
  opened.exclude_user = true;
  opened.callchain_frames = callchain_frames;
  core::ptrace::Process* p = &proc;
  auto slots = std::make_unique<KernelSlots>(opened, Labels(watches), proc.pid(),
                                             [p] { return p->TracedThreads(); });
  for (size_t i = 0; i < watches.size(); ++i) {
    KW_RETURN_IF_ERROR(slots->RequestForProcess(i, watches[i].addr, watches[i].len));
  }
  return slots;
}

PublishedRegisters::PublishedRegisters(std::unique_ptr<KernelSlots> slots, pid_t target,
                                       std::string command_line,
                                       std::function<void(const absl::Status&)> on_publish_error)
    : slots_(std::move(slots)),
      target_(target),
      command_line_(std::move(command_line)),
      on_publish_error_(std::move(on_publish_error)) {}

PublishedRegisters::~PublishedRegisters() {
  if (published_) {
    drmgr::UnpublishSlots();
  }
}

std::vector<ArmedBreakpoint> PublishedRegisters::Armed() {
  std::vector<ArmedBreakpoint> out;
  out.reserve(slots_->armed().size());
  for (const KernelBreakpoint& k : slots_->armed()) {
    out.push_back({k.bp.get(), k.watches});
  }
  return out;
}

std::vector<ClosedBreakpoint> PublishedRegisters::ReleaseCpu(int cpu) {
  std::vector<ClosedBreakpoint> out;
  for (KernelBreakpoint& k : slots_->ReleaseCpu(cpu)) {
    auto c = k.bp->Count();
    out.push_back({c.ok() ? *c : 0, k.bp->ring() != nullptr ? k.bp->ring()->lost() : 0,
                   std::move(k.watches)});
  }
  return out;
}

void PublishedRegisters::Changed() {
  published_ = true;
  if (absl::Status st = drmgr::PublishSlots(target_, slots_->Snapshot(), command_line_);
      !st.ok() && on_publish_error_) {
    on_publish_error_(st);
  }
}

}  // namespace kwatch::watch::kernel
