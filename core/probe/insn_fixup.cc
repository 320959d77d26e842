#include "core/probe/insn_fixup.h"

#include <algorithm>
#include <array>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/x86/format.h"
#include "core/x86/relocator.h"

namespace kwatch::core::probe {

namespace {

std::string HexBytes(std::span<const uint8_t> code) {
  return absl::StrJoin(code, " ", [](std::string* out, uint8_t b) {
    absl::StrAppend(out, absl::Hex(b, absl::kZeroPad2));
  });
}

bool IsGpr3264(ZydisRegister reg) {
  const ZydisRegisterClass c = ZydisRegisterGetClass(reg);
  return (c == ZYDIS_REGCLASS_GPR64 || c == ZYDIS_REGCLASS_GPR32) && reg != ZYDIS_REGISTER_RIP &&
         reg != ZYDIS_REGISTER_EIP;
}

bool IsGpr64(ZydisRegister reg) {
  return ZydisRegisterGetClass(reg) == ZYDIS_REGCLASS_GPR64 && reg != ZYDIS_REGISTER_RIP;
}

bool IsConditionalBranch(ZydisMnemonic m) {
  switch (m) {
    case ZYDIS_MNEMONIC_JO:
    case ZYDIS_MNEMONIC_JNO:
    case ZYDIS_MNEMONIC_JB:
    case ZYDIS_MNEMONIC_JNB:
    case ZYDIS_MNEMONIC_JZ:
    case ZYDIS_MNEMONIC_JNZ:
    case ZYDIS_MNEMONIC_JBE:
    case ZYDIS_MNEMONIC_JNBE:
    case ZYDIS_MNEMONIC_JS:
    case ZYDIS_MNEMONIC_JNS:
    case ZYDIS_MNEMONIC_JP:
    case ZYDIS_MNEMONIC_JNP:
    case ZYDIS_MNEMONIC_JL:
    case ZYDIS_MNEMONIC_JNL:
    case ZYDIS_MNEMONIC_JLE:
    case ZYDIS_MNEMONIC_JNLE:
    case ZYDIS_MNEMONIC_JRCXZ:
    case ZYDIS_MNEMONIC_JECXZ:
    case ZYDIS_MNEMONIC_LOOP:
    case ZYDIS_MNEMONIC_LOOPE:
    case ZYDIS_MNEMONIC_LOOPNE:
      return true;
    default:
      return false;
  }
}

// The explicit operands (Zydis lists implicit ones, such as flags or rsp, after them).
std::span<const ZydisDecodedOperand> Visible(const ProbedInsn& p) {
  return {p.operands.data(), p.insn.operand_count_visible};
}

void Classify(ProbedInsn& p) {
  const auto ops = Visible(p);
  const ZydisMnemonic m = p.insn.mnemonic;
  const bool stack64 = p.insn.operand_width == 64;
  auto set = [&p](InsnKind kind, bool out_of_line, bool touches_memory) {
    p.kind = kind;
    p.can_emulate = kind != InsnKind::kOther;
    p.can_run_out_of_line = out_of_line;
    p.emulation_touches_memory = touches_memory;
  };
  set(InsnKind::kOther, true, false);
  const bool locked = (p.insn.attributes & ZYDIS_ATTRIB_HAS_LOCK) != 0;
  switch (m) {
    case ZYDIS_MNEMONIC_NOP:
    case ZYDIS_MNEMONIC_ENDBR64:
    case ZYDIS_MNEMONIC_ENDBR32:
      set(InsnKind::kNop, true, false);
      return;
    case ZYDIS_MNEMONIC_MOV:
      if (ops.size() == 2 && ops[0].type == ZYDIS_OPERAND_TYPE_REGISTER &&
          IsGpr3264(ops[0].reg.value)) {
        if (ops[1].type == ZYDIS_OPERAND_TYPE_REGISTER && IsGpr3264(ops[1].reg.value) &&
            ZydisRegisterGetWidth(ZYDIS_MACHINE_MODE_LONG_64, ops[0].reg.value) ==
                ZydisRegisterGetWidth(ZYDIS_MACHINE_MODE_LONG_64, ops[1].reg.value)) {
          set(InsnKind::kMovRegReg, true, false);
        } else if (ops[1].type == ZYDIS_OPERAND_TYPE_IMMEDIATE) {
          set(InsnKind::kMovRegImm, true, false);
        }
      }
      return;
    case ZYDIS_MNEMONIC_LEA:
      if (ops.size() == 2 && ops[0].type == ZYDIS_OPERAND_TYPE_REGISTER &&
          IsGpr3264(ops[0].reg.value) && ops[1].type == ZYDIS_OPERAND_TYPE_MEMORY &&
          p.insn.address_width == 64) {
        set(InsnKind::kLea, true, false);
      }
      return;
    case ZYDIS_MNEMONIC_ADD:
    case ZYDIS_MNEMONIC_SUB:
      if (!locked && ops.size() == 2 && ops[0].type == ZYDIS_OPERAND_TYPE_REGISTER &&
          IsGpr3264(ops[0].reg.value) && ops[1].type == ZYDIS_OPERAND_TYPE_IMMEDIATE) {
        set(InsnKind::kAddSubImm, true, false);
      }
      return;
    case ZYDIS_MNEMONIC_PUSH:
      if (stack64 && ops.size() == 1 && ops[0].type == ZYDIS_OPERAND_TYPE_REGISTER &&
          IsGpr64(ops[0].reg.value)) {
        set(InsnKind::kPush, true, true);
      }
      return;
    case ZYDIS_MNEMONIC_POP:
      if (stack64 && ops.size() == 1 && ops[0].type == ZYDIS_OPERAND_TYPE_REGISTER &&
          IsGpr64(ops[0].reg.value)) {
        set(InsnKind::kPop, true, true);
      }
      return;
    case ZYDIS_MNEMONIC_JMP:
      if (ops.size() == 1 && ops[0].type == ZYDIS_OPERAND_TYPE_IMMEDIATE) {
        set(InsnKind::kJmpRel, false, false);
      } else if (ops.size() == 1) {
        set(InsnKind::kJmpIndirect, true, ops[0].type == ZYDIS_OPERAND_TYPE_MEMORY);
        p.falls_through = false;
      }
      return;
    case ZYDIS_MNEMONIC_CALL:
      if (ops.size() == 1 && ops[0].type == ZYDIS_OPERAND_TYPE_IMMEDIATE) {
        set(InsnKind::kCallRel, false, true);
      } else if (ops.size() == 1) {
        set(InsnKind::kCallIndirect, false, true);
      }
      return;
    case ZYDIS_MNEMONIC_RET:
      set(InsnKind::kRet, false, true);
      return;
    default:
      if (IsConditionalBranch(m)) {
        set(InsnKind::kJcc, false, false);
      }
      return;
  }
}

}  // namespace

bool RipRelativeReaches(RemoteAddr slot, uint8_t length, RemoteAddr target) {
  return x86::Rel32Reaches(slot + length, target);
}

RemoteAddr RipRelativeTarget(const ProbedInsn& insn) {
  if (insn.rip_disp_offset == 0) {
    return RemoteAddr{0};
  }
  return RemoteAddr{insn.addr.value + insn.length +
                    static_cast<uint64_t>(insn.insn.raw.disp.value)};
}

absl::StatusOr<ProbedInsn> AnalyzeProbedInsn(std::span<const uint8_t> code, RemoteAddr addr) {
  ZydisDecoder decoder;
  if (!ZYAN_SUCCESS(ZydisDecoderInit(&decoder, ZYDIS_MACHINE_MODE_LONG_64, ZYDIS_STACK_WIDTH_64))) {
    return absl::InternalError("cannot initialise the Zydis decoder");
  }
  ProbedInsn p;
  p.addr = addr;
  const size_t avail = std::min<size_t>(code.size(), p.bytes.size());
  if (avail == 0 || !ZYAN_SUCCESS(ZydisDecoderDecodeFull(&decoder, code.data(), avail, &p.insn,
                                                         p.operands.data()))) {
    return absl::InvalidArgumentError(
        absl::StrFormat("cannot probe 0x%x: the bytes there (%s) do not decode as an x86-64 "
                        "instruction",
                        addr.value, HexBytes(code.first(avail))));
  }
  p.length = p.insn.length;
  std::copy_n(code.begin(), p.length, p.bytes.begin());
  p.text = x86::FormatAtt(p.insn, p.operands.data(), addr.value);
  auto refuse = [&p](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrFormat("cannot probe 0x%x (%s): %s", p.addr.value, p.text, why));
  };
  const auto ops = Visible(p);
  const std::string why = x86::WhyCannotDisplace(p.insn, ops);
  if (!why.empty()) {
    return refuse(why);
  }
  // A RIP-relative memory operand: its disp32 is rebased in the out-of-line copy.
  for (const ZydisDecodedOperand& op : ops) {
    if (op.type == ZYDIS_OPERAND_TYPE_MEMORY && op.mem.base == ZYDIS_REGISTER_RIP) {
      p.rip_disp_offset = p.insn.raw.disp.offset;
    }
  }
  Classify(p);
  const bool branch = p.kind == InsnKind::kJmpRel || p.kind == InsnKind::kJcc ||
                      p.kind == InsnKind::kCallRel || p.kind == InsnKind::kCallIndirect ||
                      p.kind == InsnKind::kJmpIndirect || p.kind == InsnKind::kRet;
  if (branch && p.insn.operand_width != 64 && p.kind != InsnKind::kJcc &&
      p.kind != InsnKind::kJmpRel) {
    return refuse("16-bit near branches are not supported");
  }
  if (p.kind == InsnKind::kOther && (p.insn.attributes & ZYDIS_ATTRIB_IS_RELATIVE) != 0 &&
      p.rip_disp_offset == 0) {
    return refuse("a relative branch kwatch cannot emulate");
  }
  if (p.kind == InsnKind::kOther &&
      (p.insn.meta.category == ZYDIS_CATEGORY_COND_BR ||
       p.insn.meta.category == ZYDIS_CATEGORY_UNCOND_BR ||
       p.insn.meta.category == ZYDIS_CATEGORY_CALL || p.insn.meta.category == ZYDIS_CATEGORY_RET)) {
    return refuse("a branch kwatch cannot emulate");
  }
  return p;
}

absl::Status CheckInstructionBoundary(std::span<const uint8_t> function_code,
                                      RemoteAddr function_start, RemoteAddr addr) {
  if (addr < function_start || addr.value >= function_start.value + function_code.size()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("0x%x is outside the function's %d bytes at 0x%x", addr.value,
                        function_code.size(), function_start.value));
  }
  ZydisDecoder decoder;
  ZydisDecoderInit(&decoder, ZYDIS_MACHINE_MODE_LONG_64, ZYDIS_STACK_WIDTH_64);
  const uint64_t target = addr - function_start;
  uint64_t off = 0;
  while (off < target) {
    ZydisDecodedInstruction insn;
    std::array<ZydisDecodedOperand, ZYDIS_MAX_OPERAND_COUNT> ops{};
    if (!ZYAN_SUCCESS(ZydisDecoderDecodeFull(&decoder, function_code.data() + off,
                                             function_code.size() - off, &insn, ops.data()))) {
      return absl::InvalidArgumentError(
          absl::StrFormat("cannot check 0x%x: the function at 0x%x does not decode at +0x%x",
                          addr.value, function_start.value, off));
    }
    if (off + insn.length > target) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "0x%x is not on an instruction boundary: it is inside '%s' at 0x%x (+0x%x, %d bytes)",
          addr.value, x86::FormatAtt(insn, ops.data(), function_start.value + off),
          function_start.value + off, off, insn.length));
    }
    off += insn.length;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint8_t>> BuildOutOfLineCopy(const ProbedInsn& insn, RemoteAddr slot,
                                                        XolTail tail) {
  if (!insn.can_run_out_of_line) {
    return absl::FailedPreconditionError(
        absl::StrFormat("'%s' at 0x%x cannot run out of line", insn.text, insn.addr.value));
  }
  std::vector<uint8_t> out(insn.bytes.begin(), insn.bytes.begin() + insn.length);
  if (insn.rip_disp_offset != 0) {
    const RemoteAddr target = RipRelativeTarget(insn);
    if (!RipRelativeReaches(slot, insn.length, target)) {
      return absl::OutOfRangeError(absl::StrFormat(
          "'%s' at 0x%x: its RIP-relative target 0x%x is beyond +-2 GiB of the out-of-line slot "
          "0x%x",
          insn.text, insn.addr.value, target.value, slot.value));
    }
    const auto disp = static_cast<int32_t>(target.value - (slot.value + insn.length));
    std::memcpy(out.data() + insn.rip_disp_offset, &disp, sizeof(disp));
  }
  if (tail == XolTail::kTrap || !insn.falls_through) {
    out.push_back(0xcc);
    return out;
  }
  x86::AppendJump(out, slot, insn.addr + insn.length);
  return out;
}

}  // namespace kwatch::core::probe
