#include "gui/heat_color.h"

namespace kwatch::gui {

namespace {

QColor FromRgb(uint32_t rgb) {
  return {static_cast<int>((rgb >> 16) & 0xff), static_cast<int>((rgb >> 8) & 0xff),
          static_cast<int>(rgb & 0xff)};
}

}  // namespace

QColor HeatColor(uint64_t count, uint64_t max, Scale s) {
  return FromRgb(watch::profile::HeatRgb(count, max, s));
}

QColor HeatRampColor(double position) {
  return FromRgb(watch::profile::HeatRampRgb(position));
}

QColor EmptyHeatColor() {
  return FromRgb(watch::profile::kEmptyHeatRgb);
}

}  // namespace kwatch::gui
