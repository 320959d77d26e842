#pragma once

// x86-64 register names of the probe argument syntax and DWARF register numbers, mapped
// onto <sys/user.h>'s user_regs_struct (what PTRACE_GETREGS returns).

#include <sys/user.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace kwatch::core::probe {

// A general-purpose register or a part of one, as a probe argument names it (without '%').
struct X86Register {
  const char* name;  // "di", "rdi", "edi", "r8d", "ip", "flags"...
  size_t offset;     // byte offset of the 64-bit slot in user_regs_struct
  uint8_t bytes;     // 8, or 4 for the 32-bit names (the low half)
};

// The register called `name` (kprobe names such as "di", "ax", "ip", "sp", "flags", the
// 64-bit names "rdi", "rax", "rip", "r8".."r15", and the 32-bit names "edi", "eax",
// "r8d".."r15d"); nullopt for anything else. Case-sensitive, as in kprobe_events.
std::optional<X86Register> FindX86Register(absl::string_view name);

// Every accepted name, for messages.
std::vector<std::string> X86RegisterNames();

// The 64-bit value of a register slot.
uint64_t RegisterValue(const user_regs_struct& regs, size_t offset);

// user_regs_struct offset of DWARF x86-64 register `regno` (0 rax, 1 rdx, 2 rcx, 3 rbx,
// 4 rsi, 5 rdi, 6 rbp, 7 rsp, 8-15 r8-r15, 16 return address = rip, 49 rflags, 50-55
// es cs ss ds fs gs, 58 fs.base, 59 gs.base); nullopt for the others.
std::optional<size_t> DwarfRegisterOffset(int regno);

// DWARF numbers 17-32 are %xmm0-%xmm15: the index, or nullopt.
std::optional<int> DwarfXmmIndex(int regno);

// Name of a DWARF register for messages ("rdi", "xmm0", "reg57").
std::string DwarfRegisterName(int regno);

}  // namespace kwatch::core::probe
