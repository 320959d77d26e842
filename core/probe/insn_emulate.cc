#include "core/probe/insn_emulate.h"

#include <array>
#include <optional>

#include "absl/strings/str_format.h"
#include "core/x86/zydis_context.h"

namespace kwatch::core::probe {

namespace {

constexpr uint64_t kCf = 1ULL << 0;
constexpr uint64_t kPf = 1ULL << 2;
constexpr uint64_t kAf = 1ULL << 4;
constexpr uint64_t kZf = 1ULL << 6;
constexpr uint64_t kSf = 1ULL << 7;
constexpr uint64_t kOf = 1ULL << 11;

uint32_t WidthOf(ZydisRegister reg) {
  return ZydisRegisterGetWidth(ZYDIS_MACHINE_MODE_LONG_64, reg);
}

uint64_t Mask(uint32_t bits) {
  return bits >= 64 ? ~uint64_t{0} : (uint64_t{1} << bits) - 1;
}

// A 32- or 64-bit GPR (classification guarantees it for the kinds that use this).
absl::StatusOr<uint64_t> ReadReg(const user_regs_struct& regs, ZydisRegister reg) {
  const std::optional<x86::GprSlot> slot = x86::ResolveGpr(reg);
  if (!slot.has_value()) {
    return absl::InternalError("not a general-purpose register");
  }
  return x86::ReadGpr(regs, *slot);
}

// x86-64 rules: a 32-bit destination zero-extends into the 64-bit register.
absl::Status WriteReg(user_regs_struct& regs, ZydisRegister reg, uint64_t value) {
  const std::optional<x86::GprSlot> slot = x86::ResolveGpr(reg);
  if (!slot.has_value() || slot->shift != 0) {
    return absl::InternalError("not a 32- or 64-bit general-purpose register");
  }
  regs.*slot->field = value & Mask(slot->bits);
  return absl::OkStatus();
}

// eflags after `a + b` (add) or `a - b` (sub) at `bits` width.
uint64_t ArithFlags(uint64_t eflags, uint64_t a, uint64_t b, uint64_t r, uint32_t bits, bool sub) {
  const uint64_t m = Mask(bits);
  a &= m;
  b &= m;
  r &= m;
  const uint64_t top = uint64_t{1} << (bits - 1);
  eflags &= ~(kCf | kPf | kAf | kZf | kSf | kOf);
  const bool cf = sub ? a < b : r < a;
  const bool of = sub ? ((a ^ b) & (a ^ r) & top) != 0 : (~(a ^ b) & (a ^ r) & top) != 0;
  if (cf) {
    eflags |= kCf;
  }
  if (__builtin_parityll(r & 0xff) == 0) {
    eflags |= kPf;
  }
  if (((a ^ b ^ r) & 0x10) != 0) {
    eflags |= kAf;
  }
  if (r == 0) {
    eflags |= kZf;
  }
  if ((r & top) != 0) {
    eflags |= kSf;
  }
  if (of) {
    eflags |= kOf;
  }
  return eflags;
}

absl::StatusOr<uint64_t> MemoryOperandAddress(const ProbedInsn& insn, const ZydisDecodedOperand& op,
                                              const user_regs_struct& regs) {
  ZydisRegisterContext ctx{};
  x86::FillZydisContext(regs, ctx);
  uint64_t ea = 0;
  if (!ZYAN_SUCCESS(ZydisCalcAbsoluteAddressEx(&insn.insn, &op, insn.addr.value, &ctx, &ea))) {
    return absl::InternalError(
        absl::StrFormat("cannot compute the operand address of '%s'", insn.text));
  }
  if (op.mem.segment == ZYDIS_REGISTER_FS) {
    ea += regs.fs_base;
  } else if (op.mem.segment == ZYDIS_REGISTER_GS) {
    ea += regs.gs_base;
  }
  return ea;
}

absl::StatusOr<uint64_t> Read64(const x86::EmulatorMemory& mem, uint64_t addr) {
  std::array<uint8_t, 8> b{};
  const absl::Status s = mem.read(addr, b);
  if (!s.ok()) {
    return s;
  }
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) {
    v = (v << 8) | b[i];
  }
  return v;
}

absl::Status Write64(const x86::EmulatorMemory& mem, uint64_t addr, uint64_t v) {
  std::array<uint8_t, 8> b{};
  for (int i = 0; i < 8; ++i) {
    b[i] = static_cast<uint8_t>(v >> (8 * i));
  }
  return mem.write(addr, b);
}

// The target of an indirect branch: a register's value or the 8 bytes at a memory operand.
absl::StatusOr<uint64_t> IndirectTarget(const ProbedInsn& insn, const user_regs_struct& regs,
                                        const x86::EmulatorMemory& mem) {
  const ZydisDecodedOperand& op = insn.operands[0];
  if (op.type == ZYDIS_OPERAND_TYPE_REGISTER) {
    return ReadReg(regs, op.reg.value);
  }
  auto ea = MemoryOperandAddress(insn, op, regs);
  if (!ea.ok()) {
    return ea.status();
  }
  return Read64(mem, *ea);
}

uint64_t RelativeTarget(const ProbedInsn& insn) {
  uint64_t target = 0;
  ZydisCalcAbsoluteAddress(&insn.insn, insn.operands.data(), insn.addr.value, &target);
  return target;
}

}  // namespace

bool ConditionHolds(const ProbedInsn& insn, const user_regs_struct& regs) {
  const uint64_t f = regs.eflags;
  const bool cf = (f & kCf) != 0;
  const bool pf = (f & kPf) != 0;
  const bool zf = (f & kZf) != 0;
  const bool sf = (f & kSf) != 0;
  const bool of = (f & kOf) != 0;
  const uint64_t count_mask = insn.insn.address_width == 32 ? 0xffffffffULL : ~uint64_t{0};
  const uint64_t rcx_after = (regs.rcx - 1) & count_mask;
  switch (insn.insn.mnemonic) {
    case ZYDIS_MNEMONIC_JO:
      return of;
    case ZYDIS_MNEMONIC_JNO:
      return !of;
    case ZYDIS_MNEMONIC_JB:
      return cf;
    case ZYDIS_MNEMONIC_JNB:
      return !cf;
    case ZYDIS_MNEMONIC_JZ:
      return zf;
    case ZYDIS_MNEMONIC_JNZ:
      return !zf;
    case ZYDIS_MNEMONIC_JBE:
      return cf || zf;
    case ZYDIS_MNEMONIC_JNBE:
      return !cf && !zf;
    case ZYDIS_MNEMONIC_JS:
      return sf;
    case ZYDIS_MNEMONIC_JNS:
      return !sf;
    case ZYDIS_MNEMONIC_JP:
      return pf;
    case ZYDIS_MNEMONIC_JNP:
      return !pf;
    case ZYDIS_MNEMONIC_JL:
      return sf != of;
    case ZYDIS_MNEMONIC_JNL:
      return sf == of;
    case ZYDIS_MNEMONIC_JLE:
      return zf || sf != of;
    case ZYDIS_MNEMONIC_JNLE:
      return !zf && sf == of;
    case ZYDIS_MNEMONIC_JRCXZ:
      return regs.rcx == 0;
    case ZYDIS_MNEMONIC_JECXZ:
      return (regs.rcx & 0xffffffffULL) == 0;
    case ZYDIS_MNEMONIC_LOOP:
      return rcx_after != 0;
    case ZYDIS_MNEMONIC_LOOPE:
      return rcx_after != 0 && zf;
    case ZYDIS_MNEMONIC_LOOPNE:
      return rcx_after != 0 && !zf;
    default:
      return false;
  }
}

absl::Status EmulateProbedInsn(const ProbedInsn& insn, user_regs_struct& regs,
                               const x86::EmulatorMemory& mem) {
  if (!insn.can_emulate) {
    return absl::FailedPreconditionError(
        absl::StrFormat("'%s' at 0x%x cannot be emulated", insn.text, insn.addr.value));
  }
  user_regs_struct r = regs;
  const uint64_t next = insn.addr.value + insn.length;
  r.rip = next;
  const ZydisDecodedOperand* ops = insn.operands.data();
  switch (insn.kind) {
    case InsnKind::kNop:
      break;
    case InsnKind::kMovRegReg: {
      auto v = ReadReg(regs, ops[1].reg.value);
      if (!v.ok()) {
        return v.status();
      }
      if (auto s = WriteReg(r, ops[0].reg.value, *v); !s.ok()) {
        return s;
      }
      break;
    }
    case InsnKind::kMovRegImm:
      if (auto s = WriteReg(r, ops[0].reg.value, ops[1].imm.value.u); !s.ok()) {
        return s;
      }
      break;
    case InsnKind::kLea: {
      auto ea = MemoryOperandAddress(insn, ops[1], regs);
      if (!ea.ok()) {
        return ea.status();
      }
      if (auto s = WriteReg(r, ops[0].reg.value, *ea); !s.ok()) {
        return s;
      }
      break;
    }
    case InsnKind::kAddSubImm: {
      const ZydisRegister dst = ops[0].reg.value;
      const uint32_t bits = WidthOf(dst);
      auto a = ReadReg(regs, dst);
      if (!a.ok()) {
        return a.status();
      }
      const uint64_t b = ops[1].imm.value.u & Mask(bits);
      const bool sub = insn.insn.mnemonic == ZYDIS_MNEMONIC_SUB;
      const uint64_t result = (sub ? *a - b : *a + b) & Mask(bits);
      r.eflags = ArithFlags(regs.eflags, *a, b, result, bits, sub);
      if (auto s = WriteReg(r, dst, result); !s.ok()) {
        return s;
      }
      break;
    }
    case InsnKind::kJmpRel:
      r.rip = RelativeTarget(insn);
      break;
    case InsnKind::kJcc: {
      const ZydisMnemonic m = insn.insn.mnemonic;
      if (m == ZYDIS_MNEMONIC_LOOP || m == ZYDIS_MNEMONIC_LOOPE || m == ZYDIS_MNEMONIC_LOOPNE) {
        if (insn.insn.address_width == 32) {
          r.rcx = (regs.rcx - 1) & 0xffffffffULL;
        } else {
          r.rcx = regs.rcx - 1;
        }
      }
      if (ConditionHolds(insn, regs)) {
        r.rip = RelativeTarget(insn);
      }
      break;
    }
    case InsnKind::kCallRel:
    case InsnKind::kCallIndirect: {
      uint64_t target = 0;
      if (insn.kind == InsnKind::kCallRel) {
        target = RelativeTarget(insn);
      } else {
        auto t = IndirectTarget(insn, regs, mem);
        if (!t.ok()) {
          return t.status();
        }
        target = *t;
      }
      r.rsp = regs.rsp - 8;
      if (auto s = Write64(mem, r.rsp, next); !s.ok()) {
        return s;
      }
      r.rip = target;
      break;
    }
    case InsnKind::kJmpIndirect: {
      auto t = IndirectTarget(insn, regs, mem);
      if (!t.ok()) {
        return t.status();
      }
      r.rip = *t;
      break;
    }
    case InsnKind::kRet: {
      auto ret = Read64(mem, regs.rsp);
      if (!ret.ok()) {
        return ret.status();
      }
      uint64_t pop = 8;
      if (insn.insn.operand_count_visible == 1 && ops[0].type == ZYDIS_OPERAND_TYPE_IMMEDIATE) {
        pop += ops[0].imm.value.u & 0xffff;
      }
      r.rsp = regs.rsp + pop;
      r.rip = *ret;
      break;
    }
    case InsnKind::kPush: {
      auto v = ReadReg(regs, ops[0].reg.value);  // push %rsp pushes the old value
      if (!v.ok()) {
        return v.status();
      }
      r.rsp = regs.rsp - 8;
      if (auto s = Write64(mem, r.rsp, *v); !s.ok()) {
        return s;
      }
      break;
    }
    case InsnKind::kPop: {
      auto v = Read64(mem, regs.rsp);
      if (!v.ok()) {
        return v.status();
      }
      r.rsp = regs.rsp + 8;
      if (auto s = WriteReg(r, ops[0].reg.value, *v); !s.ok()) {  // pop %rsp: the value wins
        return s;
      }
      break;
    }
    case InsnKind::kOther:
      return absl::FailedPreconditionError("not emulated");
  }
  regs = r;
  return absl::OkStatus();
}

}  // namespace kwatch::core::probe
