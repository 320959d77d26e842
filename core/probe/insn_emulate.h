#pragma once

// Emulation of a probed instruction on a stopped thread's registers, so that the thread goes
// on from the instruction's successor without executing it (and without a second stop).

#include <sys/user.h>

#include "absl/status/status.h"
#include "core/probe/insn_fixup.h"
#include "core/x86/x86_emulate.h"

namespace kwatch::core::probe {

// Applies `insn` (insn.can_emulate; insn.addr == regs.rip) to `regs`:
//  - nop/endbr: nothing; mov/lea/add/sub: the destination register (32-bit destinations
//    zero-extend; add/sub set CF PF AF ZF SF OF in eflags as the CPU does);
//  - jmp/jcc/jrcxz/loop*: the condition from eflags (and rcx), loop* decrement rcx;
//  - call: pushes addr + length through `mem`; ret [imm16]: pops the return address;
//  - jmp/call indirect: the target from the register or the 8 bytes at the memory operand
//    (fs/gs bases added); push/pop r64 through `mem`.
// Then rip is where the CPU would go next. On error (a memory callback failed; a Status
// naming the access) `regs` is unchanged and nothing was written.
absl::Status EmulateProbedInsn(const ProbedInsn& insn, user_regs_struct& regs,
                               const x86::EmulatorMemory& mem);

// Whether the conditional branch `insn` (InsnKind::kJcc) is taken with `regs` (loop* as if
// rcx had already been decremented). Exposed for tests.
bool ConditionHolds(const ProbedInsn& insn, const user_regs_struct& regs);

}  // namespace kwatch::core::probe
