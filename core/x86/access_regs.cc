#include "core/x86/access_regs.h"

#include <Zydis/Zydis.h>

#include <algorithm>
#include <array>

#include "absl/strings/str_format.h"

namespace kwatch::core::x86 {

namespace {

constexpr ZydisMachineMode kMode = ZYDIS_MACHINE_MODE_LONG_64;

uint64_t LowBytes(uint64_t v, uint32_t bytes) {
  return bytes >= 8 ? v : v & ((uint64_t{1} << (8 * bytes)) - 1);
}

bool IsMemory(const ZydisDecodedOperand& op) {
  return op.type == ZYDIS_OPERAND_TYPE_MEMORY && op.mem.type == ZYDIS_MEMOP_TYPE_MEM;
}

// The 64-bit registers the instruction writes (explicit and hidden operands).
std::array<ZydisRegister, ZYDIS_MAX_OPERAND_COUNT> WrittenRegisters(
    const ZydisDecodedInstruction& insn, const ZydisDecodedOperand* ops, size_t& count) {
  std::array<ZydisRegister, ZYDIS_MAX_OPERAND_COUNT> out{};
  count = 0;
  for (uint8_t i = 0; i < insn.operand_count; ++i) {
    const ZydisDecodedOperand& op = ops[i];
    if (op.type == ZYDIS_OPERAND_TYPE_REGISTER &&
        (op.actions & ZYDIS_OPERAND_ACTION_MASK_WRITE) != 0) {
      out[count++] = ZydisRegisterGetLargestEnclosing(kMode, op.reg.value);
    }
  }
  return out;
}

// The address part of the plan for the memory operand `op`.
void PlanAddress(const ZydisDecodedInstruction& insn, const ZydisDecodedOperand* ops,
                 const ZydisDecodedOperand& op, uint64_t ip, AccessPlan& plan) {
  if (op.mem.segment == ZYDIS_REGISTER_FS || op.mem.segment == ZYDIS_REGISTER_GS) {
    return;  // the segment base is not among the registers a sample carries
  }
  plan.addr32 = insn.address_width == 32;
  const int64_t disp = op.mem.disp.has_displacement != 0 ? op.mem.disp.value : 0;
  const ZydisRegister base = op.mem.base;
  const ZydisRegister index = op.mem.index;
  if (base == ZYDIS_REGISTER_RIP || base == ZYDIS_REGISTER_EIP) {
    if (index != ZYDIS_REGISTER_NONE) {
      return;
    }
    const uint64_t a = ip + insn.length + static_cast<uint64_t>(disp);
    plan.fixed_addr = plan.addr32 ? (a & 0xffffffffU) : a;
    plan.address = AccessPlan::Address::kFixed;
    return;
  }
  if (base == ZYDIS_REGISTER_NONE && index == ZYDIS_REGISTER_NONE) {
    const auto a = static_cast<uint64_t>(disp);
    plan.fixed_addr = plan.addr32 ? (a & 0xffffffffU) : a;
    plan.address = AccessPlan::Address::kFixed;
    return;
  }
  size_t n_written = 0;
  const auto written = WrittenRegisters(insn, ops, n_written);
  auto usable = [&](ZydisRegister reg, GprSlot& slot) {
    if (reg == ZYDIS_REGISTER_NONE) {
      return true;
    }
    const std::optional<GprSlot> s = ResolveGpr(reg);
    if (!s.has_value() || s->bits < 32) {
      return false;
    }
    const ZydisRegister full = ZydisRegisterGetLargestEnclosing(kMode, reg);
    if (std::find(written.begin(), written.begin() + static_cast<ptrdiff_t>(n_written), full) !=
        written.begin() + static_cast<ptrdiff_t>(n_written)) {
      return false;  // the register after the instruction is not the one it used
    }
    slot = *s;
    return true;
  };
  if (!usable(base, plan.base) || !usable(index, plan.index)) {
    plan.base = {};
    plan.index = {};
    return;
  }
  plan.scale = index == ZYDIS_REGISTER_NONE ? 0 : std::max<uint8_t>(op.mem.scale, 1);
  plan.disp = disp;
  plan.address = AccessPlan::Address::kFromRegisters;
}

// The value part of the plan: plain movs only.
void PlanValue(const ZydisDecodedInstruction& insn, const ZydisDecodedOperand* ops,
               AccessPlan& plan) {
  if (insn.encoding != ZYDIS_INSTRUCTION_ENCODING_LEGACY || insn.operand_count_visible != 2 ||
      plan.size == 0 || plan.size > 8) {
    return;
  }
  const ZydisMnemonic mn = insn.mnemonic;
  const bool mov = mn == ZYDIS_MNEMONIC_MOV;
  const bool store_mn = mov || mn == ZYDIS_MNEMONIC_MOVNTI;
  const bool load_ext =
      mn == ZYDIS_MNEMONIC_MOVZX || mn == ZYDIS_MNEMONIC_MOVSX || mn == ZYDIS_MNEMONIC_MOVSXD;
  const ZydisDecodedOperand& dst = ops[0];
  const ZydisDecodedOperand& src = ops[1];
  const uint32_t mem_bits = plan.size * 8;
  if (store_mn && IsMemory(dst)) {
    if (src.type == ZYDIS_OPERAND_TYPE_IMMEDIATE) {
      plan.imm = LowBytes(src.imm.value.u, plan.size);  // imm32 of the 64-bit form: sign-extended
      plan.value = AccessPlan::Value::kImmediate;
    } else if (src.type == ZYDIS_OPERAND_TYPE_REGISTER) {
      const std::optional<GprSlot> s = ResolveGpr(src.reg.value);
      if (s.has_value() && s->bits == mem_bits) {  // not mov %sreg, m16
        plan.value_reg = *s;
        plan.value = AccessPlan::Value::kRegister;
      }
    }
    return;
  }
  if ((mov || load_ext) && IsMemory(src) && dst.type == ZYDIS_OPERAND_TYPE_REGISTER) {
    const std::optional<GprSlot> s = ResolveGpr(dst.reg.value);
    // movzx/movsx/movsxd extend into a wider register: its low `size` bytes are the loaded
    // ones (a 32-bit destination zero-extends into the upper half, which is not looked at).
    if (s.has_value() && (mov ? s->bits == mem_bits : s->bits >= mem_bits)) {
      plan.value_reg = *s;
      plan.value = AccessPlan::Value::kRegister;
    }
  }
}

}  // namespace

absl::StatusOr<AccessPlan> PlanAccess(std::span<const uint8_t> code, uint64_t ip) {
  ZydisDecoder decoder;
  ZydisDecoderInit(&decoder, kMode, ZYDIS_STACK_WIDTH_64);
  ZydisDecodedInstruction insn;
  std::array<ZydisDecodedOperand, ZYDIS_MAX_OPERAND_COUNT> ops{};
  const size_t avail = std::min<size_t>(code.size(), ZYDIS_MAX_INSTRUCTION_LENGTH);
  if (!ZYAN_SUCCESS(ZydisDecoderDecodeFull(&decoder, code.data(), avail, &insn, ops.data()))) {
    return absl::InvalidArgumentError(absl::StrFormat("cannot decode an instruction at 0x%x", ip));
  }
  AccessPlan plan;
  plan.length = insn.length;
  const ZydisDecodedOperand* mem = nullptr;
  int n_mem = 0;
  for (uint8_t i = 0; i < insn.operand_count; ++i) {
    if (IsMemory(ops[i])) {
      mem = &ops[i];
      ++n_mem;
    }
  }
  if (n_mem != 1) {
    return plan;  // none, or several (push mem, movs...): which one trapped is not known
  }
  plan.size = mem->size / 8;
  plan.reads = (mem->actions & ZYDIS_OPERAND_ACTION_MASK_READ) != 0;
  plan.writes = (mem->actions & ZYDIS_OPERAND_ACTION_MASK_WRITE) != 0;
  PlanAddress(insn, ops.data(), *mem, ip, plan);
  // The value independently of the address: `mov 0x10(%rax),%rax` overwrites its base, but
  // the loaded bytes are in rax.
  PlanValue(insn, ops.data(), plan);
  return plan;
}

RegisterAccess EvaluateAccess(const AccessPlan& plan, const user_regs_struct* after) {
  RegisterAccess r;
  r.size = plan.size;
  switch (plan.address) {
    case AccessPlan::Address::kUnknown:
      break;
    case AccessPlan::Address::kFixed:
      r.addr = plan.fixed_addr;
      r.addr_known = true;
      break;
    case AccessPlan::Address::kFromRegisters: {
      if (after == nullptr) {
        break;
      }
      auto a = static_cast<uint64_t>(plan.disp);
      if (plan.base.field != nullptr) {
        a += (*after).*plan.base.field;
      }
      if (plan.index.field != nullptr) {
        a += (*after).*plan.index.field * plan.scale;
      }
      r.addr = plan.addr32 ? (a & 0xffffffffU) : a;
      r.addr_known = true;
      break;
    }
  }
  switch (plan.value) {
    case AccessPlan::Value::kNone:
      break;
    case AccessPlan::Value::kImmediate:
      r.value = plan.imm;
      r.value_known = true;
      break;
    case AccessPlan::Value::kRegister:
      if (after != nullptr) {
        r.value = LowBytes(ReadGpr(*after, plan.value_reg), plan.size);
        r.value_known = true;
      }
      break;
  }
  return r;
}

}  // namespace kwatch::core::x86
