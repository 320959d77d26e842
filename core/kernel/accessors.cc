#include "core/kernel/accessors.h"

#include <Zydis/Zydis.h>

#include <array>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "core/x86/format.h"

namespace kwatch::core::kernel {
namespace {

constexpr std::array<KnownAccessor, 2> kKnown = {{
    // kernel/time/jiffies.c: `return (u64) jiffies;` (x86-64: jiffies is jiffies_64).
    {.variable = "jiffies", .function = "jiffies_read", .type_name = "unsigned long", .size = 8},
    {.variable = "jiffies_64", .function = "jiffies_read", .type_name = "u64", .size = 8},
}};

std::string OperandList(const std::vector<RipOperand>& operands) {
  std::vector<std::string> parts;
  parts.reserve(operands.size());
  for (const RipOperand& op : operands) {
    parts.push_back(absl::StrFormat("+0x%x: %s (0x%x)", op.offset, op.text, op.target));
  }
  return absl::StrJoin(parts, "; ");
}

}  // namespace

std::span<const KnownAccessor> KnownAccessors() {
  return kKnown;
}

const KnownAccessor* FindKnownAccessor(absl::string_view variable) {
  for (const KnownAccessor& a : kKnown) {
    if (a.variable == variable) {
      return &a;
    }
  }
  return nullptr;
}

absl::StatusOr<std::vector<RipOperand>> RipOperands(uint64_t start, std::span<const uint8_t> code) {
  ZydisDecoder decoder;
  if (!ZYAN_SUCCESS(ZydisDecoderInit(&decoder, ZYDIS_MACHINE_MODE_LONG_64, ZYDIS_STACK_WIDTH_64))) {
    return absl::InternalError("ZydisDecoderInit failed");
  }
  std::vector<RipOperand> out;
  for (size_t at = 0; at < code.size();) {
    ZydisDecodedInstruction insn;
    std::array<ZydisDecodedOperand, ZYDIS_MAX_OPERAND_COUNT> ops{};
    if (!ZYAN_SUCCESS(ZydisDecoderDecodeFull(&decoder, code.data() + at, code.size() - at, &insn,
                                             ops.data()))) {
      if (code.size() - at < ZYDIS_MAX_INSTRUCTION_LENGTH) {
        break;  // cut by the end of what was read
      }
      return absl::InvalidArgumentError(
          absl::StrFormat("the code at +0x%x does not decode as x86-64", at));
    }
    for (uint8_t i = 0; i < insn.operand_count_visible; ++i) {
      const ZydisDecodedOperand& op = ops[i];
      if (op.type != ZYDIS_OPERAND_TYPE_MEMORY || op.mem.base != ZYDIS_REGISTER_RIP) {
        continue;
      }
      ZyanU64 target = 0;
      if (!ZYAN_SUCCESS(ZydisCalcAbsoluteAddress(&insn, &op, start + at, &target))) {
        continue;
      }
      const bool load = insn.mnemonic == ZYDIS_MNEMONIC_MOV && i == 1 &&
                        ops[0].type == ZYDIS_OPERAND_TYPE_REGISTER;
      out.push_back(RipOperand{.offset = at,
                               .target = target,
                               .size = static_cast<uint32_t>(op.size / 8),
                               .load = load,
                               .text = x86::FormatAtt(insn, ops.data(), start + at)});
    }
    at += insn.length;
    if (insn.mnemonic == ZYDIS_MNEMONIC_RET || insn.mnemonic == ZYDIS_MNEMONIC_JMP ||
        insn.mnemonic == ZYDIS_MNEMONIC_INT3 || insn.mnemonic == ZYDIS_MNEMONIC_UD2) {
      break;  // the function's end (a tail call or the return thunk jump included)
    }
  }
  return out;
}

absl::StatusOr<ViaSpec> ParseVia(absl::string_view text) {
  ViaSpec via;
  const size_t plus = text.find('+');
  via.function = std::string{absl::StripAsciiWhitespace(text.substr(0, plus))};
  if (via.function.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--via '", text, "': give FUNC or FUNC+OFF"));
  }
  if (plus != absl::string_view::npos) {
    absl::string_view off = absl::StripAsciiWhitespace(text.substr(plus + 1));
    uint64_t value = 0;
    const bool ok = absl::ConsumePrefix(&off, "0x") ? absl::SimpleHexAtoi(off, &value)
                                                    : absl::SimpleAtoi(off, &value);
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("--via '", text, "': OFF must be a number (decimal or 0x hex)"));
    }
    via.offset = value;
  }
  return via;
}

absl::StatusOr<RipOperand> PickOperand(absl::string_view variable, absl::string_view function,
                                       const std::vector<RipOperand>& operands,
                                       std::optional<uint64_t> offset, const KnownAccessor* known) {
  if (operands.empty()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s has no RIP-relative memory operand before its first return or jump: it does not "
        "read a global variable there",
        function));
  }
  if (offset.has_value()) {
    for (const RipOperand& op : operands) {
      if (op.offset == *offset) {
        return op;
      }
    }
    return absl::FailedPreconditionError(absl::StrFormat(
        "no instruction of %s at +0x%x has a RIP-relative operand; those that do: %s", function,
        *offset, OperandList(operands)));
  }
  if (known != nullptr) {
    const RipOperand& first = operands.front();
    if (!first.load || first.size != known->size) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "%s does not read %s as kwatch expects (a %d-byte mov into a register as its first "
          "RIP-relative operand); found: %s. Name the instruction with --via %s+OFF",
          function, variable, known->size, OperandList(operands), function));
    }
    return first;
  }
  if (operands.size() > 1) {
    return absl::FailedPreconditionError(
        absl::StrFormat("%s has %d RIP-relative operands: %s. Say which reads %s with --via %s+OFF",
                        function, operands.size(), OperandList(operands), variable, function));
  }
  return operands.front();
}

std::optional<bool> IsRepString(std::span<const uint8_t> code) {
  ZydisDecoder decoder;
  ZydisDecodedInstruction insn;
  if (!ZYAN_SUCCESS(ZydisDecoderInit(&decoder, ZYDIS_MACHINE_MODE_LONG_64, ZYDIS_STACK_WIDTH_64)) ||
      !ZYAN_SUCCESS(
          ZydisDecoderDecodeInstruction(&decoder, nullptr, code.data(), code.size(), &insn))) {
    return std::nullopt;
  }
  const bool rep = (insn.attributes &
                    (ZYDIS_ATTRIB_HAS_REP | ZYDIS_ATTRIB_HAS_REPE | ZYDIS_ATTRIB_HAS_REPNE)) != 0;
  switch (insn.mnemonic) {
    case ZYDIS_MNEMONIC_MOVSB:
    case ZYDIS_MNEMONIC_MOVSW:
    case ZYDIS_MNEMONIC_MOVSD:
    case ZYDIS_MNEMONIC_MOVSQ:
    case ZYDIS_MNEMONIC_STOSB:
    case ZYDIS_MNEMONIC_STOSW:
    case ZYDIS_MNEMONIC_STOSD:
    case ZYDIS_MNEMONIC_STOSQ:
    case ZYDIS_MNEMONIC_LODSB:
    case ZYDIS_MNEMONIC_LODSW:
    case ZYDIS_MNEMONIC_LODSD:
    case ZYDIS_MNEMONIC_LODSQ:
    case ZYDIS_MNEMONIC_CMPSB:
    case ZYDIS_MNEMONIC_CMPSW:
    case ZYDIS_MNEMONIC_CMPSD:
    case ZYDIS_MNEMONIC_CMPSQ:
    case ZYDIS_MNEMONIC_SCASB:
    case ZYDIS_MNEMONIC_SCASW:
    case ZYDIS_MNEMONIC_SCASD:
    case ZYDIS_MNEMONIC_SCASQ:
      return rep;
    default:
      return false;
  }
}

}  // namespace kwatch::core::kernel
