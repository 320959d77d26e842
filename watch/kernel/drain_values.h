#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/kernel/bpf_kernel_reader.h"
#include "core/kernel/kernel_memory.h"
#include "watch/kernel/kernel_event.h"

namespace kwatch::watch::kernel {

// The values of kernel watches read at drain time from kernel memory (/proc/kcore, or a file
// the user names): each watch's bytes once per drained batch (several events of a batch show
// the same value), so a value is the watch's content when kwatch drained, not at the access.
// Owns the kernel memory reader. Not thread-safe.
class DrainValues {
 public:
  // `memory` null: no value is ever read (Enabled() is false).
  DrainValues(std::unique_ptr<core::kernel::KernelMemory> memory, size_t watches)
      : memory_(std::move(memory)), values_(watches), failed_(watches, false) {}
  DrainValues(std::nullptr_t, size_t watches)
      : DrainValues(std::unique_ptr<core::kernel::KernelMemory>(), watches) {}
  // Values read through BPF (kernels without /proc/kcore).
  DrainValues(std::unique_ptr<core::kernel::BpfKernelReader> bpf, size_t watches)
      : bpf_(std::move(bpf)), values_(watches), failed_(watches, false) {}

  bool Enabled() const { return memory_ != nullptr || bpf_ != nullptr; }

  // Forgets the values of the previous batch.
  void NewBatch();

  struct Value {
    std::optional<uint64_t> value;  // nullopt when it cannot be read
    absl::Status first_failure;     // the read's error the first time watch `i`'s read fails
  };
  // Watch `i`'s value in this batch (read at its first event of the batch, little-endian, at
  // most 8 bytes of `w`).
  Value Get(size_t i, const KernelWatch& w);

 private:
  std::unique_ptr<core::kernel::KernelMemory> memory_;
  std::unique_ptr<core::kernel::BpfKernelReader> bpf_;
  std::vector<std::optional<std::optional<uint64_t>>> values_;  // per watch, this batch
  std::vector<bool> failed_;                                    // per watch: said once
};

// Where kernel watches read kernel memory for their values by default (CONFIG_PROC_KCORE).
inline constexpr absl::string_view kProcKcore = "/proc/kcore";

// The drain-time values of a session's watches, as OpenDrainValues found them.
struct OpenedDrainValues {
  std::unique_ptr<DrainValues> values;  // never null; Enabled() when kernel memory is read
  std::string source;                   // the file values come from ("" when none)
  // Why no value will be shown, for the user: /proc/kcore cannot be opened (OK otherwise).
  absl::Status why_none;
  // Watches whose value could not be read at the first try, with the reason (each said once:
  // DrainValues does not report them again).
  std::vector<std::pair<size_t, absl::Status>> unreadable;
};

// Opens kernel memory for the values of `watches` at drain time: the core file `kcore` (an
// error when it cannot be read), or with `kcore` "" /proc/kcore, else BPF's
// bpf_probe_read_kernel (core/kernel/bpf_kernel_reader.h); when neither opens, no values,
// and `why_none` says why in words (no CONFIG_PROC_KCORE, CAP_SYS_RAWIO and lockdown; BPF's
// reason). Each watch is read once here, so that one the file does not map is known before
// any event. With `needed` false (no event will be shown or recorded) nothing is opened.
absl::StatusOr<OpenedDrainValues> OpenDrainValues(const std::string& kcore, bool needed,
                                                  std::span<const KernelWatch> watches);

}  // namespace kwatch::watch::kernel
