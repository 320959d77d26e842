#pragma once

#include <sys/user.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kwatch::core::x86 {

// A memory operand of a decoded instruction, with its effective address computed from the
// registers at the instruction (before it executes).
struct MemoryOperand {
  uint64_t addr = 0;  // absolute effective address (segment base included for fs/gs)
  uint32_t size = 0;  // bytes accessed
  bool read = false;
  bool write = false;
};

// One decoded x86-64 instruction and the memory it touches.
struct DecodedAccess {
  uint8_t length = 0;
  std::string text;                   // AT&T syntax, e.g. "movq %rax, 0x2f0e(%rip)"
  std::vector<MemoryOperand> memory;  // explicit and implicit (push, pop, movs...) operands
};

// Decodes the instruction at `rip` from `code` (up to 15 bytes read at rip) with Zydis and
// computes the effective address of each memory operand from `regs` (the registers at the
// instruction, i.e. before it runs: as at a page fault). InvalidArgument when the bytes do
// not decode. Operands whose address Zydis cannot compute (gathers) are left out.
absl::StatusOr<DecodedAccess> DecodeAccess(std::span<const uint8_t> code, uint64_t rip,
                                           const user_regs_struct& regs);

}  // namespace kwatch::core::x86
