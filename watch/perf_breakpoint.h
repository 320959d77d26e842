#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "core/base/remote_addr.h"
#include "core/base/unique_fd.h"
#include "drmgr/debug_regs.h"
#include "watch/perf_ring.h"

namespace kwatch::watch {

// What to open: one hardware breakpoint on one thread (or one CPU).
struct BreakpointRequest {
  core::RemoteAddr addr;
  uint32_t len = 8;  // 1, 2, 4 or 8, aligned (execute: sizeof(long))
  drmgr::DrKind kind = drmgr::DrKind::kWrite;
  pid_t tid = 0;  // thread to watch; -1 with cpu >= 0 for CPU-wide
  int cpu = -1;
  bool inherit = true;  // also threads/children created later
  // With inherit: threads of the process only (CLONE_THREAD), never a forked child (Linux
  // 5.13 inherit_thread), so that a fork child carries no breakpoint of the watcher's.
  bool inherit_thread = false;
  bool exclude_kernel = true;  // user accesses only
  bool exclude_user = false;   // kernel accesses only (kernel watches)
  size_t ring_pages = 64;      // data pages, power of two; 0 = counting only
  uint32_t wakeup_events = 1;  // samples per wakeup
  // Samples also carry the callchain (PERF_SAMPLE_CALLCHAIN), at most this many frames
  // (0: none). Drain them with PerfRing::DrainRecords and ParseCallchainSample.
  uint16_t callchain_frames = 0;
  // Samples also carry the user registers of this sample_regs_user mask as the access left
  // them (PERF_SAMPLE_REGS_USER; PerfUserRegsMaskGeneral(), watch/perf_util.h), in
  // PerfSample::user_regs (0: none). About 144 bytes more per sample.
  uint64_t sample_regs_user = 0;
};

// One perf_event_open(PERF_TYPE_BREAKPOINT) event with sample_period = 1 and samples of
// IP | TID | TIME | ADDR | CPU, clock CLOCK_MONOTONIC, and its ring buffer. Owns the fd and
// the mapping; closing it removes the breakpoint from the thread (and inherited children).
// Linux refuses to mmap an inherited per-task event, so an inherited watch of a thread with a
// ring (inherit, tid >= 0, cpu -1, ring_pages > 0) is opened as one event per online CPU;
// ring() then drains all of their rings and fds() lists all of their descriptors. CPUs that
// come online later are not covered.
class PerfBreakpoint {
 public:
  // Errors carry advice: EACCES/EPERM name kernel.perf_event_paranoid (with its current
  // value) and CAP_PERFMON; ENOSPC says that all 4 debug registers of the thread are in use;
  // EINVAL on a bad range explains the length/alignment rule; ESRCH means the thread exited.
  static absl::StatusOr<std::unique_ptr<PerfBreakpoint>> Open(const BreakpointRequest& req);

  // The first (often only) event's descriptor. Poll fds() to hear about every ring.
  int fd() const { return fd_.get(); }
  // Every descriptor of this breakpoint (one per CPU for inherited watches with a ring).
  std::vector<int> fds() const;
  PerfRing* ring() { return ring_ ? &*ring_ : nullptr; }
  const BreakpointRequest& request() const { return req_; }

  // Number of hits counted by the kernel (read(2) on each event, summed; the kernel adds the
  // counts of inherited children, running or exited).
  absl::StatusOr<uint64_t> Count() const;

  // Moves this breakpoint to another range (PERF_EVENT_IOC_MODIFY_ATTRIBUTES, Linux 4.17):
  // the event, its ring and the debug register the kernel reserved for it stay. Drain the
  // ring first. On error the breakpoint is where it was.
  absl::Status Retarget(core::RemoteAddr addr, uint32_t len, drmgr::DrKind kind);
  // Enable or disable every event of this breakpoint (PERF_EVENT_IOC_ENABLE / _DISABLE).
  absl::Status Enable();
  absl::Status Disable();

 private:
  PerfBreakpoint(core::UniqueFd fd, std::optional<PerfRing> ring, const BreakpointRequest& req)
      : fd_(std::move(fd)), ring_(std::move(ring)), req_(req) {}

  core::UniqueFd fd_;
  std::vector<core::UniqueFd> more_fds_;  // the other CPUs of an inherited watch
  std::optional<PerfRing> ring_;
  BreakpointRequest req_;
};

}  // namespace kwatch::watch
