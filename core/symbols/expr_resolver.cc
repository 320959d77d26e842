#include "core/symbols/expr_resolver.h"

#include <dwarf.h>
#include <elfutils/libdw.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "core/base/status_macros.h"
#include "core/symbols/symbol_match.h"
#include "core/symbols/type_layout.h"

namespace kwatch::core::symbols {
namespace {

// Where the resolution stands: an object (its address and type), or, right after a cast,
// the address of one (`(struct T *)0x10` is a pointer whose value is 0x10).
struct Cursor {
  uint64_t addr = 0;
  bool has_type = false;
  TypeRef type;
  int pointers = 0;         // the object is `type` with this many '*' (a cast's `T **`)
  bool is_address = false;  // a cast's pointer value: the object is at addr
  uint64_t bit_unit = 0;    // bitfields only: bytes of the storage unit
  uint32_t bit_offset = 0;
  uint32_t bit_size = 0;
  std::string display;
  bool unary = false;  // display is a prefix expression ("*p", "(T *)0x10"): parenthesise it
                       // before a postfix step
  std::vector<PointerLoad>* loads = nullptr;  // where each pointer read is recorded
};

// `type` with `pointers` more '*': "struct node" and 2 give "struct node **".
std::string PointerName(const std::string& type, int pointers) {
  if (pointers == 0) {
    return type;
  }
  const std::string stars(static_cast<size_t>(pointers), '*');
  return absl::EndsWith(type, "*") ? type + stars : absl::StrCat(type, " ", stars);
}

// The C spelling of cur's object type (or of the pointer a cast gives).
std::string ShownType(const Cursor& cur) {
  return PointerName(TypeName(cur.type), cur.pointers + (cur.is_address ? 1 : 0));
}

std::optional<uint64_t> ObjectSize(const Cursor& cur) {
  return cur.pointers > 0 ? std::optional<uint64_t>(8) : TypeSize(cur.type);
}

// cur's display, ready for a postfix step.
std::string PostfixBase(const Cursor& cur) {
  return cur.unary ? absl::StrCat("(", cur.display, ")") : cur.display;
}

absl::Status NoType(const Cursor& cur) {
  return absl::FailedPreconditionError(absl::StrCat(
      "'", cur.display,
      "' has no DWARF type information (was the program built with -g?): members, "
      "indexes and '*' need one. Watch the whole symbol, or give an address as 0xADDR:LEN"));
}

absl::StatusOr<uint64_t> ReadPointer(const MemoryReader& read, const Cursor& cur) {
  if (!read) {
    return absl::FailedPreconditionError(absl::StrCat(
        "following the pointer '", cur.display, "' needs the target's memory, and none is given"));
  }
  const uint64_t size =
      cur.pointers > 0 ? 8 : std::min<uint64_t>(TypeSize(cur.type).value_or(8), 8);
  std::array<uint8_t, 8> buf{};
  const absl::Status s = read(RemoteAddr{cur.addr}, std::span<uint8_t>(buf.data(), size));
  if (!s.ok()) {
    return absl::Status(s.code(), absl::StrFormat("reading the pointer '%s' at 0x%x: %s",
                                                  cur.display, cur.addr, s.message()));
  }
  uint64_t value = 0;
  std::memcpy(&value, buf.data(), sizeof(value));  // x86-64: little-endian
  if (cur.loads != nullptr) {
    cur.loads->push_back(
        PointerLoad{cur.display, RemoteAddr{cur.addr}, static_cast<uint32_t>(size), value});
  }
  return value;
}

absl::Status NullPointer(const Cursor& cur) {
  return absl::FailedPreconditionError(
      absl::StrCat("'", cur.display, "' is NULL: there is nothing to watch behind it yet"));
}

// For '->', '*' and '[i]' on a pointer: the object `cur` points to becomes the cursor's (a
// cast's address as it is, a pointer read from the target, or the first element of an
// array: a->m is a[0].m). `void_pointer` and `not_pointer` end the messages for those two
// mistakes.
absl::Status Dereference(const MemoryReader& read, absl::string_view void_pointer,
                         absl::string_view not_pointer, Cursor* cur) {
  if (cur->is_address) {
    cur->is_address = false;
    return absl::OkStatus();
  }
  if (cur->pointers > 0) {
    KW_ASSIGN_OR_RETURN(const uint64_t ptr, ReadPointer(read, *cur));
    if (ptr == 0) {
      return NullPointer(*cur);
    }
    cur->addr = ptr;
    --cur->pointers;
    return absl::OkStatus();
  }
  const TypeRef s = StripType(cur->type);
  Dwarf_Die die = s.die;
  const int tag = dwarf_tag(&die);
  if (tag == DW_TAG_pointer_type) {
    const std::optional<Dwarf_Die> pointee = TypeOf(die);
    if (!pointee.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", cur->display, "' is a void pointer: ", void_pointer));
    }
    KW_ASSIGN_OR_RETURN(const uint64_t ptr, ReadPointer(read, *cur));
    if (ptr == 0) {
      return NullPointer(*cur);
    }
    cur->addr = ptr;
    cur->type = TypeRef{*pointee, 0};
    return absl::OkStatus();
  }
  if (tag == DW_TAG_array_type) {
    const std::optional<TypeRef> elem = ArrayElement(s);
    if (!elem.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat("'", cur->display, "' is an array of void"));
    }
    cur->type = *elem;
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat("'", cur->display, "' is ", TypeName(cur->type),
                                                 ", not a pointer: ", not_pointer));
}

// Whether cur holds a pointer (a cast's address, a cast's `T **` object, or a pointer DIE).
bool IsPointer(const Cursor& cur) {
  return cur.is_address || cur.pointers > 0 || StrippedTag(cur.type) == DW_TAG_pointer_type;
}

absl::Status MemberStep(const ExprStep& step, const MemoryReader& read, Cursor* cur) {
  const bool arrow = step.kind == ExprStep::Kind::kArrow;
  const std::string shown_type = ShownType(*cur);
  const std::string before = PostfixBase(*cur);
  if (arrow) {
    KW_RETURN_IF_ERROR(Dereference(read, "'->' needs a pointer to a struct or union",
                                   absl::StrCat("use '", before, ".", step.member, "'"), cur));
  } else if (IsPointer(*cur)) {
    return absl::InvalidArgumentError(absl::StrCat("'", cur->display, "' is a pointer (",
                                                   shown_type, "): use '", before, "->",
                                                   step.member, "'"));
  }
  const TypeRef s = StripType(cur->type);
  Dwarf_Die die = s.die;
  const int tag = cur->pointers > 0 ? DW_TAG_pointer_type : dwarf_tag(&die);
  const std::string container = ShownType(*cur);
  if (tag != DW_TAG_structure_type && tag != DW_TAG_union_type && tag != DW_TAG_class_type) {
    const std::string what = arrow ? absl::StrCat("*", before) : cur->display;
    return absl::InvalidArgumentError(absl::StrCat("'", what, "' is ", container,
                                                   ", not a struct or union: it has no member '",
                                                   step.member, "'"));
  }
  const std::optional<MemberInfo> m = FindMember(die, step.member);
  if (!m.has_value()) {
    const std::vector<std::string> names = MemberNames(die);
    std::string msg = absl::StrCat(container, " has no member '", step.member, "'");
    if (names.empty()) {
      absl::StrAppend(&msg, " (its definition is not in the debug info, or it has no members)");
      return absl::InvalidArgumentError(msg);
    }
    const std::vector<std::string> near = NearMatches(step.member, names, 3);
    if (!near.empty()) {
      absl::StrAppend(&msg, "; did you mean '", near[0], "'?");
    }
    absl::StrAppend(&msg, " Members: ", absl::StrJoin(names, ", "));
    return absl::InvalidArgumentError(msg);
  }
  if (!m->has_type) {
    return absl::FailedPreconditionError(absl::StrCat("member '", step.member, "' of ", container,
                                                      " has no type in the debug info"));
  }
  cur->addr += m->offset;
  cur->type = m->type;
  cur->bit_size = m->bit_size;
  cur->bit_offset = m->bit_offset;
  cur->bit_unit = m->size;
  cur->display = absl::StrCat(before, arrow ? "->" : ".", step.member);
  cur->unary = false;
  return absl::OkStatus();
}

absl::Status IndexStep(const ExprStep& step, const MemoryReader& read, Cursor* cur) {
  const std::string shown_type = ShownType(*cur);
  if (step.index < 0) {
    return absl::InvalidArgumentError(absl::StrCat("index ", step.index, " of '", cur->display,
                                                   "' is negative: indexes start at 0"));
  }
  const auto index = static_cast<uint64_t>(step.index);
  const std::string before = PostfixBase(*cur);
  const TypeRef s = StripType(cur->type);
  Dwarf_Die die = s.die;
  const int tag = dwarf_tag(&die);
  if (cur->is_address || cur->pointers > 0) {
    // The i-th object from a cast's address, or behind a cast's `T **`.
    KW_RETURN_IF_ERROR(Dereference(read, "", "", cur));
    const std::optional<uint64_t> esize = ObjectSize(*cur);
    if (!esize.has_value() || *esize == 0) {
      return absl::InvalidArgumentError(absl::StrCat("'", before, "' is ", shown_type,
                                                     ": cannot index a pointer to a type "
                                                     "without a size"));
    }
    cur->addr += index * *esize;
  } else if (tag == DW_TAG_array_type) {
    const auto dims = ArrayDims(die);
    if (static_cast<size_t>(s.skip_dims) < dims.size() && dims[s.skip_dims].has_value() &&
        index >= *dims[s.skip_dims]) {
      const uint64_t n = *dims[s.skip_dims];
      if (n == 0) {
        return absl::InvalidArgumentError(absl::StrCat("index ", index, " is out of bounds for '",
                                                       cur->display, "' (", shown_type,
                                                       "): it has no elements"));
      }
      return absl::InvalidArgumentError(absl::StrCat("index ", index, " is out of bounds for '",
                                                     cur->display, "' (", shown_type,
                                                     "): valid indexes are 0 to ", n - 1));
    }
    const std::optional<TypeRef> elem = ArrayElement(s);
    const std::optional<uint64_t> esize =
        elem.has_value() ? TypeSize(*elem) : std::optional<uint64_t>();
    if (!esize.has_value()) {
      return absl::FailedPreconditionError(absl::StrCat("the elements of '", cur->display, "' (",
                                                        shown_type, ") have no known size"));
    }
    cur->addr += index * *esize;
    cur->type = *elem;
  } else if (tag == DW_TAG_pointer_type) {
    const std::optional<Dwarf_Die> pointee = TypeOf(die);
    const std::optional<uint64_t> esize =
        pointee.has_value() ? TypeSize(TypeRef{*pointee, 0}) : std::optional<uint64_t>();
    if (!esize.has_value() || *esize == 0) {
      return absl::InvalidArgumentError(absl::StrCat("'", cur->display, "' is ", shown_type,
                                                     ": cannot index a pointer to a type "
                                                     "without a size"));
    }
    KW_ASSIGN_OR_RETURN(const uint64_t ptr, ReadPointer(read, *cur));
    if (ptr == 0) {
      return NullPointer(*cur);
    }
    cur->addr = ptr + index * *esize;
    cur->type = TypeRef{*pointee, 0};
  } else {
    return absl::InvalidArgumentError(absl::StrCat("'", cur->display, "' is ", shown_type,
                                                   ", not an array or a pointer: it takes no "
                                                   "[index]"));
  }
  cur->display = absl::StrCat(before, "[", index, "]");
  cur->unary = false;
  return absl::OkStatus();
}

absl::Status Step(const ExprStep& step, const MemoryReader& read, Cursor* cur) {
  if (!cur->has_type) {
    return NoType(*cur);
  }
  if (cur->bit_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", cur->display, "' is a bitfield: it has no members, elements or target"));
  }
  if (step.kind == ExprStep::Kind::kMember || step.kind == ExprStep::Kind::kArrow) {
    return MemberStep(step, read, cur);
  }
  if (step.kind == ExprStep::Kind::kDeref) {
    KW_RETURN_IF_ERROR(Dereference(read, "'*' needs a typed pointer", "it cannot take '*'", cur));
    cur->display = absl::StrCat("*", cur->display);
    cur->unary = true;
    return absl::OkStatus();
  }
  return IndexStep(step, read, cur);
}

// The cursor of `expr`'s cast: the address of a TYPE's pointee, found through `types`.
absl::StatusOr<Cursor> CastCursor(const Expr& expr, const TypeLookup& types) {
  const ExprType& cast = *expr.cast;
  const std::string written = absl::StrFormat("(%s)0x%x", cast.Spelling(), *expr.address);
  if (!types) {
    return absl::FailedPreconditionError(
        absl::StrCat("'", written, "' needs the target's types, and none are given"));
  }
  absl::StatusOr<TypeRef> type = types(cast);
  if (!type.ok()) {
    return ExprError(type.status().code(), expr.text, type.status().message(), cast.column);
  }
  Cursor cur;
  cur.addr = *expr.address;
  cur.has_type = true;
  cur.type = *type;
  cur.is_address = true;
  cur.display = written;
  cur.unary = true;
  if (cast.pointers > 0) {
    cur.pointers = cast.pointers - 1;
    return cur;
  }
  // A pointer typedef: (node_ptr)0x10 is (struct node *)0x10.
  const TypeRef s = StripType(*type);
  Dwarf_Die die = s.die;
  if (dwarf_tag(&die) == DW_TAG_pointer_type) {
    const std::optional<Dwarf_Die> pointee = TypeOf(die);
    if (!pointee.has_value()) {
      return ExprError(absl::StatusCode::kInvalidArgument, expr.text,
                       absl::StrCat(cast.name,
                                    " is a void pointer: cast the address to a pointer to the "
                                    "object's type"),
                       cast.column);
    }
    cur.type = TypeRef{*pointee, 0};
    return cur;
  }
  const std::string shown = TypeName(*type);
  const std::string pointer = absl::StrFormat("(%s *)0x%x", cast.Spelling(), *expr.address);
  if (!expr.steps.empty() && expr.steps[0].kind == ExprStep::Kind::kArrow) {
    return ExprError(absl::StatusCode::kInvalidArgument, expr.text,
                     absl::StrCat("'->' needs a pointer, and ", written, " is ", shown,
                                  ": cast to a pointer, (", pointer, ")->", expr.steps[0].member),
                     expr.steps[0].column);
  }
  return ExprError(absl::StatusCode::kInvalidArgument, expr.text,
                   absl::StrCat("an address casts to a pointer, and ", shown, " is not one: write ",
                                pointer, " for the ", shown, " at 0x", absl::Hex(*expr.address)),
                   expr.cast_column);
}

}  // namespace

absl::StatusOr<ResolvedExpr> ResolveExpr(const Expr& expr, const VariableLookup& lookup,
                                         const MemoryReader& read, const TypeLookup& types) {
  ResolvedExpr out;
  Cursor cur;
  uint64_t elf_size = 0;
  std::vector<PointerLoad> loads;
  if (expr.cast.has_value()) {
    KW_ASSIGN_OR_RETURN(cur, CastCursor(expr, types));
  } else if (expr.address.has_value()) {
    if (!expr.steps.empty()) {
      return absl::InvalidArgumentError(
          "an absolute address takes no members or indexes: write 0xADDR or 0xADDR:LEN");
    }
    out.display = absl::StrFormat("0x%x", *expr.address);
    out.addr = RemoteAddr{*expr.address};
    out.length = expr.length.value_or(8);
    return out;
  } else {
    if (expr.base.empty()) {
      return absl::InvalidArgumentError("empty expression: give a variable name or 0xADDR");
    }
    KW_ASSIGN_OR_RETURN(const ExprVariable var, lookup(expr.base));
    out.module = var.module;
    elf_size = var.elf_size;
    cur.addr = var.addr;
    cur.display = var.name;
    cur.has_type = var.type.has_value();
    if (var.type.has_value()) {
      cur.type = *var.type;
    }
  }
  cur.loads = &loads;
  for (const ExprStep& step : expr.steps) {
    KW_RETURN_IF_ERROR(Step(step, read, &cur));
  }
  out.pointers = std::move(loads);
  if (cur.is_address) {
    // kwatch watches objects: (struct T *)0x10 is the struct T at 0x10, *(struct T *)0x10.
    cur.is_address = false;
    cur.display = absl::StrCat("*", cur.display);
  }
  out.display = cur.display;
  out.addr = RemoteAddr{cur.addr};
  if (!cur.has_type) {
    if (elf_size == 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "'", cur.display,
          "' has no DWARF type and its ELF symbol has no size: give the length (--len), or "
          "build the program with -g"));
    }
    out.length = elf_size;
    return out;
  }
  out.type_name = ShownType(cur);
  if (cur.pointers > 0) {
    // A cast's `T **` object: one pointer.
    out.length = 8;
    TypeLayout layout;
    layout.type_name = out.type_name;
    layout.size = 8;
    FieldLayout f;
    f.type_name = out.type_name;
    f.size = 8;
    layout.fields.push_back(std::move(f));
    out.layout = std::move(layout);
    return out;
  }
  if (cur.bit_size != 0) {
    out.length = cur.bit_unit;
    TypeLayout layout;
    layout.type_name = out.type_name;
    layout.size = cur.bit_unit;
    FieldLayout f;
    f.type_name = out.type_name;
    f.size = cur.bit_unit;
    f.bit_offset = cur.bit_offset;
    f.bit_size = cur.bit_size;
    layout.fields.push_back(std::move(f));
    out.layout = std::move(layout);
    return out;
  }
  const std::optional<uint64_t> size = TypeSize(cur.type);
  if (!size.has_value() || *size == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the size of '", cur.display, "' (", out.type_name,
        ") is unknown (an incomplete type or a flexible array): give the length (--len)"));
  }
  out.length = *size;
  out.layout = FlattenLayout(cur.type);
  return out;
}

}  // namespace kwatch::core::symbols
