#include "core/x86/x86_emulate.h"

#include <Zydis/Zydis.h>

#include <algorithm>
#include <array>

#include "core/x86/zydis_context.h"

namespace kwatch::core::x86 {

namespace {

constexpr ZydisMachineMode kMode = ZYDIS_MACHINE_MODE_LONG_64;

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

}  // namespace kwatch::core::x86
