#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/base/unique_fd.h"

namespace kwatch::core::kernel {

// Reads the running kernel's memory where /proc/kcore is absent: a BPF program of type
// BPF_PROG_TYPE_SYSCALL (Linux >= 5.14), run on demand with BPF_PROG_TEST_RUN, copies up to
// 256 bytes at the address its context names into an array map with bpf_probe_read_kernel,
// which faults safely (an unmapped address is an error, never an oops). The program is
// assembled here (no compiler at run time) and loaded through libbpf. Needs CAP_BPF and
// CAP_PERFMON (or CAP_SYS_ADMIN), and no lockdown of kernel reads.
class BpfKernelReader {
 public:
  static constexpr size_t kChunk = 256;  // bytes per run of the program

  // Loads the program. FailedPrecondition / PermissionDenied with the reason (the call, its
  // errno, the capability or kernel option missing).
  static absl::StatusOr<std::unique_ptr<BpfKernelReader>> Open();

  // Copies out.size() bytes at kernel address `addr`. NotFound when part of the range is not
  // mapped (bpf_probe_read_kernel's -EFAULT).
  absl::Status Read(uint64_t addr, std::span<uint8_t> out) const;

 private:
  BpfKernelReader(UniqueFd map, UniqueFd prog) : map_(std::move(map)), prog_(std::move(prog)) {}

  UniqueFd map_;   // array map: one value of kChunk bytes
  UniqueFd prog_;  // the program
};

}  // namespace kwatch::core::kernel
