#include "watch/perf_breakpoint.h"

#include <fcntl.h>
#include <linux/hw_breakpoint.h>
#include <linux/perf_event.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "core/base/status_macros.h"
#include "core/base/syscall_status.h"
#include "watch/perf_util.h"

namespace kwatch::watch {

namespace {

// Lowest address of the x86-64 kernel half (canonical upper half).
constexpr uint64_t kKernelHalf = 0xffff800000000000ULL;

std::string WhoText(const BreakpointRequest& req) {
  if (req.tid == -1) {
    return absl::StrCat("cpu ", req.cpu);
  }
  return absl::StrCat("tid ", req.tid);
}

std::string EinvalAdvice(const BreakpointRequest& req) {
  const bool kernel_addr = req.addr.value >= kKernelHalf;
  if (kernel_addr && req.kind == drmgr::DrKind::kExec) {
    return "execute breakpoints on kernel text are refused by this kernel (it allows them only "
           "with CONFIG_KPROBES, and never in the kprobe blacklist)";
  }
  if (kernel_addr && req.exclude_kernel) {
    return "this is a kernel address but only user accesses were requested (exclude_kernel); "
           "watch kernel accesses instead (as root)";
  }
  if (!kernel_addr && req.exclude_user && req.exclude_kernel) {
    return "both user and kernel accesses are excluded: nothing would be watched";
  }
  if (req.tid == -1 && req.cpu < 0) {
    return "a CPU-wide breakpoint (tid -1) needs a CPU number";
  }
  return "the kernel refused the breakpoint: x86 watches 1, 2, 4 or 8 aligned bytes, execute "
         "breakpoints cover one instruction start, and an address near the top of user space "
         "counts as a kernel address";
}

// Opens one event of `attr` for req.tid on `cpu`, turning errno into advice.
absl::StatusOr<core::UniqueFd> OpenOne(const perf_event_attr& attr, const BreakpointRequest& req,
                                       int cpu, bool show_cpu) {
  perf_event_attr copy = attr;
  const int fd = static_cast<int>(
      ::syscall(SYS_perf_event_open, &copy, req.tid, cpu, -1, PERF_FLAG_FD_CLOEXEC));
  if (fd >= 0) {
    return core::UniqueFd(fd);
  }
  const int err = errno;
  std::string call =
      absl::StrFormat("perf_event_open(breakpoint 0x%x len %d %s, %s", req.addr.value, attr.bp_len,
                      drmgr::DrKindName(req.kind), WhoText(req));
  if (show_cpu) {
    absl::StrAppend(&call, ", cpu ", cpu);
  }
  absl::StrAppend(&call, ")");
  switch (err) {
    case EACCES:
    case EPERM:
      return core::SyscallError(err, call, PerfPermissionAdvice());
    case ENOSPC:
      return core::SyscallError(
          err, call,
          absl::StrCat("all ", drmgr::kNumDebugRegisters, " debug registers of ",
                       req.tid == -1 ? absl::StrCat("CPU ", cpu) : absl::StrCat("thread ", req.tid),
                       " are in use (other watches, or a debugger such as gdb holding "
                       "hardware breakpoints)"));
    case EINVAL:
      return core::SyscallError(err, call, EinvalAdvice(req));
    case ESRCH:
      return absl::NotFoundError(
          absl::StrCat(call, ": ", core::ErrnoText(err), "; thread ", req.tid, " exited"));
    case ENODEV:
    case ENOENT:
    case EOPNOTSUPP:
      return core::SyscallError(err, call, NoBreakpointSupportAdvice());
    default:
      return core::SyscallError(err, call);
  }
}

}  // namespace

namespace {

// The event `req` asks for.
perf_event_attr AttrFor(const BreakpointRequest& req) {
  const bool exec = req.kind == drmgr::DrKind::kExec;
  perf_event_attr attr{};
  attr.type = PERF_TYPE_BREAKPOINT;
  attr.size = sizeof(attr);
  attr.bp_type = PerfBpType(req.kind);
  attr.bp_addr = req.addr.value;
  // x86 execute breakpoints must say sizeof(long) (arch/x86/kernel/hw_breakpoint.c).
  attr.bp_len = exec ? sizeof(long) : req.len;
  attr.sample_period = 1;
  attr.sample_type =
      PERF_SAMPLE_IP | PERF_SAMPLE_TID | PERF_SAMPLE_TIME | PERF_SAMPLE_ADDR | PERF_SAMPLE_CPU;
  if (req.callchain_frames > 0) {
    attr.sample_type |= PERF_SAMPLE_CALLCHAIN;
    attr.sample_max_stack = req.callchain_frames;
  }
  if (req.sample_regs_user != 0) {
    attr.sample_type |= PERF_SAMPLE_REGS_USER;
    attr.sample_regs_user = req.sample_regs_user;
  }
  // Inheritance follows new tasks of a watched task; a CPU-wide event has none.
  attr.inherit = (req.inherit && req.tid != -1) ? 1 : 0;
  attr.inherit_thread = (attr.inherit != 0 && req.inherit_thread) ? 1 : 0;
  attr.exclude_kernel = req.exclude_kernel ? 1 : 0;
  attr.exclude_user = req.exclude_user ? 1 : 0;
  attr.exclude_hv = 1;
  attr.use_clockid = 1;
  attr.clockid = CLOCK_MONOTONIC;
  attr.wakeup_events = req.wakeup_events;
  attr.precise_ip = 0;
  attr.disabled = 0;
  return attr;
}

}  // namespace

absl::StatusOr<std::unique_ptr<PerfBreakpoint>> PerfBreakpoint::Open(const BreakpointRequest& req) {
  const bool exec = req.kind == drmgr::DrKind::kExec;
  if (exec) {
    // Callers may pass 1 (one instruction start) or sizeof(long) (what perf wants on x86).
    if (req.len != 1 && req.len != sizeof(long)) {
      KW_RETURN_IF_ERROR(drmgr::CheckHardwareRange(req.addr, req.len, req.kind));
    }
  } else {
    KW_RETURN_IF_ERROR(drmgr::CheckHardwareRange(req.addr, req.len, req.kind));
  }
  if (req.ring_pages != 0 && (req.ring_pages & (req.ring_pages - 1)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("perf ring: %d data pages is not a power of two (the kernel requires 2^n)",
                        req.ring_pages));
  }

  perf_event_attr attr = AttrFor(req);
  const PerfSampleFormat format{.callchain = req.callchain_frames > 0,
                                .regs_user = req.sample_regs_user};

  // perf_mmap() refuses inherited per-task events (cpu -1) with EINVAL, in every kernel
  // since perf began: open the inherited task event once per CPU instead.
  const bool per_cpu = attr.inherit != 0 && req.cpu < 0 && req.ring_pages > 0;
  std::vector<int> cpus;
  if (per_cpu) {
    cpus = OnlineCpus();
  } else {
    cpus.push_back(req.cpu);
  }

  std::vector<core::UniqueFd> fds;
  std::optional<PerfRing> ring;
  for (const int cpu : cpus) {
    KW_ASSIGN_OR_RETURN(core::UniqueFd fd, OpenOne(attr, req, cpu, per_cpu));
    if (req.ring_pages > 0) {
      KW_ASSIGN_OR_RETURN(PerfRing mapped, PerfRing::Map(fd.get(), req.ring_pages, format));
      if (ring.has_value()) {
        ring->Join(std::move(mapped));
      } else {
        ring.emplace(std::move(mapped));
      }
    }
    fds.push_back(std::move(fd));
  }
  // On error above, every event opened so far closes with `fds`: all or nothing.

  auto bp = std::unique_ptr<PerfBreakpoint>(
      new PerfBreakpoint(std::move(fds.front()), std::move(ring), req));
  for (size_t i = 1; i < fds.size(); ++i) {
    bp->more_fds_.push_back(std::move(fds[i]));
  }
  return bp;
}

std::vector<int> PerfBreakpoint::fds() const {
  std::vector<int> out;
  out.reserve(1 + more_fds_.size());
  out.push_back(fd_.get());
  for (const core::UniqueFd& fd : more_fds_) {
    out.push_back(fd.get());
  }
  return out;
}

absl::StatusOr<uint64_t> PerfBreakpoint::Count() const {
  uint64_t total = 0;
  for (const int fd : fds()) {
    uint64_t value = 0;
    const ssize_t n = ::read(fd, &value, sizeof(value));
    if (n < 0) {
      const int err = errno;
      return core::SyscallError(err, "read(perf breakpoint count)");
    }
    if (static_cast<size_t>(n) != sizeof(value)) {
      return absl::InternalError(
          absl::StrFormat("read(perf breakpoint count): short read of %d bytes", n));
    }
    total += value;
  }
  return total;
}

absl::Status PerfBreakpoint::Retarget(core::RemoteAddr addr, uint32_t len, drmgr::DrKind kind) {
  KW_RETURN_IF_ERROR(drmgr::CheckHardwareRange(addr, len, kind));
  BreakpointRequest next = req_;
  next.addr = addr;
  next.len = len;
  next.kind = kind;
  perf_event_attr attr = AttrFor(next);
  for (const int fd : fds()) {
    if (::ioctl(fd, PERF_EVENT_IOC_MODIFY_ATTRIBUTES, &attr) != 0) {
      const int err = errno;
      return core::SyscallError(err, "ioctl(PERF_EVENT_IOC_MODIFY_ATTRIBUTES)");
    }
  }
  req_ = next;
  return absl::OkStatus();
}

// Not const: it changes the kernel state this object owns.
absl::Status PerfBreakpoint::Enable() {  // NOLINT(readability-make-member-function-const)
  for (const int fd : fds()) {
    if (::ioctl(fd, PERF_EVENT_IOC_ENABLE, 0) != 0) {
      const int err = errno;
      return core::SyscallError(err, "ioctl(PERF_EVENT_IOC_ENABLE)");
    }
  }
  return absl::OkStatus();
}

absl::Status PerfBreakpoint::Disable() {  // NOLINT(readability-make-member-function-const)
  for (const int fd : fds()) {
    if (::ioctl(fd, PERF_EVENT_IOC_DISABLE, 0) != 0) {
      const int err = errno;
      return core::SyscallError(err, "ioctl(PERF_EVENT_IOC_DISABLE)");
    }
  }
  return absl::OkStatus();
}

}  // namespace kwatch::watch
