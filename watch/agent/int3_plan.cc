#include "watch/agent/int3_plan.h"

#include <sys/user.h>

#include <cstddef>
#include <optional>

#include "absl/strings/str_cat.h"
#include "agent/abi.h"
#include "core/base/status_macros.h"
#include "core/x86/zydis_context.h"
#include "watch/agent/controller.h"

namespace kwatch::watch::agent {

namespace ka = kwatch::agent;

namespace {

std::optional<uint32_t> Condition(ZydisMnemonic m) {
  switch (m) {
    case ZYDIS_MNEMONIC_JO:
      return 0;
    case ZYDIS_MNEMONIC_JNO:
      return 1;
    case ZYDIS_MNEMONIC_JB:
      return 2;
    case ZYDIS_MNEMONIC_JNB:
      return 3;
    case ZYDIS_MNEMONIC_JZ:
      return 4;
    case ZYDIS_MNEMONIC_JNZ:
      return 5;
    case ZYDIS_MNEMONIC_JBE:
      return 6;
    case ZYDIS_MNEMONIC_JNBE:
      return 7;
    case ZYDIS_MNEMONIC_JS:
      return 8;
    case ZYDIS_MNEMONIC_JNS:
      return 9;
    case ZYDIS_MNEMONIC_JP:
      return 10;
    case ZYDIS_MNEMONIC_JNP:
      return 11;
    case ZYDIS_MNEMONIC_JL:
      return 12;
    case ZYDIS_MNEMONIC_JNL:
      return 13;
    case ZYDIS_MNEMONIC_JLE:
      return 14;
    case ZYDIS_MNEMONIC_JNLE:
      return 15;
    case ZYDIS_MNEMONIC_JRCXZ:
      return ka::kKwCondJrcxz;
    case ZYDIS_MNEMONIC_JECXZ:
      return ka::kKwCondJecxz;
    case ZYDIS_MNEMONIC_LOOP:
      return ka::kKwCondLoop;
    case ZYDIS_MNEMONIC_LOOPE:
      return ka::kKwCondLoope;
    case ZYDIS_MNEMONIC_LOOPNE:
      return ka::kKwCondLoopne;
    default:
      return std::nullopt;
  }
}

// KwReg + 1 of a 64-bit general-purpose register (0: none).
std::optional<uint32_t> RegPlusOne(ZydisRegister reg) {
  if (reg == ZYDIS_REGISTER_NONE) {
    return 0;
  }
  const std::optional<core::x86::GprSlot> slot = core::x86::ResolveGpr(reg);
  if (!slot.has_value() || slot->bits != 64) {
    return std::nullopt;
  }
  const user_regs_struct regs{};
  const auto offset = static_cast<size_t>(reinterpret_cast<const char*>(&(regs.*slot->field)) -
                                          reinterpret_cast<const char*>(&regs));
  return static_cast<uint32_t>(offset / 8 + 1);
}

uint64_t RelativeTarget(const core::probe::ProbedInsn& insn) {
  uint64_t target = 0;
  ZydisCalcAbsoluteAddress(&insn.insn, insn.operands.data(), insn.addr.value, &target);
  return target;
}

}  // namespace

absl::Status PlanResume(const core::probe::ProbedInsn& insn, ProbeEntry& entry) {
  entry.insn_len = insn.length;
  const auto refuse = [&insn](const std::string& why) {
    return absl::FailedPreconditionError(
        absl::StrCat("'", insn.text, "' at ", absl::Hex(insn.addr.value), ": ", why));
  };
  switch (insn.kind) {
    case core::probe::InsnKind::kJmpRel:
      entry.resume = ka::kKwResumeJmp;
      entry.target = RelativeTarget(insn);
      return absl::OkStatus();
    case core::probe::InsnKind::kCallRel:
      entry.resume = ka::kKwResumeCall;
      entry.target = RelativeTarget(insn);
      return absl::OkStatus();
    case core::probe::InsnKind::kJcc: {
      const std::optional<uint32_t> cond = Condition(insn.insn.mnemonic);
      if (!cond.has_value()) {
        return refuse("a conditional branch the agent does not know");
      }
      entry.resume = ka::kKwResumeJcc;
      entry.cond = *cond;
      if (*cond >= ka::kKwCondLoop && insn.insn.address_width == 32) {
        entry.cond |= ka::kKwCondAddr32;
      }
      entry.target = RelativeTarget(insn);
      return absl::OkStatus();
    }
    case core::probe::InsnKind::kRet:
      entry.resume = ka::kKwResumeRet;
      entry.ret_imm = 0;
      for (uint8_t i = 0; i < insn.insn.operand_count_visible; ++i) {
        if (insn.operands[i].type == ZYDIS_OPERAND_TYPE_IMMEDIATE) {
          entry.ret_imm = static_cast<uint32_t>(insn.operands[i].imm.value.u);
        }
      }
      return absl::OkStatus();
    case core::probe::InsnKind::kCallIndirect:
    case core::probe::InsnKind::kJmpIndirect: {
      const ZydisDecodedOperand& op = insn.operands[0];
      entry.resume = ka::kKwResumeIndirect;
      entry.ind_flags =
          insn.kind == core::probe::InsnKind::kCallIndirect ? uint32_t{ka::kKwIndCall} : 0;
      if (op.type == ZYDIS_OPERAND_TYPE_REGISTER) {
        const std::optional<uint32_t> base = RegPlusOne(op.reg.value);
        if (!base.has_value() || *base == 0) {
          return refuse("an indirect branch through a register that is no 64-bit GPR");
        }
        entry.ind_base = *base;
        return absl::OkStatus();
      }
      if (op.type != ZYDIS_OPERAND_TYPE_MEMORY) {
        return refuse("an indirect branch of an unknown form");
      }
      entry.ind_flags |= ka::kKwIndMemory;
      if (op.mem.segment == ZYDIS_REGISTER_FS) {
        entry.ind_flags |= ka::kKwIndFs;
      } else if (op.mem.segment == ZYDIS_REGISTER_GS) {
        entry.ind_flags |= ka::kKwIndGs;
      }
      if (insn.insn.address_width == 32) {
        entry.ind_flags |= ka::kKwIndAddr32;
      }
      if (op.mem.base == ZYDIS_REGISTER_RIP) {
        uint64_t abs = 0;
        ZydisCalcAbsoluteAddress(&insn.insn, &op, insn.addr.value, &abs);
        entry.ind_base = 0;
        entry.ind_index = 0;
        entry.ind_disp = static_cast<int64_t>(abs);
        entry.ind_scale = 1;
        return absl::OkStatus();
      }
      const std::optional<uint32_t> base = RegPlusOne(op.mem.base);
      const std::optional<uint32_t> index = RegPlusOne(op.mem.index);
      if (!base.has_value() || !index.has_value()) {
        return refuse("an indirect branch with 32-bit address registers");
      }
      entry.ind_base = *base;
      entry.ind_index = *index;
      entry.ind_scale = op.mem.scale == 0 ? 1 : op.mem.scale;
      entry.ind_disp = op.mem.disp.has_displacement != 0 ? op.mem.disp.value : 0;
      return absl::OkStatus();
    }
    default:
      if (!insn.can_run_out_of_line) {
        return refuse("it can neither be emulated by the agent nor run out of line");
      }
      entry.resume = ka::kKwResumeXol;
      return absl::OkStatus();
  }
}

absl::Status PlanInt3(Controller& controller, core::ptrace::Process& proc,
                      const core::probe::ProbedInsn& insn, ProbeEntry& entry) {
  KW_RETURN_IF_ERROR(PlanResume(insn, entry));
  if (entry.resume != ka::kKwResumeXol) {
    return absl::OkStatus();
  }
  KW_ASSIGN_OR_RETURN(const core::RemoteAddr copy,
                      controller.PlaceCode(proc, insn.addr, core::probe::kMaxXolCopyBytes,
                                           [&insn](core::RemoteAddr at) {
                                             return core::probe::BuildOutOfLineCopy(
                                                 insn, at, core::probe::XolTail::kJumpBack);
                                           }));
  entry.xol_addr = copy.value;
  return absl::OkStatus();
}

}  // namespace kwatch::watch::agent
