#include "core/symbols/expr.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace kwatch::core::symbols {
namespace {

using ::testing::HasSubstr;

TEST(ParseExprTest, PlainName) {
  auto e = ParseExpr("g_stats");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->text, "g_stats");
  EXPECT_EQ(e->base, "g_stats");
  EXPECT_FALSE(e->address.has_value());
  EXPECT_FALSE(e->address_of);
  EXPECT_TRUE(e->steps.empty());
}

TEST(ParseExprTest, AddressOf) {
  auto e = ParseExpr("&jiffies");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_TRUE(e->address_of);
  EXPECT_EQ(e->base, "jiffies");
}

TEST(ParseExprTest, MembersArrowsAndIndexes) {
  auto e = ParseExpr("cache->lines[3].data[0x1f]");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->base, "cache");
  ASSERT_EQ(e->steps.size(), 4u);
  EXPECT_EQ(e->steps[0].kind, ExprStep::Kind::kArrow);
  EXPECT_EQ(e->steps[0].member, "lines");
  EXPECT_EQ(e->steps[0].column, 5u);
  EXPECT_EQ(e->steps[1].kind, ExprStep::Kind::kIndex);
  EXPECT_EQ(e->steps[1].index, 3);
  EXPECT_EQ(e->steps[1].column, 12u);
  EXPECT_EQ(e->steps[2].kind, ExprStep::Kind::kMember);
  EXPECT_EQ(e->steps[2].member, "data");
  EXPECT_EQ(e->steps[3].kind, ExprStep::Kind::kIndex);
  EXPECT_EQ(e->steps[3].index, 31);
}

TEST(ParseExprTest, WhitespaceAroundTokens) {
  auto e = ParseExpr("  & g_stats . inner [ 2 ] -> x  ");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_TRUE(e->address_of);
  EXPECT_EQ(e->base, "g_stats");
  ASSERT_EQ(e->steps.size(), 3u);
  EXPECT_EQ(e->steps[0].member, "inner");
  EXPECT_EQ(e->steps[1].index, 2);
  EXPECT_EQ(e->steps[2].kind, ExprStep::Kind::kArrow);
  EXPECT_EQ(e->steps[2].member, "x");
}

TEST(ParseExprTest, NegativeIndexParsesForLaterRejection) {
  auto e = ParseExpr("arr[-2]");
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_EQ(e->steps.size(), 1u);
  EXPECT_EQ(e->steps[0].index, -2);
}

TEST(ParseExprTest, CxxQualifiedName) {
  auto e = ParseExpr("ns::inner::g_var.field");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->base, "ns::inner::g_var");
  ASSERT_EQ(e->steps.size(), 1u);
  EXPECT_EQ(e->steps[0].member, "field");
}

TEST(ParseExprTest, FileScopedStatic) {
  auto e = ParseExpr("'Python/thread.c'::initialized");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->base, "'Python/thread.c'::initialized");
  EXPECT_TRUE(e->steps.empty());
  auto f = ParseExpr("&'a.c'::run::calls.hits");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_TRUE(f->address_of);
  EXPECT_EQ(f->base, "'a.c'::run::calls");
  ASSERT_EQ(f->steps.size(), 1u);
  EXPECT_EQ(f->steps[0].member, "hits");

  auto open = ParseExpr("'thread.c::initialized");
  ASSERT_FALSE(open.ok());
  EXPECT_THAT(std::string(open.status().message()),
              ::testing::StartsWith("unterminated file name: write 'FILE'::NAME at column 1"));
  auto no_colons = ParseExpr("'thread.c'.initialized");
  ASSERT_FALSE(no_colons.ok());
  EXPECT_THAT(
      std::string(no_colons.status().message()),
      ::testing::StartsWith("expected '::' and a variable name after the file name at column 11"));
  EXPECT_FALSE(ParseExpr("''::x").ok());
  EXPECT_FALSE(ParseExpr("'a.c'::").ok());
}

TEST(ParseExprTest, DerefAppliesAfterPostfixSteps) {
  auto e = ParseExpr("*g_cache.next");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->base, "g_cache");
  ASSERT_EQ(e->steps.size(), 2u);
  EXPECT_EQ(e->steps[0].kind, ExprStep::Kind::kMember);
  EXPECT_EQ(e->steps[1].kind, ExprStep::Kind::kDeref);
  EXPECT_EQ(e->steps[1].column, 0u);
}

TEST(ParseExprTest, AbsoluteAddress) {
  auto e = ParseExpr("0x601040");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_TRUE(e->base.empty());
  ASSERT_TRUE(e->address.has_value());
  EXPECT_EQ(*e->address, 0x601040u);
  EXPECT_FALSE(e->length.has_value());
}

TEST(ParseExprTest, AbsoluteAddressWithLength) {
  auto dec = ParseExpr("0xffffffff81e0a000:16");
  ASSERT_TRUE(dec.ok()) << dec.status();
  EXPECT_EQ(*dec->address, 0xffffffff81e0a000u);
  EXPECT_EQ(*dec->length, 16u);
  auto hex = ParseExpr("&0x1000 : 0x20");
  ASSERT_TRUE(hex.ok()) << hex.status();
  EXPECT_EQ(*hex->address, 0x1000u);
  EXPECT_EQ(*hex->length, 32u);
}

// The message for people: column (1-based) and a caret under the offending character.
TEST(ParseExprTest, ErrorShowsColumnAndCaret) {
  auto e = ParseExpr("g_stats.");
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(e.status().message(),
            "expected a member name after '.' at column 9\n"
            "  g_stats.\n"
            "          ^");
}

TEST(ParseExprTest, ErrorColumns) {
  struct Case {
    const char* text;
    const char* substr;
    size_t column;  // 1-based, as printed
  };
  const Case cases[] = {
      {"", "empty expression", 1},
      {"g_stats->", "expected a member name after '->'", 10},
      {"g_stats..hits", "expected a member name after '.'", 9},
      {"g_stats[", "expected an index", 9},
      {"g_stats[1", "expected ']'", 10},
      {"g_stats[x]", "expected an index", 9},
      {"g_stats[12a]", "unexpected 'a' in an index", 11},
      {"g_stats hits", "unexpected 'h'", 9},
      {"g_stats)", "unexpected ')'", 8},
      {"42", "expected a variable name or a 0x-prefixed address", 1},
      {"0x", "expected an address", 3},
      {"0x10:0", "the length must be at least 1 byte", 6},
      {"0x10.x", "after an absolute address", 5},
      {"0x10:-1", "a length cannot be negative", 6},
      {"*0x10", "'*' applies to pointer variables", 1},
      {"ns::", "expected a name after '::'", 5},
      {"arr[0x10000000000000000]", "an index is too large", 5},
  };
  for (const Case& c : cases) {
    auto e = ParseExpr(c.text);
    ASSERT_FALSE(e.ok()) << c.text;
    EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument) << c.text;
    const std::string msg(e.status().message());
    EXPECT_THAT(msg, HasSubstr(c.substr)) << c.text;
    EXPECT_THAT(msg, HasSubstr("at column " + std::to_string(c.column) + "\n")) << c.text;
    // The caret line sits under the column.
    const std::string caret = "\n" + std::string(2 + c.column - 1, ' ') + "^";
    EXPECT_TRUE(msg.size() >= caret.size() &&
                msg.compare(msg.size() - caret.size(), caret.size(), caret) == 0)
        << c.text << ": " << msg;
  }
}

}  // namespace
}  // namespace kwatch::core::symbols
