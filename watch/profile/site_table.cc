#include "watch/profile/site_table.h"

#include <algorithm>
#include <bit>

namespace kwatch::watch::profile {

void SiteTable::Allocate() {
  const size_t n = std::bit_ceil(static_cast<size_t>(capacity_) * 2);
  slots_.assign(n, Slot{});
  mask_ = n - 1;
  shift_ = static_cast<uint32_t>(64 - std::countr_zero(n));
  if (shift_ >= 64) {  // n == 1 cannot happen (capacity >= 1 gives n >= 2), but keep shifts defined
    shift_ = 63;
  }
}

std::vector<SiteCount> SiteTable::Ranked() const {
  std::vector<SiteCount> out;
  out.reserve(used_);
  for (const Slot& s : slots_) {
    if (s.ip != kEmpty) {
      out.push_back({core::RemoteAddr{s.ip}, s.counts});
    }
  }
  std::sort(out.begin(), out.end(), [](const SiteCount& a, const SiteCount& b) {
    if (a.counts.total() != b.counts.total()) {
      return a.counts.total() > b.counts.total();
    }
    return a.ip < b.ip;
  });
  return out;
}

}  // namespace kwatch::watch::profile
