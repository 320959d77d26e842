#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kwatch::core::symbols {

// The watch expression language (C as gdb reads it, the parts that name an object):
//   name | ns::name | Box<int, 2>::name (C++) | 'file.c'::name (the static of that file)
//   | name.5 (a function static as GCC renames it in the symbol table) | 'sym.bol' (a symbol
//   table name taken as is) | 0xADDR | 0xADDR:LEN
//   | (TYPE *)0xADDR (the TYPE at that address) | *(TYPE *)0xADDR | ((TYPE *)0xADDR)->field
// followed by any of .field | ->field | [3], with leading '*'s and parentheses as in C:
//   cache->lines[3].data[0] | *g_ptr | (*pp)->field | ((struct T *)0x7f00..)->arr[2].x
// TYPE is a type name of the target's debug info: struct/union/class/enum TAG, a typedef, a
// C++ class, or a base type ("unsigned long"), with const/volatile and one or more '*'.
// A leading '&' is accepted and means the object itself (as in `kwatch --write &jiffies`).
struct ExprStep {
  enum class Kind : uint8_t { kMember, kArrow, kIndex, kDeref };
  Kind kind = Kind::kMember;
  std::string member;  // kMember, kArrow
  int64_t index = 0;   // kIndex
  size_t column = 0;   // 0-based position in the text, for messages
};

// The type of a cast, as written.
struct ExprType {
  enum class Tag : uint8_t { kNone, kStruct, kUnion, kClass, kEnum };
  Tag tag = Tag::kNone;
  std::string name;   // "node", "unsigned long", "ns::Box<int>" (CanonicalTypeName spelling)
  int pointers = 0;   // the '*'s
  size_t column = 0;  // 0-based position of its first word

  // C spelling: "struct node *", "unsigned long **", "T" (qualifiers are dropped).
  std::string Spelling() const;
};

struct Expr {
  std::string text;                 // as the user wrote it
  std::string base;                 // symbol name, 'file.c'::name for a file's static
                                    // (empty for an absolute address)
  std::optional<uint64_t> address;  // 0xADDR form (also the operand of a cast)
  std::optional<uint64_t> length;   // 0xADDR:LEN form
  std::optional<ExprType> cast;     // (TYPE)0xADDR: a pointer TYPE whose value is address
  size_t cast_column = 0;           // 0-based position of the cast's '('
  std::vector<ExprStep> steps;      // applied in order, after the cast
  bool address_of = false;          // leading '&'
};

// Parses `text`. On error: InvalidArgument whose message names the column and shows a
// caret under the offending character, e.g. "expected a field name after '.' at column 7".
absl::StatusOr<Expr> ParseExpr(std::string_view text);

// The same form for a later error about `text` (the resolver's): `code` with "<what> at column
// N", the text, and a caret under the 0-based `column`.
absl::Status ExprError(absl::StatusCode code, absl::string_view text, absl::string_view what,
                       size_t column);

}  // namespace kwatch::core::symbols
