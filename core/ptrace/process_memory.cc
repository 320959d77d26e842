// Process, memory and registers: /proc/PID/mem and the general registers.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"
#include "core/base/syscall_status.h"
#include "core/ptrace/process.h"
#include "core/ptrace/thread_regs.h"

namespace kwatch::core::ptrace {

absl::StatusOr<int> Process::MemFd() const {
  if (!mem_fd_) {
    mem_fd_.Reset(::open(absl::StrCat("/proc/", pid_, "/mem").c_str(), O_RDWR | O_CLOEXEC));
    if (!mem_fd_) {
      const int err = errno;
      return SyscallError(err, absl::StrFormat("open(/proc/%d/mem)", pid_),
                          err == ENOENT ? "the target has exited" : "");
    }
  }
  return mem_fd_.get();
}

absl::Status Process::ReadMemory(RemoteAddr addr, std::span<uint8_t> out) const {
  KW_ASSIGN_OR_RETURN(const int fd, MemFd());
  const ssize_t m = ::pread(fd, out.data(), out.size(), static_cast<off_t>(addr.value));
  if (m != static_cast<ssize_t>(out.size())) {
    const int err = m < 0 ? errno : EIO;
    return SyscallError(
        err, absl::StrFormat("read %d bytes at 0x%x of pid %d", out.size(), addr.value, pid_));
  }
  return absl::OkStatus();
}

absl::Status Process::WriteMemory(RemoteAddr addr, std::span<const uint8_t> data) const {
  KW_ASSIGN_OR_RETURN(const int fd, MemFd());
  const ssize_t m = ::pwrite(fd, data.data(), data.size(), static_cast<off_t>(addr.value));
  if (m != static_cast<ssize_t>(data.size())) {
    const int err = m < 0 ? errno : EIO;
    return SyscallError(
        err, absl::StrFormat("write %d bytes at 0x%x of pid %d", data.size(), addr.value, pid_));
  }
  return absl::OkStatus();
}

// Members, not static: callers keep asking the process for its threads' registers.
// NOLINTNEXTLINE(readability-convert-member-functions-to-static)
absl::StatusOr<user_regs_struct> Process::GetRegs(pid_t tid) const {
  return ReadGeneralRegs(tid);
}

// NOLINTNEXTLINE(readability-convert-member-functions-to-static)
absl::Status Process::SetRegs(pid_t tid, const user_regs_struct& regs) const {
  return WriteGeneralRegs(tid, regs);
}

}  // namespace kwatch::core::ptrace
