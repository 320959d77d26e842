#include "core/x86/x86_access.h"

#include <Zydis/Zydis.h>

#include <array>

#include "absl/strings/str_format.h"
#include "core/x86/zydis_context.h"

namespace kwatch::core::x86 {

absl::StatusOr<DecodedAccess> DecodeAccess(std::span<const uint8_t> code, uint64_t rip,
                                           const user_regs_struct& regs) {
  ZydisDecoder decoder;
  ZydisDecoderInit(&decoder, ZYDIS_MACHINE_MODE_LONG_64, ZYDIS_STACK_WIDTH_64);
  ZydisDecodedInstruction insn;
  std::array<ZydisDecodedOperand, ZYDIS_MAX_OPERAND_COUNT> ops{};
  if (!ZYAN_SUCCESS(
          ZydisDecoderDecodeFull(&decoder, code.data(), code.size(), &insn, ops.data()))) {
    return absl::InvalidArgumentError(absl::StrFormat("cannot decode an instruction at 0x%x", rip));
  }
  DecodedAccess out;
  out.length = insn.length;
  ZydisFormatter fmt;
  ZydisFormatterInit(&fmt, ZYDIS_FORMATTER_STYLE_ATT);
  std::array<char, 256> buf{};
  if (ZYAN_SUCCESS(ZydisFormatterFormatInstruction(&fmt, &insn, ops.data(),
                                                   insn.operand_count_visible, buf.data(),
                                                   buf.size(), rip, nullptr))) {
    out.text = buf.data();
  }
  ZydisRegisterContext ctx{};
  FillZydisContext(regs, ctx);
  for (int i = 0; i < insn.operand_count; ++i) {
    const ZydisDecodedOperand& op = ops[i];
    if (op.type != ZYDIS_OPERAND_TYPE_MEMORY || op.mem.type == ZYDIS_MEMOP_TYPE_AGEN) {
      continue;  // lea and friends compute an address without touching memory
    }
    uint64_t addr = 0;
    if (!ZYAN_SUCCESS(ZydisCalcAbsoluteAddressEx(&insn, &op, rip, &ctx, &addr))) {
      continue;
    }
    if (op.mem.segment == ZYDIS_REGISTER_FS) {
      addr += regs.fs_base;
    } else if (op.mem.segment == ZYDIS_REGISTER_GS) {
      addr += regs.gs_base;
    }
    MemoryOperand m;
    m.addr = addr;
    m.size = op.size / 8;
    m.read = (op.actions & ZYDIS_OPERAND_ACTION_MASK_READ) != 0;
    m.write = (op.actions & ZYDIS_OPERAND_ACTION_MASK_WRITE) != 0;
    out.memory.push_back(m);
  }
  return out;
}

}  // namespace kwatch::core::x86
