#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <utility>

namespace kwatch::core {

// Owns one mmap()ed region and unmaps it on destruction. Move-only.
class UniqueMmap {
 public:
  UniqueMmap() = default;
  UniqueMmap(void* addr, size_t size) : addr_(addr), size_(size) {}
  UniqueMmap(const UniqueMmap&) = delete;
  UniqueMmap& operator=(const UniqueMmap&) = delete;
  UniqueMmap(UniqueMmap&& other) noexcept
      : addr_(std::exchange(other.addr_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  UniqueMmap& operator=(UniqueMmap&& other) noexcept {
    if (this != &other) {
      Reset();
      addr_ = std::exchange(other.addr_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  ~UniqueMmap() { Reset(); }

  void* get() const { return addr_; }
  size_t size() const { return size_; }
  bool valid() const { return addr_ != nullptr; }

  void Reset() {
    if (addr_ != nullptr) {
      ::munmap(addr_, size_);
    }
    addr_ = nullptr;
    size_ = 0;
  }

 private:
  void* addr_ = nullptr;
  size_t size_ = 0;
};

}  // namespace kwatch::core
