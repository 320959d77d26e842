#pragma once

#include <sys/types.h>
#include <sys/user.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "core/base/remote_addr.h"
#include "core/base/unique_fd.h"
#include "watch/perf_ring.h"

namespace kwatch::watch {

// What to probe with the kernel's uprobe PMU (/sys/bus/event_source/devices/uprobe): an
// instruction of an ELF file named by path and file offset. The probe lives on the inode, so
// every process mapping the file hits it, including processes started later.
struct UprobeRequest {
  std::string path;          // the ELF file (absolute or relative to kwatch's cwd)
  uint64_t file_offset = 0;  // of the probed instruction within the file
  bool is_return = false;    // a return probe (retprobe bit): fires when the function returns
  // Process to follow (its threads and, with inherit, its children); -1: every process on
  // every CPU (global, needs root or CAP_PERFMON).
  pid_t pid = -1;
  bool inherit = true;
  // Bytes of user stack copied into each sample from the stack pointer up (0: none). The
  // arguments are evaluated from them and the registers, as the kernel saw them at the hit.
  uint32_t stack_bytes = 512;
  size_t ring_pages = 64;  // data pages per CPU ring, power of two; 0 = counting only
};

// One hit of a uprobe as the kernel sampled it.
struct UprobeHit {
  uint64_t time_ns = 0;  // CLOCK_MONOTONIC
  pid_t pid = 0;
  pid_t tid = 0;
  uint32_t cpu = 0;
  core::RemoteAddr ip;  // the probed instruction (entry) or the return address (return)
  user_regs_struct regs{};
  std::span<const uint8_t> stack;  // user stack from regs.rsp up; valid during the callback
};

// The uprobe PMU's event type and retprobe bit, read from sysfs. NotFound (with advice) when
// the kernel has no uprobe PMU (CONFIG_UPROBE_EVENTS, Linux >= 4.17).
struct UprobePmu {
  uint32_t type = 0;
  uint32_t retprobe_bit = 0;
};
absl::StatusOr<UprobePmu> FindUprobePmu();

// One uprobe opened through perf_event_open on every CPU (or on one task), with sampled user
// registers and stack in per-CPU ring buffers. Owns the events: closing removes the probe.
// Single consumer; not thread-safe.
class UprobeEvent {
 public:
  // Errors carry advice: EACCES/EPERM name perf_event_paranoid and CAP_PERFMON; ENOENT the
  // path; EINVAL a file offset that is not inside an executable mapping of the file.
  static absl::StatusOr<std::unique_ptr<UprobeEvent>> Open(const UprobeRequest& req);

  const UprobeRequest& request() const { return req_; }
  std::vector<int> fds() const;

  // Consumes every sample waiting in the rings, in ring order (callers sort across CPUs by
  // time when they need to). Returns the number of hits delivered.
  size_t Drain(absl::FunctionRef<void(const UprobeHit&)> on_hit);

  // Hits counted by the kernel (summed over CPUs), including those not sampled or lost.
  absl::StatusOr<uint64_t> Count() const;
  // Samples the kernel dropped because a ring was full.
  uint64_t lost() const { return ring_ ? ring_->lost() : 0; }

 private:
  explicit UprobeEvent(UprobeRequest req) : req_(std::move(req)) {}

  UprobeRequest req_;
  std::vector<core::UniqueFd> fds_;
  std::optional<PerfRing> ring_;
};

// The registers kwatch samples (perf_regs.h order for x86-64, without DS/ES/FS/GS which
// the kernel refuses on 64-bit): the mask for perf_event_attr.sample_regs_user.
uint64_t UprobeSampleRegsMask();

// Parses a PERF_RECORD_SAMPLE with sample_type IP | TID | TIME | CPU | REGS_USER |
// STACK_USER and the mask above. False when the record is too short or malformed.
bool ParseUprobeSample(std::span<const uint8_t> record, uint32_t stack_bytes, UprobeHit& hit);

}  // namespace kwatch::watch
