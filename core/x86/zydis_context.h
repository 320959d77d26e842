#pragma once

#include <Zydis/Zydis.h>
#include <sys/user.h>

#include <cstdint>
#include <optional>

namespace kwatch::core::x86 {

// Fills a Zydis register context from a tracee's registers (64-bit registers, RIP, and the
// 32-bit halves used by addr32 forms), for ZydisCalcAbsoluteAddressEx.
void FillZydisContext(const user_regs_struct& r, ZydisRegisterContext& ctx);

// Where a general-purpose register operand lives in user_regs_struct.
struct GprSlot {
  unsigned long long user_regs_struct::*field = nullptr;  // NOLINT(google-runtime-int)
  uint32_t bits = 0;                                      // 8, 16, 32 or 64
  uint32_t shift = 0;                                     // 8 for AH, BH, CH and DH, else 0
};

// The slot of a general-purpose register (any width); nullopt for any other register
// (segment, control, rip, vector...).
std::optional<GprSlot> ResolveGpr(ZydisRegister reg);

// The register's bits (zero-extended): e.g. bits 8..15 of rax for AH.
inline uint64_t ReadGpr(const user_regs_struct& regs, const GprSlot& slot) {
  const uint64_t v = regs.*slot.field >> slot.shift;
  return slot.bits >= 64 ? v : v & ((uint64_t{1} << slot.bits) - 1);
}

}  // namespace kwatch::core::x86
