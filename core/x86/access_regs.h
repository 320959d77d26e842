#pragma once

#include <sys/user.h>

#include <cstdint>
#include <span>

#include "absl/status/statusor.h"
#include "core/x86/zydis_context.h"

namespace kwatch::core::x86 {

// How the memory access of one instruction is recovered from the registers *after* it ran,
// as a data breakpoint reports it (the CPU traps after the access; a perf sample carries the
// user registers of that moment). Built once per accessing instruction by PlanAccess, then
// evaluated per trap by EvaluateAccess without decoding. Plain data; copyable.
struct AccessPlan {
  enum class Address : uint8_t {
    kUnknown,        // no single memory operand, an fs/gs segment, or a base/index register
                     // the instruction itself writes (`mov (%rax),%rax`, push, pop, movs...)
    kFixed,          // RIP-relative or absolute: `fixed_addr`, whatever the registers
    kFromRegisters,  // base + index * scale + disp, from registers the instruction keeps
  };
  enum class Value : uint8_t {
    kNone,       // not a plain mov: read-modify-write, xchg, cmpxchg, SIMD, string ops...
    kImmediate,  // a store of `imm`: mov $imm, mem
    kRegister,   // a store from `value_reg` (mov reg, mem), or a load into it (mov/movzx/movsx
                 // mem, reg): either way its low `size` bytes after the instruction, also
                 // when the address is unknown (the load overwrote its base)
  };

  uint8_t length = 0;   // instruction length in bytes
  uint32_t size = 0;    // bytes of the memory operand (0: none, or several operands)
  bool reads = false;   // the memory operand is read
  bool writes = false;  // ... and/or written

  Address address = Address::kUnknown;
  uint64_t fixed_addr = 0;  // kFixed
  // kFromRegisters: unset field = no such register.
  GprSlot base;
  GprSlot index;
  uint8_t scale = 0;
  int64_t disp = 0;
  bool addr32 = false;  // the effective address wraps at 4 GiB

  Value value = Value::kNone;
  uint64_t imm = 0;   // kImmediate, already truncated to `size` bytes
  GprSlot value_reg;  // kRegister
};

// Decodes the instruction at `ip` (its bytes in `code`, up to 15) and says how its access is
// recovered from the registers after it (see AccessPlan). InvalidArgument when the bytes do
// not decode.
absl::StatusOr<AccessPlan> PlanAccess(std::span<const uint8_t> code, uint64_t ip);

// An access recovered from registers.
struct RegisterAccess {
  bool addr_known = false;
  uint64_t addr = 0;  // first byte the instruction touched (absolute)
  uint32_t size = 0;  // bytes it touched
  bool value_known = false;
  uint64_t value = 0;  // the bytes [addr, addr + size) after the access, little-endian
};

// Evaluates `plan` with the registers after the instruction (`after`, nullptr when the sample
// had none: only a kFixed address and a kImmediate value are then known). The value is known
// independently of the address: `mov 0x10(%rax),%rax` has no address after it ran (its base
// is overwritten) but its value (rax); `size` is the operand's whenever the plan has one.
RegisterAccess EvaluateAccess(const AccessPlan& plan, const user_regs_struct* after);

}  // namespace kwatch::core::x86
