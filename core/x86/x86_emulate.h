#pragma once

#include <sys/user.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <span>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kwatch::core::x86 {

// Memory access callbacks of the emulator. Addresses are absolute in the target (segment base
// included); typically backed by /proc/PID/mem, which ignores page protections. Each callback
// transfers exactly `out.size()` / `data.size()` bytes (1, 2, 4 or 8) or returns an error.
struct EmulatorMemory {
  std::function<absl::Status(uint64_t addr, std::span<uint8_t> out)> read;
  std::function<absl::Status(uint64_t addr, std::span<const uint8_t> data)> write;
};

// What an emulated instruction did to memory.
struct EmulatedAccess {
  uint64_t addr = 0;   // absolute address accessed (fs/gs base included)
  uint32_t size = 0;   // bytes accessed: 1, 2, 4 or 8
  bool write = false;  // a store (else a load)
  uint8_t length = 0;  // instruction length in bytes; regs.rip has been advanced by it
};

// Emulates the x86-64 instruction at `regs.rip` (its bytes in `code`, up to 15; more are
// ignored) when it is a plain data move with one memory operand:
//   MOV r/m, reg (88, 89; AH..DH included), MOV r/m, imm (C6 /0, C7 /0; imm32 sign-extended
//   in the 64-bit form), MOV reg, r/m (8A, 8B), MOV moffs (A0..A3), and the loads MOVZX,
//   MOVSX and MOVSXD.
// The effective address is computed from `regs` before the instruction (addr32 forms wrap at
// 4 GiB; an fs/gs override adds regs.fs_base / regs.gs_base). On success the memory access is
// done through `mem`, the destination register is written with x86-64 rules (a 32-bit
// destination zero-extends, 8/16-bit destinations keep the other bits, AH..DH are bits 8..15),
// flags are left alone and regs.rip advances by the instruction length.
//
// Returns std::nullopt, with `regs` unchanged and no callback made, for anything else: bytes
// that do not decode, other instructions, register-only moves, LOCK/REP/XACQUIRE/XRELEASE
// (F0/F2/F3) prefixes, cs/ds/es/ss segment prefixes, segment or control registers. The caller
// then falls back to single-stepping. Returns the callback's error when a memory access
// fails; `regs` is unchanged then as well (and a failed load wrote nothing).
absl::StatusOr<std::optional<EmulatedAccess>> EmulateDataMove(std::span<const uint8_t> code,
                                                              user_regs_struct& regs,
                                                              const EmulatorMemory& mem);

}  // namespace kwatch::core::x86
