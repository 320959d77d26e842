#pragma once

// DWARF type helpers for core/symbols.cc (private to core/): C spelling of types, sizes,
// struct members and bitfields, array shapes, and flattened layouts. All DIEs must come
// from a Dwarf that outlives the calls (the owning Dwfl).

#include <elfutils/libdw.h>
#include <elfutils/libdwfl.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/symbols/type_layout.h"

namespace kwatch::core::symbols {

// Ends a Dwfl, forgetting what StripType learned of its modules' types.
struct DwflDeleter {
  void operator()(Dwfl* dwfl) const;
};
using DwflPtr = std::unique_ptr<Dwfl, DwflDeleter>;

// A DWARF type. For an array type, `skip_dims` leading dimensions have been indexed away
// (`int m[3][4]` indexed once is `int[4]`, same DIE with skip_dims = 1).
struct TypeRef {
  Dwarf_Die die{};
  int skip_dims = 0;
};

// The DIE named by `die`'s DW_AT_type (following DW_AT_abstract_origin/specification);
// nullopt for void.
std::optional<Dwarf_Die> TypeOf(Dwarf_Die die);

// DW_AT_name (integrated), or "" when the DIE has none.
std::string DieName(Dwarf_Die die);

// Follows typedefs and const/volatile/restrict/atomic qualifiers to the underlying type; a
// struct, union or class only declared there (an opaque handle) becomes its definition from
// another unit of the same debug info, found by name as gdb does. A TypeRef's skip_dims is
// kept (it only applies to an array DIE).
TypeRef StripType(const TypeRef& type);

// The DWARF tag of the stripped type.
int StrippedTag(const TypeRef& type);

// C spelling: "long", "unsigned int", "char[8]", "struct stats", "struct line *".
std::string TypeName(const TypeRef& type);

// Size in bytes, nullopt when unknown (incomplete types, flexible arrays).
std::optional<uint64_t> TypeSize(const TypeRef& type);

// Number of elements per dimension of an array DIE (nullopt: unknown bound).
std::vector<std::optional<uint64_t>> ArrayDims(Dwarf_Die array);

// The element type after indexing `array` (a stripped array TypeRef) once.
std::optional<TypeRef> ArrayElement(const TypeRef& array);

// The type called `name` (a C or C++ type name, qualified for C++; any spelling that
// CanonicalTypeName makes the same) with DWARF tag `tag` (DW_TAG_structure_type also finds a
// class, and the reverse; DW_TAG_union_type, DW_TAG_enumeration_type, DW_TAG_typedef,
// DW_TAG_base_type) in the units of `dwarf`: a complete definition (the first unit's), else,
// with `declarations`, a declaration. Units are scanned as far as needed, and remembered
// until the owning Dwfl ends.
std::optional<Dwarf_Die> FindNamedType(Dwarf* dwarf, int tag, std::string_view name,
                                       bool declarations);

// The canonical names of all the types of `dwarf` with tag `tag` (for near matches; scans
// every unit).
std::vector<std::string> NamedTypeNames(Dwarf* dwarf, int tag);

// One data member of a struct, union or class, with its offset resolved.
struct MemberInfo {
  std::string name;  // "" for anonymous members and base classes
  bool has_type = false;
  TypeRef type;
  uint64_t offset = 0;      // bytes from the start of the enclosing object
  uint64_t size = 0;        // bytes (for a bitfield: its storage unit)
  uint32_t bit_offset = 0;  // first bit within the storage unit (little-endian numbering)
  uint32_t bit_size = 0;    // 0 unless a bitfield
};

// The data members of a struct/union/class DIE in declaration order (anonymous members and
// base classes included with an empty name).
std::vector<MemberInfo> Members(Dwarf_Die aggregate);

// Finds `name` in `aggregate`, looking through anonymous members and base classes (the
// offset is then relative to `aggregate`). nullopt when absent.
std::optional<MemberInfo> FindMember(Dwarf_Die aggregate, std::string_view name);

// Names of the members reachable with '.', in layout order (through anonymous members).
std::vector<std::string> MemberNames(Dwarf_Die aggregate);

// Flattened layout of `type`: aggregate members in layout order (parents before members),
// arrays of up to kMaxExpandedElements elements element by element (arrays of characters
// stay one field), at most kMaxLayoutFields fields (beyond that, aggregates stay whole).
// A scalar (or an aggregate that is not expanded) gives one field with path "".
inline constexpr uint64_t kMaxExpandedElements = 64;
inline constexpr size_t kMaxLayoutFields = 4096;
TypeLayout FlattenLayout(const TypeRef& type);

}  // namespace kwatch::core::symbols
