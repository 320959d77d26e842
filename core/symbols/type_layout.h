#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kwatch::core::symbols {

// One field of a flattened type layout. Paths are relative to the watched object's display
// name: "" for the object itself, ".hits", ".lines[3].tag", "[2]". Bitfields are their own
// fields (bit_size > 0).
struct FieldLayout {
  std::string path;         // e.g. ".stats.hits"
  std::string type_name;    // C spelling, e.g. "unsigned long", "char[8]", "struct line"
  uint64_t offset = 0;      // bytes from the object's start
  uint64_t size = 0;        // bytes (for a bitfield: its storage unit)
  uint32_t bit_offset = 0;  // bitfields: first bit within the storage at `offset`
  uint32_t bit_size = 0;    // 0 unless a bitfield
  int depth = 0;            // nesting depth, 0 for members of the object itself
  bool is_leaf = true;      // false for aggregates (structs, unions, arrays of aggregates)
  // A union (named, or anonymous: then its path is the parent's followed by its members'
  // names in braces, ".{i,f}", as gdb prints it, and its members keep the parent's path).
  // Its members overlap: an access to them is counted once, on the union (CountedFields).
  bool is_union = false;
};

// A structure's layout flattened in layout order (parents before their members).
struct TypeLayout {
  std::string type_name;
  uint64_t size = 0;
  std::vector<FieldLayout> fields;

  // The deepest leaf field containing byte `offset` (nullptr if none, e.g. padding).
  const FieldLayout* LeafAt(uint64_t offset) const;

  // For a watched union: appends the object's own row (path "", counted once, not a leaf) that
  // its members hang under; returns their depth, 1.
  int AddWholeUnionRow();
};

// The indices into `fields` (a flattened layout, parents before their members) of the fields
// accesses are counted on, in order: every leaf, except that a union counts as one field
// whatever it holds (which alternative an access meant, the hardware cannot tell), its
// members not counted apart.
std::vector<size_t> CountedFields(const std::vector<FieldLayout>& fields);

// The path element of an anonymous union: its members' names in braces, "{i,f}", the first
// four of them ("{a,b,c,d,...}").
std::string AnonymousUnionName(const std::vector<std::string>& members);

}  // namespace kwatch::core::symbols
