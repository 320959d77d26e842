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
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "core/base/status_macros.h"
#include "core/symbols/symbol_match.h"
#include "core/symbols/type_layout.h"

namespace kwatch::core::symbols {
namespace {

struct Cursor {
  uint64_t addr = 0;
  bool has_type = false;
  TypeRef type;
  uint64_t bit_unit = 0;  // bitfields only: bytes of the storage unit
  uint32_t bit_offset = 0;
  uint32_t bit_size = 0;
  std::string display;
};

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
  const uint64_t size = std::min<uint64_t>(TypeSize(cur.type).value_or(8), 8);
  std::array<uint8_t, 8> buf{};
  const absl::Status s = read(RemoteAddr{cur.addr}, std::span<uint8_t>(buf.data(), size));
  if (!s.ok()) {
    return absl::Status(s.code(), absl::StrFormat("reading the pointer '%s' at 0x%x: %s",
                                                  cur.display, cur.addr, s.message()));
  }
  uint64_t value = 0;
  std::memcpy(&value, buf.data(), sizeof(value));  // x86-64: little-endian
  return value;
}

absl::Status NullPointer(const Cursor& cur) {
  return absl::FailedPreconditionError(
      absl::StrCat("'", cur.display, "' is NULL: there is nothing to watch behind it yet"));
}

// For '->' and '*': follows the pointer `cur` holds (read from the target), or takes the
// first element of an array (a->m is a[0].m). `s` is cur's type without typedefs and
// qualifiers. `void_pointer` and `not_pointer` end the messages for those two mistakes.
absl::Status Dereference(const MemoryReader& read, const TypeRef& s, absl::string_view void_pointer,
                         absl::string_view not_pointer, Cursor* cur) {
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

absl::Status MemberStep(const ExprStep& step, const MemoryReader& read, Cursor* cur) {
  const bool arrow = step.kind == ExprStep::Kind::kArrow;
  TypeRef s = StripType(cur->type);
  int tag = dwarf_tag(&s.die);
  const std::string shown_type = TypeName(cur->type);
  if (arrow) {
    KW_RETURN_IF_ERROR(Dereference(read, s, "'->' needs a pointer to a struct or union",
                                   absl::StrCat("use '", cur->display, ".", step.member, "'"),
                                   cur));
    s = StripType(cur->type);
    tag = dwarf_tag(&s.die);
  } else if (tag == DW_TAG_pointer_type) {
    return absl::InvalidArgumentError(absl::StrCat("'", cur->display, "' is a pointer (",
                                                   shown_type, "): use '", cur->display, "->",
                                                   step.member, "'"));
  }
  const std::string container = TypeName(cur->type);
  if (tag != DW_TAG_structure_type && tag != DW_TAG_union_type && tag != DW_TAG_class_type) {
    return absl::InvalidArgumentError(absl::StrCat("'", cur->display, "' is ", container,
                                                   ", not a struct or union: it has no member '",
                                                   step.member, "'"));
  }
  const std::optional<MemberInfo> m = FindMember(s.die, step.member);
  if (!m.has_value()) {
    const std::vector<std::string> names = MemberNames(s.die);
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
  absl::StrAppend(&cur->display, arrow ? "->" : ".", step.member);
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
  const TypeRef s = StripType(cur->type);
  Dwarf_Die die = s.die;
  const int tag = dwarf_tag(&die);
  const std::string shown_type = TypeName(cur->type);
  if (step.kind == ExprStep::Kind::kDeref) {
    KW_RETURN_IF_ERROR(
        Dereference(read, s, "'*' needs a typed pointer", "it cannot take '*'", cur));
    cur->display = absl::StrCat("*", cur->display);
    return absl::OkStatus();
  }
  // kIndex
  if (step.index < 0) {
    return absl::InvalidArgumentError(absl::StrCat("index ", step.index, " of '", cur->display,
                                                   "' is negative: indexes start at 0"));
  }
  const auto index = static_cast<uint64_t>(step.index);
  if (tag == DW_TAG_array_type) {
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
  absl::StrAppend(&cur->display, "[", index, "]");
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ResolvedExpr> ResolveExpr(const Expr& expr, const VariableLookup& lookup,
                                         const MemoryReader& read) {
  ResolvedExpr out;
  if (expr.address.has_value()) {
    if (!expr.steps.empty()) {
      return absl::InvalidArgumentError(
          "an absolute address takes no members or indexes: write 0xADDR or 0xADDR:LEN");
    }
    out.display = absl::StrFormat("0x%x", *expr.address);
    out.addr = RemoteAddr{*expr.address};
    out.length = expr.length.value_or(8);
    return out;
  }
  if (expr.base.empty()) {
    return absl::InvalidArgumentError("empty expression: give a variable name or 0xADDR");
  }
  KW_ASSIGN_OR_RETURN(const ExprVariable var, lookup(expr.base));
  out.module = var.module;
  const uint64_t elf_size = var.elf_size;
  Cursor cur;
  cur.addr = var.addr;
  cur.display = var.name;
  cur.has_type = var.type.has_value();
  if (var.type.has_value()) {
    cur.type = *var.type;
  }
  for (const ExprStep& step : expr.steps) {
    KW_RETURN_IF_ERROR(Step(step, read, &cur));
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
  out.type_name = TypeName(cur.type);
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
