#include "core/symbols/type_layout.h"

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

}  // namespace kwatch::core::symbols
