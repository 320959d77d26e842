#include "core/ptrace/thread_regs.h"

#include <cpuid.h>
#include <elf.h>
#include <sys/ptrace.h>
#include <sys/uio.h>

#include <cerrno>
#include <cstddef>

#include "absl/strings/str_cat.h"
#include "core/base/syscall_status.h"

namespace kwatch::core::ptrace {
namespace {

constexpr size_t kFxsaveBytes = 512;

// The size of the XSAVE area for every feature the CPU supports (CPUID leaf 0xD, ECX), and
// at least the legacy area with its header.
size_t XsaveBytes() {
  unsigned int eax = 0;
  unsigned int ebx = 0;
  unsigned int ecx = 0;
  unsigned int edx = 0;
  if (__get_cpuid_count(0xd, 0, &eax, &ebx, &ecx, &edx) == 0 || ecx < kFxsaveBytes + 64) {
    return kFxsaveBytes + 64;
  }
  return ecx;
}

absl::Status CheckDebugIndex(int index) {
  if ((index >= 0 && index <= 3) || index == 6 || index == 7) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("debug register ", index, " does not exist (0-3, 6 and 7 do)"));
}

void* DebugRegOffset(int index) {
  return reinterpret_cast<void*>(  // NOLINT(performance-no-int-to-ptr): ptrace's offset
      offsetof(struct user, u_debugreg) + static_cast<size_t>(index) * sizeof(long));
}

}  // namespace

absl::StatusOr<user_regs_struct> ReadGeneralRegs(pid_t tid) {
  user_regs_struct regs{};
  if (::ptrace(PTRACE_GETREGS, tid, nullptr, &regs) != 0) {
    const int err = errno;
    return SyscallError(err, absl::StrCat("ptrace(PTRACE_GETREGS, ", tid, ")"));
  }
  return regs;
}

absl::Status WriteGeneralRegs(pid_t tid, const user_regs_struct& regs) {
  if (::ptrace(PTRACE_SETREGS, tid, nullptr, &regs) != 0) {
    const int err = errno;
    return SyscallError(err, absl::StrCat("ptrace(PTRACE_SETREGS, ", tid, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ExtendedRegs> ReadExtendedRegs(pid_t tid) {
  ExtendedRegs out;
  out.note = NT_X86_XSTATE;
  out.bytes.resize(XsaveBytes());
  iovec iov{out.bytes.data(), out.bytes.size()};
  // NOLINTNEXTLINE(performance-no-int-to-ptr): ptrace takes the regset's number as an address
  void* const xstate = reinterpret_cast<void*>(NT_X86_XSTATE);
  if (::ptrace(PTRACE_GETREGSET, tid, xstate, &iov) != 0) {
    const int err = errno;
    if (err != EINVAL && err != ENODEV) {
      return SyscallError(err, absl::StrCat("ptrace(PTRACE_GETREGSET, ", tid, ", NT_X86_XSTATE)"));
    }
    // No XSAVE: the FXSAVE area is all there is.
    out.note = NT_PRFPREG;
    out.bytes.assign(kFxsaveBytes, 0);
    iov = iovec{out.bytes.data(), out.bytes.size()};
    // NOLINTNEXTLINE(performance-no-int-to-ptr): as above
    void* const fpregs = reinterpret_cast<void*>(NT_PRFPREG);
    if (::ptrace(PTRACE_GETREGSET, tid, fpregs, &iov) != 0) {
      const int err2 = errno;
      return SyscallError(err2, absl::StrCat("ptrace(PTRACE_GETREGSET, ", tid, ", NT_PRFPREG)"));
    }
  }
  out.bytes.resize(iov.iov_len);
  return out;
}

absl::Status WriteExtendedRegs(pid_t tid, const ExtendedRegs& regs) {
  std::vector<uint8_t> bytes = regs.bytes;  // the kernel takes a non-const buffer
  iovec iov{bytes.data(), bytes.size()};
  // NOLINTNEXTLINE(performance-no-int-to-ptr): ptrace takes the regset's number as an address
  void* const note = reinterpret_cast<void*>(static_cast<uintptr_t>(regs.note));
  if (::ptrace(PTRACE_SETREGSET, tid, note, &iov) != 0) {
    const int err = errno;
    return SyscallError(
        err, absl::StrCat("ptrace(PTRACE_SETREGSET, ", tid, ", ",
                          regs.note == NT_X86_XSTATE ? "NT_X86_XSTATE" : "NT_PRFPREG", ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> ReadDebugReg(pid_t tid, int index) {
  if (absl::Status s = CheckDebugIndex(index); !s.ok()) {
    return s;
  }
  errno = 0;
  const long value = ::ptrace(PTRACE_PEEKUSER, tid, DebugRegOffset(index), nullptr);
  if (errno != 0) {
    const int err = errno;
    return SyscallError(err, absl::StrCat("ptrace(PTRACE_PEEKUSER, ", tid, ", DR", index, ")"));
  }
  return static_cast<uint64_t>(value);
}

}  // namespace kwatch::core::ptrace
