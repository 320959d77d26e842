#include "watch/profile/value_history.h"

namespace kwatch::watch::profile {

std::vector<ValueSample> ValueRing::Samples() const {
  std::vector<ValueSample> out;
  out.reserve(samples_.size());
  for (size_t k = 0; k < samples_.size(); ++k) {
    const Packed& p = samples_[(head_ + k) % samples_.size()];
    ValueSample s;
    s.time_ns = p.time_ns;
    s.tid = p.tid;
    s.ip = core::RemoteAddr{p.ip};
    s.kind = p.kind;
    s.exact = (p.flags & kExact) != 0;
    s.value = p.value;
    if ((p.flags & kHasOld) != 0) {
      s.old_value = p.old_value;
    }
    out.push_back(s);
  }
  return out;
}

}  // namespace kwatch::watch::profile
