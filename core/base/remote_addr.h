#pragma once

#include <compare>
#include <cstdint>
#include <functional>

namespace kwatch::core {

// An address in the target's address space (a tracee or the kernel), never dereferenced here.
struct RemoteAddr {
  uint64_t value = 0;

  // NOLINTNEXTLINE(modernize-use-nullptr): clang-tidy 14 bug (llvm-project#53961)
  auto operator<=>(const RemoteAddr&) const = default;
  RemoteAddr operator+(uint64_t off) const { return RemoteAddr{value + off}; }
  RemoteAddr operator-(uint64_t off) const { return RemoteAddr{value - off}; }
  uint64_t operator-(RemoteAddr other) const { return value - other.value; }

  template <typename H>
  friend H AbslHashValue(H h, RemoteAddr a) {
    return H::combine(std::move(h), a.value);
  }
};

}  // namespace kwatch::core

template <>
struct std::hash<kwatch::core::RemoteAddr> {
  size_t operator()(kwatch::core::RemoteAddr a) const noexcept {
    return std::hash<uint64_t>{}(a.value);
  }
};
