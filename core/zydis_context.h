#pragma once

#include <Zydis/Zydis.h>
#include <sys/user.h>

namespace kwatch::core {

// Fills a Zydis register context from a tracee's registers (64-bit registers, RIP, and the
// 32-bit halves used by addr32 forms), for ZydisCalcAbsoluteAddressEx.
void FillZydisContext(const user_regs_struct& r, ZydisRegisterContext& ctx);

}  // namespace kwatch::core
