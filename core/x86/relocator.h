#pragma once

// Moving whole x86-64 instructions from one address to another (a jump probe's trampoline runs
// the instructions its jmp overwrote; an INT3 probe's out-of-line slot runs the one under the
// INT3): RIP-relative operands rebased, relative branches rewritten to reach the same targets,
// and a refusal, naming the instruction and why, for what cannot move. Pure functions over
// bytes and addresses (absolute addresses of the target, never dereferenced). Thread-safe.

#include <Zydis/Zydis.h>

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/base/remote_addr.h"

namespace kwatch::core::x86 {

// How an instruction passes control on.
enum class InsnFlow : uint8_t {
  kNext,          // to the next instruction only (including syscall, int $0x80)
  kJump,          // jmp rel8/rel32
  kCondJump,      // jcc rel8/rel32, jrcxz/jecxz, loop/loope/loopne
  kCall,          // call rel32
  kIndirectJump,  // jmp *reg / jmp *mem (a jump table, a computed goto, a tail call)
  kIndirectCall,  // call *reg / call *mem
  kReturn,        // ret, ret $imm16
  kStop,          // never continues here: ud0/ud1/ud2, hlt, int3, far branches and returns
};

// One decoded instruction and what relocation and flow analysis need of it.
struct X86Insn {
  RemoteAddr addr;  // absolute, where it is
  uint8_t length = 0;
  std::array<uint8_t, 15> bytes{};  // the first `length` are its bytes
  InsnFlow flow = InsnFlow::kNext;
  std::optional<RemoteAddr> branch_target;  // relative jmp/jcc/jrcxz/loop/call: absolute
  std::optional<RemoteAddr> rip_target;     // a RIP-relative memory operand: absolute
  ZydisDecodedInstruction insn{};
  std::array<ZydisDecodedOperand, ZYDIS_MAX_OPERAND_COUNT> operands{};

  RemoteAddr next() const { return addr + length; }
  // AT&T text as objdump prints it (core/x86/format.h).
  std::string Text() const;
};

// Decodes the instruction at the start of `code` (its bytes at `addr`). InvalidArgument naming
// the address and bytes when they do not decode as an x86-64 instruction.
absl::StatusOr<X86Insn> DecodeX86(std::span<const uint8_t> code, RemoteAddr addr);

// Why `insn` must run nowhere but where it is, "" when it may run elsewhere (in an out-of-line
// slot or a trampoline) as it is or rewritten: int3/int $3/int1, ud0/ud1/ud2, privilege
// transfers, privileged instructions, far branches, xbegin, EIP-relative operands.
std::string WhyCannotDisplace(const ZydisDecodedInstruction& insn,
                              std::span<const ZydisDecodedOperand> visible_operands);

// Whether a rel32/disp32 field of an instruction ending at `next` reaches `target`.
bool Rel32Reaches(RemoteAddr next, RemoteAddr target);

// Appends to `out` (whose first byte will be at `base`) a jump to `target`: jmp rel32 (5 bytes)
// when it reaches, else jmp *0(%rip) followed by the absolute address (14 bytes).
void AppendJump(std::vector<uint8_t>& out, RemoteAddr base, RemoteAddr target);

// What a relocated call leaves as its return address.
enum class CallMode : uint8_t {
  // push the original successor, then jmp to the target: the callee returns to the original
  // code, whose unwind tables (C++ exceptions, backtraces, kwatch's unwinder) describe the
  // frame. The call must end the relocated range (its successor is then original code that
  // stays). Not under CET shadow stacks (the callee's ret would not match).
  kPushReturn,
  // call from the copy: the callee returns into the copy, which goes on and jumps back. Works
  // under shadow stacks; an unwinder sees a return address with no unwind table.
  kCallFromCopy,
};

struct RelocatedInsn {
  RemoteAddr from;  // the original instruction
  uint8_t length = 0;
  uint32_t out_offset = 0;  // its relocated form in Relocation::code
  uint32_t out_length = 0;
  std::string text;  // AT&T text of the original
};

struct Relocation {
  RemoteAddr from;
  RemoteAddr to;
  uint32_t length = 0;        // bytes taken at `from`
  std::vector<uint8_t> code;  // to be written at `to`
  std::vector<RelocatedInsn> insns;
  // The relocated code may run off its end (then it must continue at from + length): false
  // when it ends in jmp, ret, jmp * or a kPushReturn call.
  bool falls_through = true;
};

// Relocates the instructions of `code` (whole instructions; the last must end exactly at its
// end) from `from` to `to`:
//  - a RIP-relative memory operand keeps its absolute target (disp32 rebased);
//  - jmp/jcc become rel32 forms (jmp *0(%rip) + address, or the inverse jcc over it, when rel32
//    does not reach), jrcxz/jecxz/loop* a short sequence, call rel32 and call * as `mode` says;
//  - a branch to `from` itself goes to the original `from`.
// InvalidArgument, naming the instruction and its address, for: bytes that do not decode, an
// instruction crossing the end, WhyCannotDisplace's list, xabort/xend (transactional code),
// 16-bit branches, a relative branch into (from, from + length), with kPushReturn a call that
// does not end the range (it would return into it) or an indirect call through %rsp.
// OutOfRange when a RIP-relative operand's target is beyond +-2 GiB of its new place.
absl::StatusOr<Relocation> Relocate(std::span<const uint8_t> code, RemoteAddr from, RemoteAddr to,
                                    CallMode mode = CallMode::kPushReturn);

// The longest relocated form of one instruction (a call through a slot with kPushReturn is
// 13 + 15 bytes; a far jcc 16): callers size buffers with it.
inline constexpr uint32_t kMaxRelocatedInsnBytes = 32;

}  // namespace kwatch::core::x86
