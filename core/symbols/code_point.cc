#include "core/symbols/code_point.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace kwatch::core::symbols {

namespace {

// A C or C++ function name (namespaces, GCC's ".cold"/".isra.0" suffixes).
bool IsFunctionName(std::string_view s) {
  if (s.empty() || absl::ascii_isdigit(static_cast<unsigned char>(s[0]))) {
    return false;
  }
  return std::ranges::all_of(s, [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_' || c == ':' || c == '.';
  });
}

// FILE:LINE: a ':' that is not part of '::', digits after it.
bool SplitFileLine(std::string_view text, std::string_view* file, int* line) {
  const size_t colon = text.rfind(':');
  if (colon == std::string_view::npos || colon == 0 || text[colon - 1] == ':') {
    return false;
  }
  *file = text.substr(0, colon);
  const absl::string_view digits(text.data() + colon + 1, text.size() - colon - 1);
  return !digits.empty() && absl::SimpleAtoi(digits, line) && *line > 0;
}

ResolvedExpr CodeAt(RemoteAddr addr, std::string display, std::string module) {
  ResolvedExpr r;
  r.display = std::move(display);
  r.addr = addr;
  r.length = 1;
  r.module = std::move(module);
  return r;
}

}  // namespace

absl::StatusOr<std::optional<ResolvedExpr>> ResolveCodePoint(const Symbols& syms,
                                                             std::string_view text) {
  std::string_view file;
  int line = 0;
  if (SplitFileLine(text, &file, &line)) {
    absl::StatusOr<std::vector<RemoteAddr>> addrs =
        syms.AddressesOfLine(file, line, /*statements=*/true);
    if (!addrs.ok()) {
      return addrs.status();
    }
    // The line's first statement, as gdb's `break FILE:LINE` stops at (a line split into
    // several blocks fires at the first only).
    const RemoteAddr at = addrs->front();
    const std::string where = absl::StrCat(std::string(file), ":", line);
    const std::optional<FunctionSymbol> fn = syms.FunctionAt(at);
    return CodeAt(at,
                  fn.has_value() ? absl::StrCat(where, " (", fn->name, "+0x",
                                                absl::Hex(at.value - fn->start.value), ")")
                                 : where,
                  fn.has_value() ? fn->module : std::string());
  }
  std::string_view name = text;
  uint64_t offset = 0;
  if (const size_t plus = text.find('+'); plus != std::string_view::npos) {
    name = text.substr(0, plus);
    const absl::string_view off(text.data() + plus + 1, text.size() - plus - 1);
    const bool parsed = absl::StartsWith(off, "0x") || absl::StartsWith(off, "0X")
                            ? absl::SimpleHexAtoi(off.substr(2), &offset)
                            : absl::SimpleAtoi(off, &offset);
    if (!parsed) {
      return std::nullopt;
    }
  }
  if (!IsFunctionName(name)) {
    return std::nullopt;
  }
  const std::optional<FunctionSymbol> fn = syms.FindFunction(name);
  if (!fn.has_value()) {
    return std::nullopt;
  }
  if (fn->size > 0 && offset >= fn->size) {
    return absl::InvalidArgumentError(absl::StrCat(fn->name, " is ", fn->size, " bytes long; +0x",
                                                   absl::Hex(offset), " is past its end"));
  }
  return CodeAt(RemoteAddr{fn->start.value + offset},
                offset == 0 ? fn->name : absl::StrCat(fn->name, "+0x", absl::Hex(offset)),
                fn->module);
}

}  // namespace kwatch::core::symbols
