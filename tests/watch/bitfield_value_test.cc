#include "watch/bitfield_value.h"

#include <cstdint>

#include <gtest/gtest.h>

#include "watch/condition.h"

namespace kwatch::watch {
namespace {

core::symbols::ResolvedExpr Target(uint64_t addr, uint32_t bit_offset, uint32_t bit_size,
                                   const char* type = "unsigned int") {
  core::symbols::ResolvedExpr t;
  t.display = "s.mode";
  t.addr = core::RemoteAddr{addr};
  t.length = 4;
  t.type_name = type;
  core::symbols::TypeLayout layout;
  layout.type_name = type;
  layout.size = 4;
  layout.fields.push_back({"", type, 0, 4, bit_offset, bit_size, 0, true});
  t.layout = layout;
  return t;
}

core::AccessEvent Store(uint64_t at, uint32_t size, uint64_t old_value, uint64_t value) {
  core::AccessEvent ev;
  ev.addr = core::RemoteAddr{0x1000};
  ev.len = 4;
  ev.access_addr = core::RemoteAddr{at};
  ev.access_size = size;
  ev.kind = core::AccessKind::kWrite;
  ev.value = value;
  ev.old_value = old_value;
  return ev;
}

TEST(Bitfield, OnlyAWatchOnOneBitfieldIsDecoded) {
  EXPECT_TRUE(WatchedBitfield(Target(0x1000, 16, 3)).has_value());
  EXPECT_FALSE(WatchedBitfield(Target(0x1000, 0, 0)).has_value());  // a plain int
  core::symbols::ResolvedExpr two = Target(0x1000, 16, 3);
  two.layout->fields.push_back({".ready", "unsigned int", 0, 4, 19, 1, 0, true});
  EXPECT_FALSE(WatchedBitfield(two).has_value());  // a structure's fields are labelled
  core::symbols::ResolvedExpr raw = Target(0x1000, 16, 3);
  raw.layout.reset();
  EXPECT_FALSE(WatchedBitfield(raw).has_value());
}

TEST(Bitfield, TheBitsAreTakenFromWhereverTheAccessHoldsThem) {
  const BitfieldPlace mode = *WatchedBitfield(Target(0x1000, 16, 3));
  // A byte store at 0x1002 of 9: mode (bits 16..18 of the unit) = 1, the next bit set too.
  EXPECT_EQ(BitfieldIn(mode, 0x1002, 1, 9), 1u);
  // A 4-byte store of the whole unit.
  EXPECT_EQ(BitfieldIn(mode, 0x1000, 4, 0x000e0000), 6u);
  // An 8-byte store starting below the unit.
  EXPECT_EQ(BitfieldIn(mode, 0xffc, 8, uint64_t{0x5} << 48), 5u);
  // Accesses that miss some of its bits.
  EXPECT_FALSE(BitfieldIn(mode, 0x1000, 2, 0xffff).has_value());
  EXPECT_FALSE(BitfieldIn(mode, 0x1003, 1, 0xff).has_value());
  // Signed: sign-extended from its width.
  const BitfieldPlace level = *WatchedBitfield(Target(0x1000, 4, 4, "int"));
  EXPECT_EQ(static_cast<int64_t>(*BitfieldIn(level, 0x1000, 1, 0xf0)), -1);
  EXPECT_EQ(static_cast<int64_t>(*BitfieldIn(level, 0x1000, 1, 0x70)), 7);
}

TEST(Bitfield, EventValuesAndConditionsSeeTheBitfield) {
  const auto mode = WatchedBitfield(Target(0x1000, 16, 3));
  const EventValues v = ValuesOf(mode, Store(0x1002, 1, 0, 9));
  EXPECT_TRUE(v.decoded);
  EXPECT_EQ(v.value, 1u);
  EXPECT_EQ(v.old_value, 0u);
  const EventValues raw = ValuesOf(std::nullopt, Store(0x1002, 1, 0, 9));
  EXPECT_FALSE(raw.decoded);
  EXPECT_EQ(raw.value, 9u);
  EXPECT_EQ(raw.width, 1u);

  ConditionOptions co;
  co.bitfield = mode;
  auto is_one = Condition::Parse("new == 1 && old == 0", co);
  ASSERT_TRUE(is_one.ok()) << is_one.status();
  EXPECT_TRUE(is_one->Matches(Store(0x1002, 1, 0, 9)));
  auto is_nine = Condition::Parse("new == 9", co);
  ASSERT_TRUE(is_nine.ok());
  EXPECT_FALSE(is_nine->Matches(Store(0x1002, 1, 0, 9)));
  // A store that does not hold the bitfield's bits has no `new` for it.
  EXPECT_FALSE(is_one->Matches(Store(0x1003, 1, 0, 1)));
  EXPECT_EQ(is_one->stats().missing_new, 1u);
}

}  // namespace
}  // namespace kwatch::watch
