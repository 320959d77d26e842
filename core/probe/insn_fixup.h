#pragma once

// The instruction under an INT3 probe: decoding, the refusal of what cannot run safely
// anywhere else, and its out-of-line (XOL) copy with RIP-relative displacements fixed up.

#include <Zydis/Zydis.h>

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/base/remote_addr.h"

namespace kwatch::core::probe {

// What kwatch does with a probed instruction's semantics.
enum class InsnKind : uint8_t {
  kNop,           // nop (any form), endbr64/endbr32
  kMovRegReg,     // mov r64/r32, r64/r32
  kMovRegImm,     // mov r64/r32, imm
  kLea,           // lea r64/r32, [mem]
  kAddSubImm,     // add/sub r64/r32, imm (flags computed)
  kJmpRel,        // jmp rel8/rel32
  kJcc,           // jcc rel8/rel32, jrcxz/jecxz, loop/loope/loopne
  kCallRel,       // call rel32
  kCallIndirect,  // call *reg / call *mem
  kJmpIndirect,   // jmp *reg / jmp *mem
  kRet,           // ret, ret imm16
  kPush,          // push r64
  kPop,           // pop r64
  kOther,         // anything else that may run out of line
};

// A decoded probed instruction and the ways it may be executed.
struct ProbedInsn {
  RemoteAddr addr;  // where it lives in the target
  uint8_t length = 0;
  std::array<uint8_t, 15> bytes{};  // its original bytes (the first `length`)
  std::string text;                 // AT&T disassembly, for messages
  InsnKind kind = InsnKind::kOther;
  // kwatch can compute its effect (InsnKind other than kOther).
  bool can_emulate = false;
  // A copy elsewhere behaves the same (not for relative branches, calls and ret).
  bool can_run_out_of_line = false;
  // Emulating it reads or writes target memory (call, ret, push, pop, indirect via memory).
  bool emulation_touches_memory = false;
  // An out-of-line copy reaches its end (false for jmp *: it never falls through).
  bool falls_through = true;
  // Offset of a RIP-relative disp32 in the instruction (0 when none).
  uint8_t rip_disp_offset = 0;
  ZydisDecodedInstruction insn{};
  std::array<ZydisDecodedOperand, ZYDIS_MAX_OPERAND_COUNT> operands{};

  // Cheapest by default: emulation when it needs no target memory access (or when the
  // instruction cannot run out of line), else out of line (no system call needed).
  bool PreferEmulation() const {
    return can_emulate && (!emulation_touches_memory || !can_run_out_of_line);
  }
};

// Decodes the instruction at the start of `code` (up to 15 bytes, the original bytes at
// `addr`) and classifies it. InvalidArgument, naming the address and the instruction, for
// what a probe must not displace: undecodable bytes, int3/int $3/int1 (kwatch's own trap, or
// a debugger's), ud0/ud1/ud2 (they fault by design), privileged instructions, far branches,
// iret, sysenter/sysexit/sysret, xbegin, and relative branches kwatch cannot emulate.
absl::StatusOr<ProbedInsn> AnalyzeProbedInsn(std::span<const uint8_t> code, RemoteAddr addr);

// OK when `addr` starts an instruction of the function whose code (from its first byte at
// `function_start`) is `function_code`, decoding linearly; InvalidArgument otherwise, naming
// the instruction that covers `addr`.
absl::Status CheckInstructionBoundary(std::span<const uint8_t> function_code,
                                      RemoteAddr function_start, RemoteAddr addr);

// What follows the copy of the instruction in an out-of-line slot.
enum class XolTail : uint8_t {
  kJumpBack,  // a jump to addr + length: the thread goes on without stopping again
  kTrap,      // an INT3: kwatch stops the thread again (post handlers), then sets rip
};

// The bytes of an out-of-line slot at `slot` for `insn`: the instruction with its RIP-relative
// displacement rebased (same target from the new address), then the tail. The jump back is a
// rel32 jmp when addr + length is within reach, else `jmp *0(%rip)` with an absolute address.
// OutOfRange when a RIP-relative target is beyond +-2 GiB of `slot`; FailedPrecondition when
// the instruction cannot run out of line. At most kMaxXolCopyBytes bytes.
absl::StatusOr<std::vector<uint8_t>> BuildOutOfLineCopy(const ProbedInsn& insn, RemoteAddr slot,
                                                        XolTail tail);
inline constexpr size_t kMaxXolCopyBytes = 15 + 14;

// Whether an instruction of `length` bytes at `slot` can reach `target` through a RIP-relative
// disp32 (target - (slot + length) fits in 32 signed bits).
bool RipRelativeReaches(RemoteAddr slot, uint8_t length, RemoteAddr target);

// The absolute target of the RIP-relative operand of `insn` (at insn.addr); 0 when none.
RemoteAddr RipRelativeTarget(const ProbedInsn& insn);

}  // namespace kwatch::core::probe
