#include "watch/kernel/drain_values.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <span>

namespace kwatch::watch::kernel {

void DrainValues::NewBatch() {
  std::fill(values_.begin(), values_.end(), std::nullopt);
}

DrainValues::Value DrainValues::Get(size_t i, const KernelWatch& w) {
  Value out;
  if (memory_ == nullptr) {
    return out;
  }
  if (!values_[i].has_value()) {
    std::array<uint8_t, 8> buf{};
    const absl::Status st =
        memory_->Read(w.addr, std::span<uint8_t>(buf).first(std::min<size_t>(w.len, 8)));
    if (st.ok()) {
      uint64_t v = 0;
      std::memcpy(&v, buf.data(), buf.size());  // x86-64: little-endian
      values_[i] = v;
    } else {
      values_[i] = std::optional<uint64_t>();
      if (!failed_[i]) {
        failed_[i] = true;
        out.first_failure = st;
      }
    }
  }
  out.value = *values_[i];
  return out;
}

}  // namespace kwatch::watch::kernel
