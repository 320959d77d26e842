#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kwatch::core::kernel {

// Kernel variables found through the code of a function that reads them, for kernels whose
// kallsyms lists no data symbols (no CONFIG_KALLSYMS_ALL) and that come without System.map or
// vmlinux: the function's text is read (through BPF: bpf_kernel_reader.h), decoded (Zydis),
// and the RIP-relative operand of its load is the variable's address. Never a guess: the
// instruction must be what the table (or the user's --via) says, or the resolution is refused
// with what was found.

// One known accessor: `variable` is loaded by the first instruction of `function` that has a
// RIP-relative memory operand, a `mov` of `size` bytes into a register.
struct KnownAccessor {
  absl::string_view variable;
  absl::string_view function;
  absl::string_view type_name;  // the variable's C type
  uint32_t size = 0;
};

// The table: jiffies and jiffies_64 (one variable on x86-64) through jiffies_read, the
// jiffies clocksource's read function.
std::span<const KnownAccessor> KnownAccessors();
const KnownAccessor* FindKnownAccessor(absl::string_view variable);

// A RIP-relative memory operand of an instruction of the accessor.
struct RipOperand {
  uint64_t offset = 0;  // of the instruction from the function's start
  uint64_t target = 0;  // the absolute address it names
  uint32_t size = 0;    // the operand's size in bytes
  bool load = false;    // a mov from memory into a general-purpose register
  std::string text;     // the instruction, AT&T ("mov 0x1be3314(%rip),%rax")
};

// Decodes `code` (the function's first bytes, at kernel address `start`) up to its first
// return or unconditional jump, and returns every RIP-relative memory operand in order.
// InvalidArgument when the bytes do not decode.
absl::StatusOr<std::vector<RipOperand>> RipOperands(uint64_t start, std::span<const uint8_t> code);

// "FUNC" or "FUNC+OFF" (OFF decimal or 0x hex), as --via takes it.
struct ViaSpec {
  std::string function;
  std::optional<uint64_t> offset;
};
absl::StatusOr<ViaSpec> ParseVia(absl::string_view text);

// Picks the operand of `operands` (decoded from `function`) that names the variable: at
// `offset` when given; else the only one; for a known accessor, the first, which must be a
// load of `known->size` bytes. FailedPrecondition when none fits or several could: the
// message lists each operand with its offset (and asks for FUNC+OFF).
absl::StatusOr<RipOperand> PickOperand(absl::string_view variable, absl::string_view function,
                                       const std::vector<RipOperand>& operands,
                                       std::optional<uint64_t> offset, const KnownAccessor* known);

// Whether `code` starts with a rep-prefixed string instruction (rep movs, rep stos...): the
// kind that traps once per iteration on a data breakpoint. nullopt when it does not decode.
std::optional<bool> IsRepString(std::span<const uint8_t> code);

}  // namespace kwatch::core::kernel
