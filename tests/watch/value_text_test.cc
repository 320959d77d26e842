#include "watch/value_text.h"

#include <bit>
#include <cstdint>

#include <gtest/gtest.h>

namespace kwatch::watch {
namespace {

TEST(FieldValueText, IntegersReadAsTheirTypeSays) {
  EXPECT_EQ(FieldValueText("int", 4, 0, 0xffffffffu), "-1");
  EXPECT_EQ(FieldValueText("unsigned int", 4, 0, 0xffffffffu), "4294967295");
  EXPECT_EQ(FieldValueText("unsigned char", 1, 0, 200), "200");
  EXPECT_EQ(FieldValueText("char", 1, 0, 200), "-56");
  EXPECT_EQ(FieldValueText("volatile short", 2, 0, 0xfffe), "-2");
  EXPECT_EQ(FieldValueText("long", 8, 0, ~uint64_t{0}), "-1");
  EXPECT_EQ(FieldValueText("unsigned long", 8, 0, ~uint64_t{0}), "18446744073709551615");
  EXPECT_EQ(FieldValueText("enum color", 4, 0, 0xfffffffdu), "-3");
  // Bits above the field's width (a wider store) do not count.
  EXPECT_EQ(FieldValueText("unsigned char", 1, 0, 0x1234), "52");
}

TEST(FieldValueText, BitfieldsUseTheirBitWidth) {
  EXPECT_EQ(FieldValueText("int", 4, 3, 0x7), "-1");
  EXPECT_EQ(FieldValueText("unsigned int", 4, 3, 0x7), "7");
  EXPECT_EQ(FieldValueText("int", 4, 3, 0x3), "3");
}

TEST(FieldValueText, FloatsReadBackToTheSameBits) {
  EXPECT_EQ(FieldValueText("float", 4, 0, std::bit_cast<uint32_t>(1.5F)), "1.5");
  EXPECT_EQ(FieldValueText("const float", 4, 0, std::bit_cast<uint32_t>(0.1F)), "0.100000001");
  EXPECT_EQ(FieldValueText("double", 8, 0, std::bit_cast<uint64_t>(-0.25)), "-0.25");
  EXPECT_EQ(FieldValueText("double", 8, 0, std::bit_cast<uint64_t>(0.1)), "0.10000000000000001");
  // The bits of int 5 read as a float: what the memory holds, not 5.
  EXPECT_EQ(FieldValueText("float", 4, 0, 5), "7.00649232e-45");
}

TEST(FieldValueText, PointersAndWhatIsNotOneNumberAreHex) {
  EXPECT_EQ(FieldValueText("int *", 8, 0, 0x7ffd1230), "0x7ffd1230");
  EXPECT_EQ(FieldValueText("struct node * const", 8, 0, 0), "0x0");
  EXPECT_EQ(FieldValueText("union {...}", 4, 0, 0xfffe0001), "0xfffe0001");
  EXPECT_EQ(FieldValueText("struct pair", 8, 0, 0x100000002), "0x100000002");
  EXPECT_EQ(FieldValueText("char[8]", 8, 0, 0x676174), "0x676174");
  EXPECT_EQ(FieldValueText("long double", 16, 0, 0x10), "0x10");
}

}  // namespace
}  // namespace kwatch::watch
