#include "cli/slot_probe.h"

#include <linux/hw_breakpoint.h>
#include <linux/perf_event.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/base/syscall_status.h"
#include "core/base/unique_fd.h"
#include "drmgr/debug_regs.h"
#include "watch/perf_util.h"

namespace kwatch::cli {

namespace {

// The breakpoints' addresses: perf only checks that they are aligned user addresses, in any
// process, so kwatch's own buffer will do (the events stay disabled and never fire).
alignas(64) std::array<uint64_t, drmgr::kNumDebugRegisters> g_probe_buffer{};

}  // namespace

absl::StatusOr<int> CountFreeSlots(pid_t tid) {
  std::vector<core::UniqueFd> held;
  for (int i = 0; i < drmgr::kNumDebugRegisters; ++i) {
    perf_event_attr attr{};
    attr.type = PERF_TYPE_BREAKPOINT;
    attr.size = sizeof(attr);
    attr.bp_type = HW_BREAKPOINT_W;
    attr.bp_addr = reinterpret_cast<uintptr_t>(&g_probe_buffer[static_cast<size_t>(i)]);
    attr.bp_len = HW_BREAKPOINT_LEN_8;
    attr.sample_period = 1;
    attr.disabled = 1;  // the kernel reserves the slot at creation, enabled or not
    attr.inherit = 0;
    attr.exclude_kernel = 1;
    attr.exclude_hv = 1;
    const int fd =
        static_cast<int>(::syscall(SYS_perf_event_open, &attr, tid, -1, -1, PERF_FLAG_FD_CLOEXEC));
    if (fd >= 0) {
      held.emplace_back(fd);
      continue;
    }
    const int err = errno;
    const std::string call = absl::StrCat("perf_event_open(disabled breakpoint ", i + 1, " of ",
                                          drmgr::kNumDebugRegisters, ", tid ", tid, ")");
    switch (err) {
      case ENOSPC:
        return static_cast<int>(held.size());  // `held` closes them all on return
      case ESRCH:
        return absl::NotFoundError(absl::StrCat("thread ", tid, " exited"));
      case EACCES:
      case EPERM:
        return core::SyscallError(
            err, call,
            absl::StrCat("counting the free debug registers of another process's thread ",
                         watch::PerfPermissionAdvice()));
      case ENODEV:
      case ENOENT:
      case EOPNOTSUPP:
        return core::SyscallError(err, call, watch::NoBreakpointSupportAdvice());
      default:
        return core::SyscallError(err, call);
    }
  }
  return static_cast<int>(held.size());
}

}  // namespace kwatch::cli
