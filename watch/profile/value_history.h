#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "core/base/remote_addr.h"
#include "core/event.h"

namespace kwatch::watch::profile {

// One value of a field seen by an access (read: the value read; write: the value written).
struct ValueSample {
  uint64_t time_ns = 0;  // CLOCK_MONOTONIC
  pid_t tid = 0;
  core::RemoteAddr ip;  // the accessing instruction
  core::AccessKind kind = core::AccessKind::kWrite;
  bool exact = false;                 // AccessEvent::value_exact
  uint64_t value = 0;                 // the field's bits, zero-extended (bitfields shifted down)
  std::optional<uint64_t> old_value;  // before the access, when the backend knew it
};

// The last `capacity` samples of one field (a ring). Push is O(1) and stores 40 bytes; storage
// grows with the first `capacity` pushes and never after. Copyable; not thread-safe.
class ValueRing {
 public:
  ValueRing() = default;
  explicit ValueRing(size_t capacity) : capacity_(capacity) {}

  void Push(uint64_t time_ns, pid_t tid, core::RemoteAddr ip, core::AccessKind kind, bool exact,
            uint64_t value, bool has_old, uint64_t old_value) {
    if (capacity_ == 0) {
      return;
    }
    ++pushed_;
    Packed* p = nullptr;
    if (samples_.size() < capacity_) {
      p = &samples_.emplace_back();
    } else {
      p = &samples_[head_];
      head_ = head_ + 1 == capacity_ ? 0 : head_ + 1;
    }
    p->time_ns = time_ns;
    p->ip = ip.value;
    p->value = value;
    p->old_value = has_old ? old_value : 0;
    p->tid = tid;
    p->kind = kind;
    p->flags = static_cast<uint8_t>((exact ? kExact : 0) | (has_old ? kHasOld : 0));
  }

  // Oldest first.
  std::vector<ValueSample> Samples() const;
  friend class ProfileCodec;
  // Samples ever pushed (>= the number kept).
  uint64_t pushed() const { return pushed_; }
  size_t capacity() const { return capacity_; }

 private:
  static constexpr uint8_t kExact = 1;
  static constexpr uint8_t kHasOld = 2;
  struct Packed {
    uint64_t time_ns = 0;
    uint64_t ip = 0;
    uint64_t value = 0;
    uint64_t old_value = 0;
    pid_t tid = 0;
    core::AccessKind kind = core::AccessKind::kWrite;
    uint8_t flags = 0;
  };

  size_t capacity_ = 0;
  size_t head_ = 0;  // oldest sample once the ring is full
  uint64_t pushed_ = 0;
  std::vector<Packed> samples_;
};

}  // namespace kwatch::watch::profile
