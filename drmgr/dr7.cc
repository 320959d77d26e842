#include "drmgr/dr7.h"

#include "absl/strings/str_format.h"

namespace kwatch::drmgr {
namespace {

constexpr int kLocalExactBit = 8;
constexpr int kGlobalExactBit = 9;
constexpr int kRtmBit = 11;
constexpr int kGeneralDetectBit = 13;
// Bits 12, 14 and 15 and the upper half must be zero (MOV to DR7 faults otherwise).
constexpr uint64_t kDr7MustBeZero =
    (uint64_t{1} << 12) | (uint64_t{1} << 14) | (uint64_t{1} << 15) | 0xFFFFFFFF00000000ULL;

constexpr int RwShift(int slot) {
  return 16 + (4 * slot);
}
constexpr int LenShift(int slot) {
  return 18 + (4 * slot);
}
constexpr uint64_t Bit(int n) {
  return uint64_t{1} << n;
}

}  // namespace

Dr7Slot LocalSlot(DrKind kind, uint64_t len) {
  Dr7Slot s;
  s.local = true;
  s.kind = kind;
  s.len = kind == DrKind::kExec ? DrLen::k1 : EncodeLen(len);
  return s;
}

uint64_t DrLenBytes(DrLen len) {
  switch (len) {
    case DrLen::k1:
      return 1;
    case DrLen::k2:
      return 2;
    case DrLen::k4:
      return 4;
    case DrLen::k8:
      return 8;
  }
  return 1;
}

absl::StatusOr<uint64_t> EncodeDr7(const Dr7& dr7) {
  uint64_t raw = kDr7ReservedOne;
  for (int i = 0; i < kNumDebugRegisters; ++i) {
    const Dr7Slot& s = dr7.slots[i];
    if (s.kind == DrKind::kExec && s.len != DrLen::k1) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "DR7 slot %d: an execute breakpoint must have LEN=00 (1 byte), not %d bytes", i,
          DrLenBytes(s.len)));
    }
    if (s.local) {
      raw |= Bit(2 * i);
    }
    if (s.global) {
      raw |= Bit((2 * i) + 1);
    }
    raw |= static_cast<uint64_t>(s.kind) << RwShift(i);
    raw |= static_cast<uint64_t>(s.len) << LenShift(i);
  }
  if (dr7.local_exact) {
    raw |= Bit(kLocalExactBit);
  }
  if (dr7.global_exact) {
    raw |= Bit(kGlobalExactBit);
  }
  if (dr7.rtm) {
    raw |= Bit(kRtmBit);
  }
  if (dr7.general_detect) {
    raw |= Bit(kGeneralDetectBit);
  }
  return raw;
}

absl::StatusOr<Dr7> DecodeDr7(uint64_t raw) {
  if ((raw & kDr7MustBeZero) != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "DR7 0x%x sets reserved bits 0x%x that must be zero", raw, raw & kDr7MustBeZero));
  }
  Dr7 dr7;
  for (int i = 0; i < kNumDebugRegisters; ++i) {
    Dr7Slot& s = dr7.slots[i];
    s.local = (raw & Bit(2 * i)) != 0;
    s.global = (raw & Bit((2 * i) + 1)) != 0;
    const uint64_t rw = (raw >> RwShift(i)) & 3;
    const uint64_t len = (raw >> LenShift(i)) & 3;
    if (rw == 2) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "DR7 0x%x: slot %d is an I/O breakpoint (R/W=10), which kwatch does not use", raw, i));
    }
    s.kind = static_cast<DrKind>(rw);
    s.len = static_cast<DrLen>(len);
    if (s.kind == DrKind::kExec && s.len != DrLen::k1) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "DR7 0x%x: slot %d is an execute breakpoint with LEN=%d; it must be 00", raw, i, len));
    }
  }
  dr7.local_exact = (raw & Bit(kLocalExactBit)) != 0;
  dr7.global_exact = (raw & Bit(kGlobalExactBit)) != 0;
  dr7.rtm = (raw & Bit(kRtmBit)) != 0;
  dr7.general_detect = (raw & Bit(kGeneralDetectBit)) != 0;
  return dr7;
}

bool Dr6::Spurious() const {
  for (bool b : hit) {
    if (b) {
      return false;
    }
  }
  return !debug_register_access && !single_step && !task_switch;
}

Dr6 DecodeDr6(uint64_t raw) {
  Dr6 dr6;
  for (int i = 0; i < kNumDebugRegisters; ++i) {
    dr6.hit[i] = (raw & Bit(i)) != 0;
  }
  dr6.debug_register_access = (raw & Bit(13)) != 0;
  dr6.single_step = (raw & Bit(14)) != 0;
  dr6.task_switch = (raw & Bit(15)) != 0;
  dr6.in_rtm = (raw & Bit(16)) == 0;
  return dr6;
}

uint64_t EncodeDr6(const Dr6& dr6) {
  uint64_t raw = kDr6ReservedOnes;
  for (int i = 0; i < kNumDebugRegisters; ++i) {
    if (dr6.hit[i]) {
      raw |= Bit(i);
    }
  }
  if (dr6.debug_register_access) {
    raw |= Bit(13);
  }
  if (dr6.single_step) {
    raw |= Bit(14);
  }
  if (dr6.task_switch) {
    raw |= Bit(15);
  }
  if (dr6.in_rtm) {
    raw &= ~Bit(16);
  }
  return raw;
}

}  // namespace kwatch::drmgr
