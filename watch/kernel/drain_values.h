#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
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

  bool Enabled() const { return memory_ != nullptr; }

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
  std::vector<std::optional<std::optional<uint64_t>>> values_;  // per watch, this batch
  std::vector<bool> failed_;                                    // per watch: said once
};

}  // namespace kwatch::watch::kernel
