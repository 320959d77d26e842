#include "core/x86_emulate.h"

#include <Zydis/Zydis.h>

#include <algorithm>
#include <array>

#include "core/zydis_context.h"

namespace kwatch::core {

namespace {

constexpr ZydisMachineMode kMode = ZYDIS_MACHINE_MODE_LONG_64;

using RegField = unsigned long long user_regs_struct::*;  // NOLINT(google-runtime-int)

// Where a general-purpose register operand lives in user_regs_struct.
struct GprSlot {
  RegField field = nullptr;
  uint32_t bits = 0;   // 8, 16, 32 or 64
  uint32_t shift = 0;  // 8 for AH, BH, CH and DH, else 0
};

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

// The slot of a general-purpose register; nullopt for any other register (segment, control,
// rip, vector...).
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
  const std::optional<RegField> field = FieldOf(ZydisRegisterGetLargestEnclosing(kMode, reg));
  if (!field.has_value()) {
    return std::nullopt;
  }
  const bool high_byte = reg == ZYDIS_REGISTER_AH || reg == ZYDIS_REGISTER_BH ||
                         reg == ZYDIS_REGISTER_CH || reg == ZYDIS_REGISTER_DH;
  return GprSlot{*field, bits, high_byte ? 8U : 0U};
}

uint64_t LowBits(uint64_t v, uint32_t bits) {
  return bits >= 64 ? v : v & ((uint64_t{1} << bits) - 1);
}

uint64_t SignExtend(uint64_t v, uint32_t bits) {
  if (bits >= 64) {
    return v;
  }
  const uint64_t sign = uint64_t{1} << (bits - 1);
  return (LowBits(v, bits) ^ sign) - sign;
}

uint64_t ReadGpr(const user_regs_struct& regs, const GprSlot& slot) {
  return LowBits(regs.*slot.field >> slot.shift, slot.bits);
}

// x86-64 register write rules: a 32-bit write zero-extends, 8/16-bit writes keep the rest.
void WriteGpr(user_regs_struct& regs, const GprSlot& slot, uint64_t value) {
  auto& reg = regs.*slot.field;
  switch (slot.bits) {
    case 64:
      reg = value;
      break;
    case 32:
      reg = LowBits(value, 32);
      break;
    default: {
      const uint64_t mask = LowBits(~uint64_t{0}, slot.bits) << slot.shift;
      reg = (reg & ~mask) | ((value << slot.shift) & mask);
      break;
    }
  }
}

// F0 (lock), F2/F3 (rep, xacquire, xrelease, bnd) and the cs/ss/ds/es overrides.
bool HasRefusedPrefix(const ZydisDecodedInstruction& insn) {
  for (int i = 0; i < insn.raw.prefix_count; ++i) {
    switch (insn.raw.prefixes[i].value) {
      case 0xf0:
      case 0xf2:
      case 0xf3:
      case 0x26:
      case 0x2e:
      case 0x36:
      case 0x3e:
        return true;
      default:
        break;
    }
  }
  return false;
}

// The absolute address of a plain memory operand; nullopt for segments other than the
// default ds/ss and fs/gs, or when Zydis cannot compute it.
std::optional<uint64_t> EffectiveAddress(const ZydisDecodedInstruction& insn,
                                         const ZydisDecodedOperand& op,
                                         const user_regs_struct& regs) {
  uint64_t segment_base = 0;
  switch (op.mem.segment) {
    case ZYDIS_REGISTER_DS:
    case ZYDIS_REGISTER_SS:
    case ZYDIS_REGISTER_NONE:
      break;
    case ZYDIS_REGISTER_FS:
      segment_base = regs.fs_base;
      break;
    case ZYDIS_REGISTER_GS:
      segment_base = regs.gs_base;
      break;
    default:
      return std::nullopt;
  }
  ZydisRegisterContext ctx{};
  FillZydisContext(regs, ctx);
  uint64_t ea = 0;
  if (!ZYAN_SUCCESS(ZydisCalcAbsoluteAddressEx(&insn, &op, regs.rip, &ctx, &ea))) {
    return std::nullopt;
  }
  if (insn.address_width == 32) {
    ea = LowBits(ea, 32);  // the offset wraps before the segment base is added
  }
  return segment_base + ea;
}

}  // namespace

absl::StatusOr<std::optional<EmulatedAccess>> EmulateDataMove(std::span<const uint8_t> code,
                                                              user_regs_struct& regs,
                                                              const EmulatorMemory& mem) {
  ZydisDecoder decoder;
  ZydisDecoderInit(&decoder, kMode, ZYDIS_STACK_WIDTH_64);
  ZydisDecodedInstruction insn;
  std::array<ZydisDecodedOperand, ZYDIS_MAX_OPERAND_COUNT> ops{};
  const size_t avail = std::min<size_t>(code.size(), ZYDIS_MAX_INSTRUCTION_LENGTH);
  if (!ZYAN_SUCCESS(ZydisDecoderDecodeFull(&decoder, code.data(), avail, &insn, ops.data()))) {
    return std::nullopt;
  }
  const ZydisMnemonic mn = insn.mnemonic;
  const bool is_mov = mn == ZYDIS_MNEMONIC_MOV;
  const bool is_load_ext =
      mn == ZYDIS_MNEMONIC_MOVZX || mn == ZYDIS_MNEMONIC_MOVSX || mn == ZYDIS_MNEMONIC_MOVSXD;
  if ((!is_mov && !is_load_ext) || insn.encoding != ZYDIS_INSTRUCTION_ENCODING_LEGACY ||
      insn.operand_count != 2 || HasRefusedPrefix(insn)) {
    return std::nullopt;
  }
  // Exactly one plain memory operand: the destination (store) or the source (load).
  const ZydisDecodedOperand& dst = ops[0];
  const ZydisDecodedOperand& src = ops[1];
  const bool store = dst.type == ZYDIS_OPERAND_TYPE_MEMORY;
  const ZydisDecodedOperand& mem_op = store ? dst : src;
  const ZydisDecodedOperand& other = store ? src : dst;
  if (mem_op.type != ZYDIS_OPERAND_TYPE_MEMORY || mem_op.mem.type != ZYDIS_MEMOP_TYPE_MEM ||
      other.type == ZYDIS_OPERAND_TYPE_MEMORY) {
    return std::nullopt;
  }
  const uint32_t mem_bits = mem_op.size;
  if (mem_bits != 8 && mem_bits != 16 && mem_bits != 32 && mem_bits != 64) {
    return std::nullopt;
  }
  const std::optional<uint64_t> addr = EffectiveAddress(insn, mem_op, regs);
  if (!addr.has_value()) {
    return std::nullopt;
  }
  EmulatedAccess access;
  access.addr = *addr;
  access.size = mem_bits / 8;
  access.write = store;
  access.length = insn.length;
  std::array<uint8_t, 8> bytes{};
  const std::span<uint8_t> buf(bytes.data(), access.size);

  if (store) {
    if (!is_mov) {
      return std::nullopt;  // movzx/movsx never store
    }
    uint64_t value = 0;
    if (other.type == ZYDIS_OPERAND_TYPE_IMMEDIATE) {
      value = other.imm.value.u;  // Zydis sign-extends imm32 of the 64-bit form to 64 bits
    } else if (other.type == ZYDIS_OPERAND_TYPE_REGISTER) {
      const std::optional<GprSlot> slot = ResolveGpr(other.reg.value);
      if (!slot.has_value() || slot->bits != mem_bits) {
        return std::nullopt;  // mov %sreg, m16 and friends
      }
      value = ReadGpr(regs, *slot);
    } else {
      return std::nullopt;
    }
    for (size_t i = 0; i < buf.size(); ++i) {
      buf[i] = static_cast<uint8_t>(value >> (8 * i));
    }
    const absl::Status st = mem.write(access.addr, buf);
    if (!st.ok()) {
      return st;
    }
  } else {
    if (other.type != ZYDIS_OPERAND_TYPE_REGISTER) {
      return std::nullopt;
    }
    const std::optional<GprSlot> slot = ResolveGpr(other.reg.value);
    if (!slot.has_value() || (is_mov && slot->bits != mem_bits) ||
        (!is_mov && slot->bits < mem_bits)) {
      return std::nullopt;
    }
    const absl::Status st = mem.read(access.addr, buf);
    if (!st.ok()) {
      return st;
    }
    uint64_t value = 0;
    for (size_t i = 0; i < buf.size(); ++i) {
      value |= uint64_t{buf[i]} << (8 * i);
    }
    if (mn == ZYDIS_MNEMONIC_MOVSX || mn == ZYDIS_MNEMONIC_MOVSXD) {
      value = SignExtend(value, mem_bits);
    }
    WriteGpr(regs, *slot, value);
  }
  regs.rip += insn.length;
  return access;
}

}  // namespace kwatch::core
