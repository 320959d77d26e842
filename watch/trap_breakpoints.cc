#include "watch/trap_breakpoints.h"

#include <linux/hw_breakpoint.h>
#include <linux/perf_event.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"
#include "core/base/syscall_status.h"
#include "core/ptrace/trap_origin.h"
#include "watch/perf_util.h"

namespace kwatch::watch {

namespace {

constexpr uint32_t kSerialBits = 30;
constexpr uint32_t kSerialMask = (uint32_t{1} << kSerialBits) - 1;

std::string KernelRelease() {
  utsname u{};
  return ::uname(&u) == 0 ? std::string(u.release) : std::string("?");
}

// Each open breakpoint is a descriptor: a process with many threads needs more than the usual
// soft limit of 1024 (4 per thread). Raises the soft limit to the hard one, once.
bool RaiseFileLimit() {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur >= lim.rlim_max) {
    return false;
  }
  lim.rlim_cur = lim.rlim_max;
  return ::setrlimit(RLIMIT_NOFILE, &lim) == 0;
}

absl::StatusOr<core::UniqueFd> OpenTrap(pid_t tid, int reg, const TrapSlot& slot,
                                        uint64_t sig_data) {
  const bool exec = slot.kind == drmgr::DrKind::kExec;
  if (!exec || slot.len != 1) {
    KW_RETURN_IF_ERROR(drmgr::CheckHardwareRange(slot.addr, slot.len, slot.kind));
  }
  perf_event_attr attr{};
  attr.type = PERF_TYPE_BREAKPOINT;
  attr.size = sizeof(attr);
  attr.bp_type = PerfBpType(slot.kind);
  attr.bp_addr = slot.addr.value;
  // x86 execute breakpoints must say sizeof(long) (arch/x86/kernel/hw_breakpoint.c).
  attr.bp_len = exec ? sizeof(long) : slot.len;
  attr.sample_period = 1;
  attr.exclude_kernel = 1;
  attr.exclude_hv = 1;
  attr.sigtrap = 1;
  attr.remove_on_exec = 1;  // required with sigtrap
  attr.sig_data = sig_data;
  for (bool raised = false;;) {
    const int fd =
        static_cast<int>(::syscall(SYS_perf_event_open, &attr, tid, -1, -1, PERF_FLAG_FD_CLOEXEC));
    if (fd >= 0) {
      return core::UniqueFd(fd);
    }
    const int err = errno;
    if ((err == EMFILE) && !raised && RaiseFileLimit()) {
      raised = true;
      continue;
    }
    const std::string call =
        absl::StrFormat("perf_event_open(breakpoint DR%d 0x%x len %d %s sigtrap, tid %d)", reg,
                        slot.addr.value, slot.len, drmgr::DrKindName(slot.kind), tid);
    switch (err) {
      case EACCES:
      case EPERM:
        return core::SyscallError(err, call, PerfPermissionAdvice());
      case ENOSPC:
        return core::SyscallError(
            err, call,
            absl::StrCat("all ", drmgr::kNumDebugRegisters, " debug registers of thread ", tid,
                         " are in use (other watches, or a debugger such as gdb holding "
                         "hardware breakpoints)"));
      case ESRCH:
        return absl::NotFoundError(
            absl::StrCat(call, ": ", core::ErrnoText(err), "; thread ", tid, " exited"));
      case EINVAL:
      case E2BIG:
        return core::SyscallError(
            err, call,
            absl::StrCat("breakpoints that stop the thread need perf_event_attr.sigtrap "
                         "(Linux 5.13; this kernel is ",
                         KernelRelease(),
                         "), an address in user space, and 1, 2, 4 or 8 aligned bytes"));
      case ENODEV:
      case ENOENT:
      case EOPNOTSUPP:
        return core::SyscallError(err, call, NoBreakpointSupportAdvice());
      default:
        return core::SyscallError(err, call);
    }
  }
}

}  // namespace

uint64_t TrapSigData(int reg, uint32_t serial) {
  return core::ptrace::kKwatchSigDataMagic | (uint64_t{serial & kSerialMask} << 2) |
         static_cast<uint64_t>(reg & 3);
}

int TrapSigDataRegister(uint64_t sig_data) {
  return core::ptrace::IsKwatchSigData(sig_data) ? static_cast<int>(sig_data & 3) : -1;
}

bool IsTrapBreakpointSignal(const siginfo_t& si) {
  return si.si_signo == SIGTRAP && si.si_code == core::ptrace::kTrapPerf &&
         core::ptrace::IsKwatchSigData(core::ptrace::SiPerfData(si));
}

absl::Status TrapBreakpoints::Set(pid_t tid, int reg, const TrapSlot& slot) {
  if (reg < 0 || reg >= drmgr::kNumDebugRegisters) {
    return absl::InvalidArgumentError(absl::StrCat("no debug register ", reg));
  }
  Clear(tid, reg);
  const uint32_t serial = next_serial_;
  next_serial_ = (next_serial_ + 1) & kSerialMask;
  if (next_serial_ == 0) {
    next_serial_ = 1;
  }
  const uint64_t data = TrapSigData(reg, serial);
  KW_ASSIGN_OR_RETURN(core::UniqueFd fd, OpenTrap(tid, reg, slot, data));
  threads_[tid][reg] = Armed{slot, data, std::move(fd)};
  ++open_;
  return absl::OkStatus();
}

void TrapBreakpoints::Clear(pid_t tid, int reg) {
  auto it = threads_.find(tid);
  if (it == threads_.end() || reg < 0 || reg >= drmgr::kNumDebugRegisters ||
      !it->second[reg].has_value()) {
    return;
  }
  it->second[reg].reset();
  --open_;
  for (const std::optional<Armed>& a : it->second) {
    if (a.has_value()) {
      return;
    }
  }
  threads_.erase(it);
}

void TrapBreakpoints::Drop(pid_t tid) {
  auto it = threads_.find(tid);
  if (it == threads_.end()) {
    return;
  }
  for (const std::optional<Armed>& a : it->second) {
    open_ -= a.has_value() ? 1 : 0;
  }
  threads_.erase(it);
}

void TrapBreakpoints::DropAll() {
  threads_.clear();
  open_ = 0;
}

int TrapBreakpoints::Fired(pid_t tid, uint64_t sig_data) const {
  const int reg = TrapSigDataRegister(sig_data);
  if (reg < 0) {
    return -1;
  }
  auto it = threads_.find(tid);
  if (it == threads_.end() || !it->second[reg].has_value() ||
      it->second[reg]->sig_data != sig_data) {
    return -1;
  }
  return reg;
}

std::optional<TrapSlot> TrapBreakpoints::SlotOf(pid_t tid, int reg) const {
  auto it = threads_.find(tid);
  if (it == threads_.end() || reg < 0 || reg >= drmgr::kNumDebugRegisters ||
      !it->second[reg].has_value()) {
    return std::nullopt;
  }
  return it->second[reg]->slot;
}

std::vector<TrapBreakpoints::Event> TrapBreakpoints::Events() const {
  std::vector<Event> out;
  out.reserve(open_);
  for (const auto& [tid, regs] : threads_) {
    for (int reg = 0; reg < drmgr::kNumDebugRegisters; ++reg) {
      if (regs[reg].has_value()) {
        out.push_back({tid, reg, regs[reg]->slot, regs[reg]->sig_data, regs[reg]->fd.get()});
      }
    }
  }
  return out;
}

}  // namespace kwatch::watch
