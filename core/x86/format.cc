#include "core/x86/format.h"

#include <array>
#include <utility>

namespace kwatch::core::x86 {

std::string FormatAtt(const ZydisDecodedInstruction& insn, const ZydisDecodedOperand* operands,
                      uint64_t ip) {
  ZydisFormatter formatter;
  if (!ZYAN_SUCCESS(ZydisFormatterInit(&formatter, ZYDIS_FORMATTER_STYLE_ATT))) {
    return "";
  }
  constexpr std::array<std::pair<ZydisFormatterProperty, ZyanUPointer>, 6> kProperties = {{
      {ZYDIS_FORMATTER_PROP_HEX_UPPERCASE, ZYAN_FALSE},
      {ZYDIS_FORMATTER_PROP_FORCE_RELATIVE_RIPREL, ZYAN_TRUE},
      {ZYDIS_FORMATTER_PROP_ADDR_PADDING_ABSOLUTE, ZYDIS_PADDING_DISABLED},
      {ZYDIS_FORMATTER_PROP_ADDR_PADDING_RELATIVE, ZYDIS_PADDING_DISABLED},
      {ZYDIS_FORMATTER_PROP_DISP_PADDING, ZYDIS_PADDING_DISABLED},
      {ZYDIS_FORMATTER_PROP_IMM_PADDING, ZYDIS_PADDING_DISABLED},
  }};
  for (const auto& [property, value] : kProperties) {
    if (!ZYAN_SUCCESS(ZydisFormatterSetProperty(&formatter, property, value))) {
      return "";
    }
  }
  std::array<char, 256> text{};
  if (!ZYAN_SUCCESS(ZydisFormatterFormatInstruction(&formatter, &insn, operands,
                                                    insn.operand_count_visible, text.data(),
                                                    text.size(), ip, nullptr))) {
    return "";
  }
  return text.data();
}

}  // namespace kwatch::core::x86
