#include "core/probe/x86_regs.h"

#include <array>
#include <cstddef>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace kwatch::core::probe {
namespace {

#define KW_REG(name, field, bytes)                 \
  X86Register {                                    \
    name, offsetof(user_regs_struct, field), bytes \
  }

constexpr std::array kRegisters = {
    // kprobe_events names (arch/x86 pt_regs).
    KW_REG("ax", rax, 8),
    KW_REG("bx", rbx, 8),
    KW_REG("cx", rcx, 8),
    KW_REG("dx", rdx, 8),
    KW_REG("si", rsi, 8),
    KW_REG("di", rdi, 8),
    KW_REG("bp", rbp, 8),
    KW_REG("sp", rsp, 8),
    KW_REG("ip", rip, 8),
    KW_REG("flags", eflags, 8),
    KW_REG("orig_ax", orig_rax, 8),
    KW_REG("cs", cs, 8),
    KW_REG("ss", ss, 8),
    KW_REG("ds", ds, 8),
    KW_REG("es", es, 8),
    KW_REG("fs", fs, 8),
    KW_REG("gs", gs, 8),
    KW_REG("fs_base", fs_base, 8),
    KW_REG("gs_base", gs_base, 8),
    // 64-bit names.
    KW_REG("rax", rax, 8),
    KW_REG("rbx", rbx, 8),
    KW_REG("rcx", rcx, 8),
    KW_REG("rdx", rdx, 8),
    KW_REG("rsi", rsi, 8),
    KW_REG("rdi", rdi, 8),
    KW_REG("rbp", rbp, 8),
    KW_REG("rsp", rsp, 8),
    KW_REG("rip", rip, 8),
    KW_REG("rflags", eflags, 8),
    KW_REG("orig_rax", orig_rax, 8),
    KW_REG("r8", r8, 8),
    KW_REG("r9", r9, 8),
    KW_REG("r10", r10, 8),
    KW_REG("r11", r11, 8),
    KW_REG("r12", r12, 8),
    KW_REG("r13", r13, 8),
    KW_REG("r14", r14, 8),
    KW_REG("r15", r15, 8),
    // 32-bit names: the low half.
    KW_REG("eax", rax, 4),
    KW_REG("ebx", rbx, 4),
    KW_REG("ecx", rcx, 4),
    KW_REG("edx", rdx, 4),
    KW_REG("esi", rsi, 4),
    KW_REG("edi", rdi, 4),
    KW_REG("ebp", rbp, 4),
    KW_REG("esp", rsp, 4),
    KW_REG("eip", rip, 4),
    KW_REG("eflags", eflags, 4),
    KW_REG("r8d", r8, 4),
    KW_REG("r9d", r9, 4),
    KW_REG("r10d", r10, 4),
    KW_REG("r11d", r11, 4),
    KW_REG("r12d", r12, 4),
    KW_REG("r13d", r13, 4),
    KW_REG("r14d", r14, 4),
    KW_REG("r15d", r15, 4),
};

#undef KW_REG

// DWARF x86-64 numbering (System V psABI, figure 3.36): 0-16.
constexpr std::array<size_t, 17> kDwarfGpr = {
    offsetof(user_regs_struct, rax), offsetof(user_regs_struct, rdx),
    offsetof(user_regs_struct, rcx), offsetof(user_regs_struct, rbx),
    offsetof(user_regs_struct, rsi), offsetof(user_regs_struct, rdi),
    offsetof(user_regs_struct, rbp), offsetof(user_regs_struct, rsp),
    offsetof(user_regs_struct, r8),  offsetof(user_regs_struct, r9),
    offsetof(user_regs_struct, r10), offsetof(user_regs_struct, r11),
    offsetof(user_regs_struct, r12), offsetof(user_regs_struct, r13),
    offsetof(user_regs_struct, r14), offsetof(user_regs_struct, r15),
    offsetof(user_regs_struct, rip),
};

constexpr std::array<const char*, 17> kDwarfGprNames = {
    "rax", "rdx", "rcx", "rbx", "rsi", "rdi", "rbp", "rsp", "r8",
    "r9",  "r10", "r11", "r12", "r13", "r14", "r15", "rip",
};

}  // namespace

std::optional<X86Register> FindX86Register(absl::string_view name) {
  for (const X86Register& r : kRegisters) {
    if (name == r.name) {
      return r;
    }
  }
  return std::nullopt;
}

std::vector<std::string> X86RegisterNames() {
  std::vector<std::string> out;
  out.reserve(kRegisters.size());
  for (const X86Register& r : kRegisters) {
    out.emplace_back(r.name);
  }
  return out;
}

uint64_t RegisterValue(const user_regs_struct& regs, size_t offset) {
  uint64_t v = 0;
  std::memcpy(&v, reinterpret_cast<const char*>(&regs) + offset, sizeof(v));
  return v;
}

std::optional<size_t> DwarfRegisterOffset(int regno) {
  if (regno >= 0 && regno < static_cast<int>(kDwarfGpr.size())) {
    return kDwarfGpr[static_cast<size_t>(regno)];
  }
  switch (regno) {
    case 49:
      return offsetof(user_regs_struct, eflags);
    case 50:
      return offsetof(user_regs_struct, es);
    case 51:
      return offsetof(user_regs_struct, cs);
    case 52:
      return offsetof(user_regs_struct, ss);
    case 53:
      return offsetof(user_regs_struct, ds);
    case 54:
      return offsetof(user_regs_struct, fs);
    case 55:
      return offsetof(user_regs_struct, gs);
    case 58:
      return offsetof(user_regs_struct, fs_base);
    case 59:
      return offsetof(user_regs_struct, gs_base);
    default:
      return std::nullopt;
  }
}

std::optional<int> DwarfXmmIndex(int regno) {
  if (regno >= 17 && regno <= 32) {
    return regno - 17;
  }
  return std::nullopt;
}

std::string DwarfRegisterName(int regno) {
  if (regno >= 0 && regno < static_cast<int>(kDwarfGprNames.size())) {
    return kDwarfGprNames[static_cast<size_t>(regno)];
  }
  if (const std::optional<int> xmm = DwarfXmmIndex(regno); xmm.has_value()) {
    return absl::StrCat("xmm", *xmm);
  }
  return absl::StrCat("reg", regno);
}

}  // namespace kwatch::core::probe
