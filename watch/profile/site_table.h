#pragma once

#include <cstdint>
#include <vector>

#include "core/base/remote_addr.h"

namespace kwatch::watch::profile {

// Read and write counts.
struct RwCounts {
  uint64_t reads = 0;
  uint64_t writes = 0;

  uint64_t total() const { return reads + writes; }
  void Add(bool write) {
    if (write) {
      ++writes;
    } else {
      ++reads;
    }
  }
  RwCounts& operator+=(const RwCounts& o) {
    reads += o.reads;
    writes += o.writes;
    return *this;
  }
  bool operator==(const RwCounts&) const = default;
};

// Accesses made by one instruction.
struct SiteCount {
  core::RemoteAddr ip;  // the accessing instruction (absolute run-time address)
  RwCounts counts;
};

// Counts per accessing instruction, bounded: the first `capacity` distinct IPs get exact
// counts, the accesses of any further IP are summed in other(). So a ranking is exact unless
// other() is non-zero (then an IP seen late may be missing from it). Memory: none until the
// first Add, then 24 bytes x the next power of two >= 2 x capacity. Add is O(1) expected
// (open addressing, load factor <= 1/2), with no allocation after the first. IP
// 0xffffffffffffffff is counted in other(). Copyable; not thread-safe.
class SiteTable {
 public:
  SiteTable() = default;
  explicit SiteTable(uint32_t capacity) : capacity_(capacity) {}

  void Add(core::RemoteAddr ip, bool write) {
    if (slots_.empty()) {
      if (capacity_ == 0 || ip.value == kEmpty) {
        other_.Add(write);
        return;
      }
      Allocate();
    }
    size_t i = Hash(ip.value);
    for (;;) {
      Slot& s = slots_[i];
      if (s.ip == ip.value) {
        s.counts.Add(write);
        return;
      }
      if (s.ip == kEmpty) {
        if (used_ == capacity_ || ip.value == kEmpty) {
          other_.Add(write);
          return;
        }
        s.ip = ip.value;
        ++used_;
        s.counts.Add(write);
        return;
      }
      i = (i + 1) & mask_;
    }
  }

  // The tracked IPs by total count, descending (ties: lower IP first).
  std::vector<SiteCount> Ranked() const;
  friend class ProfileCodec;
  // Accesses of IPs beyond the capacity.
  const RwCounts& other() const { return other_; }
  // Distinct IPs with exact counts (<= capacity()).
  uint32_t size() const { return used_; }
  uint32_t capacity() const { return capacity_; }

 private:
  static constexpr uint64_t kEmpty = ~0ULL;
  struct Slot {
    uint64_t ip = kEmpty;
    RwCounts counts;
  };

  size_t Hash(uint64_t ip) const {
    return static_cast<size_t>((ip * 0x9E3779B97F4A7C15ULL) >> shift_) & mask_;
  }
  void Allocate();

  std::vector<Slot> slots_;
  uint32_t capacity_ = 0;
  uint32_t used_ = 0;
  uint32_t shift_ = 63;
  size_t mask_ = 0;
  RwCounts other_;
};

}  // namespace kwatch::watch::profile
