#include "core/symbols/type_layout.h"

#include <gtest/gtest.h>

namespace kwatch::core::symbols {
namespace {

FieldLayout Field(const char* path, uint64_t offset, uint64_t size, int depth, bool leaf,
                  uint32_t bit_offset = 0, uint32_t bit_size = 0) {
  FieldLayout f;
  f.path = path;
  f.offset = offset;
  f.size = size;
  f.depth = depth;
  f.is_leaf = leaf;
  f.bit_offset = bit_offset;
  f.bit_size = bit_size;
  return f;
}

// struct { long a; struct { int x; int y; } in; char pad_hole; /* 3 bytes padding */
//          union { int i; float f; } u; unsigned m : 3; unsigned r : 1; }
TypeLayout Sample() {
  TypeLayout t;
  t.type_name = "struct sample";
  t.size = 28;
  t.fields = {
      Field(".a", 0, 8, 0, true),        Field(".in", 8, 8, 0, false),
      Field(".in.x", 8, 4, 1, true),     Field(".in.y", 12, 4, 1, true),
      Field(".c", 16, 1, 0, true),       Field(".u", 20, 4, 0, false),
      Field(".u.i", 20, 4, 1, true),     Field(".u.f", 20, 4, 1, true),
      Field(".m", 24, 4, 0, true, 0, 3), Field(".r", 24, 4, 0, true, 3, 1),
  };
  return t;
}

TEST(TypeLayoutTest, LeafAtFindsTheDeepestLeaf) {
  const TypeLayout t = Sample();
  ASSERT_NE(t.LeafAt(0), nullptr);
  EXPECT_EQ(t.LeafAt(0)->path, ".a");
  EXPECT_EQ(t.LeafAt(7)->path, ".a");
  EXPECT_EQ(t.LeafAt(8)->path, ".in.x");
  EXPECT_EQ(t.LeafAt(15)->path, ".in.y");
  EXPECT_EQ(t.LeafAt(16)->path, ".c");
}

TEST(TypeLayoutTest, LeafAtPaddingAndPastTheEnd) {
  const TypeLayout t = Sample();
  EXPECT_EQ(t.LeafAt(17), nullptr);
  EXPECT_EQ(t.LeafAt(19), nullptr);
  EXPECT_EQ(t.LeafAt(28), nullptr);
  EXPECT_EQ(t.LeafAt(~0ULL), nullptr);
}

TEST(TypeLayoutTest, LeafAtUnionAndBitfieldsTakeTheFirst) {
  const TypeLayout t = Sample();
  EXPECT_EQ(t.LeafAt(21)->path, ".u.i");
  EXPECT_EQ(t.LeafAt(26)->path, ".m");
}

TEST(TypeLayoutTest, ScalarLayout) {
  TypeLayout t;
  t.type_name = "long";
  t.size = 8;
  t.fields = {Field("", 0, 8, 0, true)};
  ASSERT_NE(t.LeafAt(3), nullptr);
  EXPECT_EQ(t.LeafAt(3)->path, "");
  EXPECT_EQ(t.LeafAt(8), nullptr);
}

TEST(TypeLayoutTest, AUnionCountsOnceAndItsMembersNotApart) {
  TypeLayout t = Sample();
  EXPECT_EQ(CountedFields(t.fields), (std::vector<size_t>{0, 2, 3, 4, 6, 7, 8, 9}));
  t.fields[5].is_union = true;  // .u
  EXPECT_EQ(CountedFields(t.fields), (std::vector<size_t>{0, 2, 3, 4, 5, 8, 9}));
  // A union inside a union's member, and one at the end: each counted once, at its top.
  t.fields = {Field(".v", 0, 8, 0, false),      Field(".v.s", 0, 8, 1, false),
              Field(".v.s.a", 0, 4, 2, true),   Field(".v.s.w", 4, 4, 2, false),
              Field(".v.s.w.i", 4, 4, 3, true), Field(".{x,y}", 8, 4, 0, false),
              Field(".x", 8, 4, 1, true),       Field(".y", 8, 2, 1, true)};
  t.fields[0].is_union = true;
  t.fields[3].is_union = true;
  t.fields[5].is_union = true;
  EXPECT_EQ(CountedFields(t.fields), (std::vector<size_t>{0, 5}));
  t.fields[0].is_union = false;
  EXPECT_EQ(CountedFields(t.fields), (std::vector<size_t>{2, 3, 5}));
}

TEST(TypeLayoutTest, AnAnonymousUnionIsNamedByItsMembers) {
  EXPECT_EQ(AnonymousUnionName({"i", "f"}), "{i,f}");
  EXPECT_EQ(AnonymousUnionName({"a", "b", "c", "d"}), "{a,b,c,d}");
  EXPECT_EQ(AnonymousUnionName({"a", "b", "c", "d", "e"}), "{a,b,c,d,...}");
}

}  // namespace
}  // namespace kwatch::core::symbols
