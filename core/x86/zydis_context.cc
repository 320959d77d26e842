#include "core/x86/zydis_context.h"

namespace kwatch::core::x86 {

namespace {

uint64_t Low32(uint64_t v) {
  return v & 0xffffffffU;
}

using RegField = unsigned long long user_regs_struct::*;  // NOLINT(google-runtime-int)

std::optional<RegField> FieldOf(ZydisRegister reg64) {
  switch (reg64) {
    case ZYDIS_REGISTER_RAX:
      return &user_regs_struct::rax;
    case ZYDIS_REGISTER_RBX:
      return &user_regs_struct::rbx;
    case ZYDIS_REGISTER_RCX:
      return &user_regs_struct::rcx;
    case ZYDIS_REGISTER_RDX:
      return &user_regs_struct::rdx;
    case ZYDIS_REGISTER_RSI:
      return &user_regs_struct::rsi;
    case ZYDIS_REGISTER_RDI:
      return &user_regs_struct::rdi;
    case ZYDIS_REGISTER_RBP:
      return &user_regs_struct::rbp;
    case ZYDIS_REGISTER_RSP:
      return &user_regs_struct::rsp;
    case ZYDIS_REGISTER_R8:
      return &user_regs_struct::r8;
    case ZYDIS_REGISTER_R9:
      return &user_regs_struct::r9;
    case ZYDIS_REGISTER_R10:
      return &user_regs_struct::r10;
    case ZYDIS_REGISTER_R11:
      return &user_regs_struct::r11;
    case ZYDIS_REGISTER_R12:
      return &user_regs_struct::r12;
    case ZYDIS_REGISTER_R13:
      return &user_regs_struct::r13;
    case ZYDIS_REGISTER_R14:
      return &user_regs_struct::r14;
    case ZYDIS_REGISTER_R15:
      return &user_regs_struct::r15;
    default:
      return std::nullopt;
  }
}

}  // namespace

void FillZydisContext(const user_regs_struct& r, ZydisRegisterContext& ctx) {
  auto& v = ctx.values;
  v[ZYDIS_REGISTER_RAX] = r.rax;
  v[ZYDIS_REGISTER_RBX] = r.rbx;
  v[ZYDIS_REGISTER_RCX] = r.rcx;
  v[ZYDIS_REGISTER_RDX] = r.rdx;
  v[ZYDIS_REGISTER_RSI] = r.rsi;
  v[ZYDIS_REGISTER_RDI] = r.rdi;
  v[ZYDIS_REGISTER_RBP] = r.rbp;
  v[ZYDIS_REGISTER_RSP] = r.rsp;
  v[ZYDIS_REGISTER_R8] = r.r8;
  v[ZYDIS_REGISTER_R9] = r.r9;
  v[ZYDIS_REGISTER_R10] = r.r10;
  v[ZYDIS_REGISTER_R11] = r.r11;
  v[ZYDIS_REGISTER_R12] = r.r12;
  v[ZYDIS_REGISTER_R13] = r.r13;
  v[ZYDIS_REGISTER_R14] = r.r14;
  v[ZYDIS_REGISTER_R15] = r.r15;
  v[ZYDIS_REGISTER_RIP] = r.rip;
  // addr32 forms use the low halves.
  v[ZYDIS_REGISTER_EAX] = Low32(r.rax);
  v[ZYDIS_REGISTER_EBX] = Low32(r.rbx);
  v[ZYDIS_REGISTER_ECX] = Low32(r.rcx);
  v[ZYDIS_REGISTER_EDX] = Low32(r.rdx);
  v[ZYDIS_REGISTER_ESI] = Low32(r.rsi);
  v[ZYDIS_REGISTER_EDI] = Low32(r.rdi);
  v[ZYDIS_REGISTER_EBP] = Low32(r.rbp);
  v[ZYDIS_REGISTER_ESP] = Low32(r.rsp);
  v[ZYDIS_REGISTER_R8D] = Low32(r.r8);
  v[ZYDIS_REGISTER_R9D] = Low32(r.r9);
  v[ZYDIS_REGISTER_R10D] = Low32(r.r10);
  v[ZYDIS_REGISTER_R11D] = Low32(r.r11);
  v[ZYDIS_REGISTER_R12D] = Low32(r.r12);
  v[ZYDIS_REGISTER_R13D] = Low32(r.r13);
  v[ZYDIS_REGISTER_R14D] = Low32(r.r14);
  v[ZYDIS_REGISTER_R15D] = Low32(r.r15);
  v[ZYDIS_REGISTER_EIP] = Low32(r.rip);
}

std::optional<GprSlot> ResolveGpr(ZydisRegister reg) {
  uint32_t bits = 0;
  switch (ZydisRegisterGetClass(reg)) {
    case ZYDIS_REGCLASS_GPR8:
      bits = 8;
      break;
    case ZYDIS_REGCLASS_GPR16:
      bits = 16;
      break;
    case ZYDIS_REGCLASS_GPR32:
      bits = 32;
      break;
    case ZYDIS_REGCLASS_GPR64:
      bits = 64;
      break;
    default:
      return std::nullopt;
  }
  const std::optional<RegField> field =
      FieldOf(ZydisRegisterGetLargestEnclosing(ZYDIS_MACHINE_MODE_LONG_64, reg));
  if (!field.has_value()) {
    return std::nullopt;
  }
  const bool high_byte = reg == ZYDIS_REGISTER_AH || reg == ZYDIS_REGISTER_BH ||
                         reg == ZYDIS_REGISTER_CH || reg == ZYDIS_REGISTER_DH;
  return GprSlot{*field, bits, high_byte ? 8U : 0U};
}

}  // namespace kwatch::core::x86
