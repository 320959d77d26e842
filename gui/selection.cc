#include "gui/selection.h"

namespace kwatch::gui {

std::vector<uint32_t> SelectedFields(const Selection& sel,
                                     const watch::profile::StorageProfile& p) {
  std::vector<uint32_t> out;
  if (sel.object >= p.objects().size()) {
    return out;
  }
  const auto [first, last] = p.FieldRange(sel.object);
  if (sel.fields.empty()) {
    for (uint32_t f = first; f < last; ++f) {
      out.push_back(f);
    }
    return out;
  }
  for (uint32_t f : sel.fields) {
    if (f >= first && f < last) {
      out.push_back(f);
    }
  }
  return out;
}

}  // namespace kwatch::gui
