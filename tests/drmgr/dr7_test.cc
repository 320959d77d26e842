#include "drmgr/dr7.h"

#include <random>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace kwatch::drmgr {
namespace {

using ::testing::HasSubstr;

uint64_t Encode(const Dr7& dr7) {
  absl::StatusOr<uint64_t> raw = EncodeDr7(dr7);
  EXPECT_TRUE(raw.ok()) << raw.status();
  return raw.value_or(0);
}

Dr7 WithSlot(int i, Dr7Slot slot) {
  Dr7 dr7;
  dr7.slots[i] = slot;
  return dr7;
}

TEST(Dr7, EmptyHasOnlyTheReservedBit) {
  EXPECT_EQ(Encode(Dr7{}), 0x400U);
}

// Bit layout: Li = bit 2i, Gi = bit 2i+1, R/Wi = bits 16+4i..17+4i, LENi = bits 18+4i..19+4i.
TEST(Dr7, KnownConstants) {
  // Slot 0, write, 4 bytes, local: L0 (0x1) | reserved (0x400) | R/W0=01 | LEN0=11.
  EXPECT_EQ(Encode(WithSlot(0, LocalSlot(DrKind::kWrite, 4))), 0x000D0401U);
  EXPECT_EQ(Encode(WithSlot(0, LocalSlot(DrKind::kWrite, 1))), 0x00010401U);
  EXPECT_EQ(Encode(WithSlot(0, LocalSlot(DrKind::kWrite, 2))), 0x00050401U);
  EXPECT_EQ(Encode(WithSlot(0, LocalSlot(DrKind::kWrite, 8))), 0x00090401U);
  EXPECT_EQ(Encode(WithSlot(0, LocalSlot(DrKind::kReadWrite, 8))), 0x000B0401U);
  // Slot 1 execute: L1 (0x4), R/W1 = LEN1 = 00.
  EXPECT_EQ(Encode(WithSlot(1, LocalSlot(DrKind::kExec, 1))), 0x00000404U);
  // Slot 2 read-write 1 byte: L2 (0x10), R/W2=11 at bits 24-25.
  EXPECT_EQ(Encode(WithSlot(2, LocalSlot(DrKind::kReadWrite, 1))), 0x03000410U);
  // Slot 3 read-write 8 bytes, global only: G3 (0x80), R/W3=11 at 28-29, LEN3=10 at 30-31.
  Dr7Slot g3{false, true, DrKind::kReadWrite, DrLen::k8};
  EXPECT_EQ(Encode(WithSlot(3, g3)), 0xB0000480U);
  // All four: write 4 @0, rw 2 @1, exec @2, write 8 @3.
  Dr7 all;
  all.slots = {LocalSlot(DrKind::kWrite, 4), LocalSlot(DrKind::kReadWrite, 2),
               LocalSlot(DrKind::kExec, 1), LocalSlot(DrKind::kWrite, 8)};
  EXPECT_EQ(Encode(all), 0x907D0455U);
}

TEST(Dr7, ControlBits) {
  Dr7 dr7;
  dr7.local_exact = true;
  dr7.global_exact = true;
  EXPECT_EQ(Encode(dr7), 0x700U);
  dr7 = Dr7{};
  dr7.general_detect = true;
  EXPECT_EQ(Encode(dr7), 0x2400U);
  dr7 = Dr7{};
  dr7.rtm = true;
  EXPECT_EQ(Encode(dr7), 0xC00U);
}

TEST(Dr7, ExecuteMustHaveLengthOne) {
  Dr7Slot bad{true, false, DrKind::kExec, DrLen::k8};
  absl::StatusOr<uint64_t> raw = EncodeDr7(WithSlot(2, bad));
  ASSERT_EQ(raw.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(raw.status().message()), HasSubstr("LEN=00"));
  // Decoding refuses it too: R/W0=00 with LEN0=11.
  EXPECT_EQ(DecodeDr7(0x000C0401).status().code(), absl::StatusCode::kInvalidArgument);
  // LocalSlot forces LEN=00 for execute.
  EXPECT_EQ(LocalSlot(DrKind::kExec, 8).len, DrLen::k1);
}

TEST(Dr7, DecodeRefusesIoAndReservedBits) {
  absl::StatusOr<Dr7> io = DecodeDr7(0x00020401);  // R/W0=10
  ASSERT_FALSE(io.ok());
  EXPECT_THAT(std::string(io.status().message()), HasSubstr("I/O breakpoint"));
  EXPECT_FALSE(DecodeDr7(0x1400).ok());  // bit 12
  EXPECT_FALSE(DecodeDr7(0x4400).ok());  // bit 14
  EXPECT_FALSE(DecodeDr7(0x8400).ok());  // bit 15
  EXPECT_FALSE(DecodeDr7(uint64_t{1} << 32 | 0x400).ok());
  EXPECT_TRUE(DecodeDr7(0x000D0001).ok());  // bit 10 clear is accepted
}

TEST(Dr7, DecodeKnownValue) {
  absl::StatusOr<Dr7> dr7 = DecodeDr7(0x907D0455);
  ASSERT_TRUE(dr7.ok()) << dr7.status();
  EXPECT_EQ(dr7->slots[0], LocalSlot(DrKind::kWrite, 4));
  EXPECT_EQ(dr7->slots[1], LocalSlot(DrKind::kReadWrite, 2));
  EXPECT_EQ(dr7->slots[2], LocalSlot(DrKind::kExec, 1));
  EXPECT_EQ(dr7->slots[3], LocalSlot(DrKind::kWrite, 8));
  EXPECT_EQ(DrLenBytes(dr7->slots[3].len), 8U);
}

std::vector<Dr7Slot> AllSlots() {
  std::vector<Dr7Slot> out;
  for (bool l : {false, true}) {
    for (bool g : {false, true}) {
      for (DrKind k : {DrKind::kExec, DrKind::kWrite, DrKind::kReadWrite}) {
        for (DrLen len : {DrLen::k1, DrLen::k2, DrLen::k4, DrLen::k8}) {
          if (k == DrKind::kExec && len != DrLen::k1) {
            continue;
          }
          out.push_back(Dr7Slot{l, g, k, len});
        }
      }
    }
  }
  return out;
}

TEST(Dr7, RoundTripsEverySlotValue) {
  for (int i = 0; i < kNumDebugRegisters; ++i) {
    for (const Dr7Slot& s : AllSlots()) {
      const Dr7 dr7 = WithSlot(i, s);
      const uint64_t raw = Encode(dr7);
      absl::StatusOr<Dr7> back = DecodeDr7(raw);
      ASSERT_TRUE(back.ok()) << back.status();
      EXPECT_EQ(*back, dr7) << std::hex << raw;
      // Each slot only touches its own bits.
      const uint64_t own = (uint64_t{3} << (2 * i)) | (uint64_t{0xF} << (16 + 4 * i));
      EXPECT_EQ(raw & ~own, 0x400U) << i;
    }
  }
}

TEST(Dr7, RoundTripsRandomCombinations) {
  const std::vector<Dr7Slot> slots = AllSlots();
  std::mt19937 rng(7);
  for (int n = 0; n < 5000; ++n) {
    Dr7 dr7;
    for (auto& s : dr7.slots) {
      s = slots[rng() % slots.size()];
    }
    dr7.local_exact = rng() % 2 != 0;
    dr7.global_exact = rng() % 2 != 0;
    dr7.rtm = rng() % 2 != 0;
    dr7.general_detect = rng() % 2 != 0;
    const uint64_t raw = Encode(dr7);
    absl::StatusOr<Dr7> back = DecodeDr7(raw);
    ASSERT_TRUE(back.ok());
    ASSERT_EQ(*back, dr7);
    ASSERT_EQ(Encode(*back), raw);
  }
}

TEST(Dr6, KnownValues) {
  EXPECT_EQ(EncodeDr6(Dr6{}), 0xFFFF0FF0U);
  EXPECT_TRUE(DecodeDr6(0xFFFF0FF0).Spurious());
  Dr6 b2 = DecodeDr6(0xFFFF0FF4);
  EXPECT_TRUE(b2.hit[2]);
  EXPECT_FALSE(b2.hit[0] || b2.hit[1] || b2.hit[3]);
  EXPECT_FALSE(b2.Spurious());
  EXPECT_FALSE(b2.in_rtm);
  EXPECT_TRUE(DecodeDr6(0xFFFF4FF0).single_step);
  EXPECT_TRUE(DecodeDr6(0xFFFF2FF0).debug_register_access);
  EXPECT_TRUE(DecodeDr6(0xFFFF8FF0).task_switch);
  EXPECT_TRUE(DecodeDr6(0xFFFE0FF1).in_rtm);
  Dr6 d;
  d.hit[0] = d.hit[3] = true;
  d.single_step = true;
  EXPECT_EQ(EncodeDr6(d), 0xFFFF4FF9U);
}

TEST(Dr6, RoundTripsAllCauseBits) {
  for (uint32_t bits = 0; bits < 256; ++bits) {
    Dr6 d;
    for (int i = 0; i < 4; ++i) {
      d.hit[i] = (bits >> i & 1) != 0;
    }
    d.debug_register_access = (bits & 16) != 0;
    d.single_step = (bits & 32) != 0;
    d.task_switch = (bits & 64) != 0;
    d.in_rtm = (bits & 128) != 0;
    EXPECT_EQ(DecodeDr6(EncodeDr6(d)), d) << bits;
    EXPECT_EQ(d.Spurious(), (bits & 127) == 0);
  }
}

}  // namespace
}  // namespace kwatch::drmgr
