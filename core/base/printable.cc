#include "core/base/printable.h"

#include <cstddef>
#include <cstdint>

#include "absl/strings/str_format.h"

namespace kwatch::core {
namespace {

// The length of the valid UTF-8 sequence at the start of `s` (1..4) and its code point, or 0
// when the first byte does not start one (stray continuation byte, overlong form, surrogate,
// beyond U+10FFFF, cut short).
size_t DecodeUtf8(absl::string_view s, uint32_t* cp) {
  const auto b0 = static_cast<unsigned char>(s[0]);
  if (b0 < 0x80) {
    *cp = b0;
    return 1;
  }
  size_t n = 0;
  uint32_t c = 0;
  uint32_t min = 0;
  if ((b0 & 0xe0) == 0xc0) {
    n = 2;
    c = b0 & 0x1f;
    min = 0x80;
  } else if ((b0 & 0xf0) == 0xe0) {
    n = 3;
    c = b0 & 0x0f;
    min = 0x800;
  } else if ((b0 & 0xf8) == 0xf0) {
    n = 4;
    c = b0 & 0x07;
    min = 0x10000;
  } else {
    return 0;
  }
  if (s.size() < n) {
    return 0;
  }
  for (size_t i = 1; i < n; ++i) {
    const auto b = static_cast<unsigned char>(s[i]);
    if ((b & 0xc0) != 0x80) {
      return 0;
    }
    c = (c << 6) | (b & 0x3f);
  }
  if (c < min || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff)) {
    return 0;
  }
  *cp = c;
  return n;
}

// Code points shown as \uXXXX: C1 controls, bidirectional controls, line/paragraph separators.
bool Hidden(uint32_t cp) {
  return (cp >= 0x80 && cp <= 0x9f) || cp == 0x61c || cp == 0x200e || cp == 0x200f ||
         (cp >= 0x2028 && cp <= 0x202e) || (cp >= 0x2066 && cp <= 0x2069);
}

}  // namespace

bool IsPrintable(absl::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    if (b >= 0x20 && b < 0x7f) {
      ++i;
      continue;
    }
    uint32_t cp = 0;
    const size_t n = DecodeUtf8(s.substr(i), &cp);
    if (n <= 1 || Hidden(cp)) {  // n == 1: a C0 control or DEL
      return false;
    }
    i += n;
  }
  return true;
}

std::string Printable(absl::string_view s) {
  if (IsPrintable(s)) {
    return {s.data(), s.size()};
  }
  std::string out;
  out.reserve(s.size() + 16);
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    if (b >= 0x20 && b < 0x7f) {
      out += static_cast<char>(b);
      ++i;
      continue;
    }
    uint32_t cp = 0;
    const size_t n = DecodeUtf8(s.substr(i), &cp);
    if (n <= 1) {  // a C0 control, DEL, or a byte that is not UTF-8
      absl::StrAppendFormat(&out, "\\x%02x", b);
      ++i;
    } else if (Hidden(cp)) {
      absl::StrAppendFormat(&out, "\\u%04x", cp);
      i += n;
    } else {
      out.append(s.data() + i, n);
      i += n;
    }
  }
  return out;
}

}  // namespace kwatch::core
