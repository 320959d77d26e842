#include "core/symbols/type_layout.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kwatch::core::symbols {

const FieldLayout* TypeLayout::LeafAt(uint64_t offset) const {
  const FieldLayout* best = nullptr;
  for (const FieldLayout& f : fields) {
    if (!f.is_leaf || offset < f.offset || offset - f.offset >= f.size) {
      continue;
    }
    // Deepest wins; among equals (union members, bitfields sharing a unit) the first.
    if (best == nullptr || f.depth > best->depth) {
      best = &f;
    }
  }
  return best;
}

int TypeLayout::AddWholeUnionRow() {
  FieldLayout f;
  f.type_name = type_name;
  f.size = size;
  f.is_leaf = false;
  f.is_union = true;
  fields.push_back(std::move(f));
  return 1;
}

std::string AnonymousUnionName(const std::vector<std::string>& members) {
  constexpr size_t kShown = 4;
  if (members.size() <= kShown) {
    return absl::StrCat("{", absl::StrJoin(members, ","), "}");
  }
  return absl::StrCat("{", absl::StrJoin(members.begin(), members.begin() + kShown, ","), ",...}");
}

std::vector<size_t> CountedFields(const std::vector<FieldLayout>& fields) {
  std::vector<size_t> out;
  for (size_t i = 0; i < fields.size(); ++i) {
    const FieldLayout& f = fields[i];
    if (f.is_union) {
      out.push_back(i);
      while (i + 1 < fields.size() && fields[i + 1].depth > f.depth) {
        ++i;  // its members, at any depth
      }
    } else if (f.is_leaf) {
      out.push_back(i);
    }
  }
  return out;
}

}  // namespace kwatch::core::symbols
