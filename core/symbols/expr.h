#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"

namespace kwatch::core::symbols {

// The watch expression language:
//   name | &name | name.field.sub | name[3] | name[2].field | ptr->field | *ptr
//   'file.c'::name (the static of that source file, as in gdb) | 0xADDR | 0xADDR:LEN
// A leading '&' is accepted and means the object itself (as in `kwatch --write &jiffies`).
struct ExprStep {
  enum class Kind : uint8_t { kMember, kArrow, kIndex, kDeref };
  Kind kind = Kind::kMember;
  std::string member;  // kMember, kArrow
  int64_t index = 0;   // kIndex
  size_t column = 0;   // 0-based position in the text, for messages
};

struct Expr {
  std::string text;                 // as the user wrote it
  std::string base;                 // symbol name, 'file.c'::name for a file's static
                                    // (empty for an absolute address)
  std::optional<uint64_t> address;  // 0xADDR form
  std::optional<uint64_t> length;   // 0xADDR:LEN form
  std::vector<ExprStep> steps;
  bool address_of = false;  // leading '&'
};

// Parses `text`. On error: InvalidArgument whose message names the column and shows a
// caret under the offending character, e.g. "expected a field name after '.' at column 7".
absl::StatusOr<Expr> ParseExpr(std::string_view text);

}  // namespace kwatch::core::symbols
