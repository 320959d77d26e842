#pragma once

#include <Zydis/Zydis.h>

#include <cstdint>
#include <string>

namespace kwatch::core::x86 {

// One decoded instruction as AT&T text the way objdump prints it: lowercase hex, no padding,
// RIP-relative operands as `0x2f0e(%rip)`. `ip` is the instruction's address (absolute), for
// branch targets. Empty when Zydis cannot format it. Thread-safe (no shared state).
std::string FormatAtt(const ZydisDecodedInstruction& insn, const ZydisDecodedOperand* operands,
                      uint64_t ip);

}  // namespace kwatch::core::x86
