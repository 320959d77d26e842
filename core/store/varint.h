#pragma once

// LEB128 varints and zigzag-encoded signed values, for the compact forms of recordings: event
// and hit blocks (event_blocks.cc, hit_blocks.cc) and the profile snapshot
// (watch/profile/profile_codec.cc).

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace kwatch::core::store {

inline void PutVarint(std::string& s, uint64_t v) {
  while (v >= 0x80) {
    s.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  s.push_back(static_cast<char>(v));
}

// A signed value as a zigzag varint: small either way.
inline void PutZigzag(std::string& s, int64_t v) {
  PutVarint(s, (static_cast<uint64_t>(v) << 1) ^ static_cast<uint64_t>(v >> 63));
}

// The difference a - b (mod 2^64) as a zigzag varint: small either way.
inline void PutDelta(std::string& s, uint64_t a, uint64_t b) {
  PutZigzag(s, static_cast<int64_t>(a - b));
}

// `bytes` preceded by its length.
inline void PutBytes(std::string& s, absl::string_view bytes) {
  PutVarint(s, bytes.size());
  s.append(bytes.data(), bytes.size());
}

// Reads what PutVarint and PutZigzag wrote; each read is false at the end or on a malformed
// value, and leaves the output alone then.
class VarintReader {
 public:
  explicit VarintReader(absl::string_view s) : s_(s) {}
  bool U(uint64_t* v) {
    uint64_t out = 0;
    for (uint32_t shift = 0; shift < 64; shift += 7) {
      if (pos_ >= s_.size()) {
        return false;
      }
      const auto b = static_cast<uint8_t>(s_[pos_++]);
      out |= uint64_t{b & 0x7fU} << shift;
      if ((b & 0x80) == 0) {
        *v = out;
        return true;
      }
    }
    return false;
  }
  bool Zigzag(int64_t* v) {
    uint64_t u = 0;
    if (!U(&u)) {
      return false;
    }
    *v = static_cast<int64_t>((u >> 1) ^ (~(u & 1) + 1));
    return true;
  }
  // b + the delta PutDelta wrote (mod 2^64).
  bool Delta(uint64_t b, uint64_t* v) {
    int64_t d = 0;
    if (!Zigzag(&d)) {
      return false;
    }
    *v = b + static_cast<uint64_t>(d);
    return true;
  }
  // What PutBytes wrote (a view into the input).
  bool Bytes(absl::string_view* v) {
    uint64_t n = 0;
    if (!U(&n) || n > remaining()) {
      return false;
    }
    *v = s_.substr(pos_, static_cast<size_t>(n));
    pos_ += static_cast<size_t>(n);
    return true;
  }
  bool Byte(uint8_t* v) {
    if (pos_ >= s_.size()) {
      return false;
    }
    *v = static_cast<uint8_t>(s_[pos_++]);
    return true;
  }
  size_t remaining() const { return s_.size() - pos_; }
  bool done() const { return pos_ == s_.size(); }

 private:
  absl::string_view s_;
  size_t pos_ = 0;
};

}  // namespace kwatch::core::store
