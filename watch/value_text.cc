#include "watch/value_text.h"

#include <bit>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "watch/condition.h"

namespace kwatch::watch {

std::string FieldValueText(std::string_view type_name, uint64_t size, uint32_t bit_size,
                           uint64_t bits) {
  const std::string_view t = UnqualifiedType(type_name);
  const uint64_t width = bit_size > 0 ? bit_size : size * 8;
  const bool aggregate = t.starts_with("struct ") || t.starts_with("union ") ||
                         t.starts_with("class ") || t.ends_with(']');
  if (t.ends_with('*') || aggregate || width == 0 || width > 64) {
    return absl::StrCat("0x", absl::Hex(bits));
  }
  if (bit_size == 0 && t == "float" && size == 4) {
    return absl::StrFormat("%.9g", std::bit_cast<float>(static_cast<uint32_t>(bits)));
  }
  if (bit_size == 0 && t == "double" && size == 8) {
    return absl::StrFormat("%.17g", std::bit_cast<double>(bits));
  }
  const uint64_t value = width == 64 ? bits : bits & ((uint64_t{1} << width) - 1);
  if (IsSignedType(t) || t.starts_with("enum ")) {
    const int shift = static_cast<int>(64 - width);
    return absl::StrCat(static_cast<int64_t>(value << shift) >> shift);
  }
  return absl::StrCat(value);
}

}  // namespace kwatch::watch
