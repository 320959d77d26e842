#pragma once

// The amd64 register file as gdb's remote protocol numbers it, for a Linux target: the
// target description kwatch sends (qXfer:features:read:target.xml) and the conversion
// between a stopped thread's registers (PTRACE_GETREGS, PTRACE_GETFPREGS) and the `g`/`p`
// bytes, little-endian, in the description's order:
//   0-15 rax rbx rcx rdx rsi rdi rbp rsp r8-r15, 16 rip, 17 eflags, 18-23 cs ss ds es fs gs,
//   24-31 st0-st7 (80 bits), 32-39 fctrl fstat ftag fiseg fioff foseg fooff fop,
//   40-55 xmm0-xmm15, 56 mxcsr, 57 orig_rax, 58 fs_base, 59 gs_base.

#include <sys/types.h>
#include <sys/user.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kwatch::watch::gdb {

inline constexpr int kNumRegisters = 60;
inline constexpr int kRipRegister = 16;

// The target description (XML), architecture i386:x86-64, OS ABI GNU/Linux.
const std::string& Amd64TargetXml();

// Size in bytes of register `regno`; 0 for an unknown number.
size_t RegisterSize(int regno);

// A stopped thread's registers.
struct ThreadRegisters {
  user_regs_struct gp{};
  user_fpregs_struct fp{};

  // Reads both sets (ptrace). Errors name the request and the thread.
  static absl::StatusOr<ThreadRegisters> Read(pid_t tid);
  absl::Status Write(pid_t tid) const;

  // Every register, in order (the `g` reply's bytes).
  std::vector<uint8_t> All() const;
  // Sets every register from `bytes` (a `G` packet's): InvalidArgument unless it holds
  // exactly every register.
  absl::Status SetAll(std::span<const uint8_t> bytes);
  // One register's bytes; InvalidArgument for an unknown number.
  absl::StatusOr<std::vector<uint8_t>> Get(int regno) const;
  // InvalidArgument for an unknown number or a size other than the register's.
  absl::Status Set(int regno, std::span<const uint8_t> bytes);
};

}  // namespace kwatch::watch::gdb
