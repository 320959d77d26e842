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

TEST(ParseExprTest, CastOfAnAddress) {
  auto e = ParseExpr("((struct record *)0x7f00001000)->arr[2].x");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_TRUE(e->base.empty());
  ASSERT_TRUE(e->address.has_value());
  EXPECT_EQ(*e->address, 0x7f00001000u);
  ASSERT_TRUE(e->cast.has_value());
  EXPECT_EQ(e->cast->tag, ExprType::Tag::kStruct);
  EXPECT_EQ(e->cast->name, "record");
  EXPECT_EQ(e->cast->pointers, 1);
  EXPECT_EQ(e->cast->column, 2u);
  EXPECT_EQ(e->cast->Spelling(), "struct record *");
  EXPECT_EQ(e->cast_column, 1u);
  ASSERT_EQ(e->steps.size(), 3u);
  EXPECT_EQ(e->steps[0].kind, ExprStep::Kind::kArrow);
  EXPECT_EQ(e->steps[0].member, "arr");
  EXPECT_EQ(e->steps[0].column, 31u);
  EXPECT_EQ(e->steps[1].kind, ExprStep::Kind::kIndex);
  EXPECT_EQ(e->steps[1].index, 2);
  EXPECT_EQ(e->steps[2].member, "x");

  auto deref = ParseExpr("*(record_t *)0x10");
  ASSERT_TRUE(deref.ok()) << deref.status();
  EXPECT_EQ(deref->cast->tag, ExprType::Tag::kNone);
  EXPECT_EQ(deref->cast->name, "record_t");
  ASSERT_EQ(deref->steps.size(), 1u);
  EXPECT_EQ(deref->steps[0].kind, ExprStep::Kind::kDeref);
  EXPECT_EQ(deref->steps[0].column, 0u);

  auto bare = ParseExpr(" ( int * ) 0x10 ");
  ASSERT_TRUE(bare.ok()) << bare.status();
  EXPECT_EQ(bare->cast->name, "int");
  EXPECT_TRUE(bare->steps.empty());
  EXPECT_EQ(bare->cast_column, 1u);
}

TEST(ParseExprTest, CastTypeNames) {
  struct Case {
    const char* text;
    ExprType::Tag tag;
    const char* name;
    int pointers;
  };
  const Case cases[] = {
      {"(unsigned long int *)0x10", ExprType::Tag::kNone, "unsigned long", 1},
      {"(long unsigned *)0x10", ExprType::Tag::kNone, "unsigned long", 1},
      {"(const char *)0x10", ExprType::Tag::kNone, "char", 1},
      {"(const struct node * const *)0x10", ExprType::Tag::kStruct, "node", 2},
      {"(struct node const**)0x10", ExprType::Tag::kStruct, "node", 2},
      {"(union slot *)0x10", ExprType::Tag::kUnion, "slot", 1},
      {"(enum color *)0x10", ExprType::Tag::kEnum, "color", 1},
      {"(class Pair *)0x10", ExprType::Tag::kClass, "Pair", 1},
      {"(ns::Node *)0x10", ExprType::Tag::kNone, "ns::Node", 1},
      {"(ns::Box<int,2> *)0x10", ExprType::Tag::kNone, "ns::Box<int, 2>", 1},
      {"(node_ptr)0x10", ExprType::Tag::kNone, "node_ptr", 0},
      {"(struct node)0x10", ExprType::Tag::kStruct, "node", 0},
  };
  for (const Case& c : cases) {
    auto e = ParseExpr(c.text);
    ASSERT_TRUE(e.ok()) << c.text << ": " << e.status();
    ASSERT_TRUE(e->cast.has_value()) << c.text;
    EXPECT_EQ(e->cast->tag, c.tag) << c.text;
    EXPECT_EQ(e->cast->name, c.name) << c.text;
    EXPECT_EQ(e->cast->pointers, c.pointers) << c.text;
    EXPECT_EQ(*e->address, 0x10u) << c.text;
  }
}

TEST(ParseExprTest, Parentheses) {
  auto e = ParseExpr("(*pp)->next");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->base, "pp");
  ASSERT_EQ(e->steps.size(), 2u);
  EXPECT_EQ(e->steps[0].kind, ExprStep::Kind::kDeref);
  EXPECT_EQ(e->steps[1].kind, ExprStep::Kind::kArrow);
  auto p = ParseExpr("((g_cache)).lines[1]");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->base, "g_cache");
  ASSERT_EQ(p->steps.size(), 2u);
  // A parenthesised name followed by a member is not a cast.
  auto q = ParseExpr("(g_cache).nlines");
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_FALSE(q->cast.has_value());
  auto deep = ParseExpr(std::string(40, '(') + "x" + std::string(40, ')'));
  ASSERT_FALSE(deep.ok());
  EXPECT_THAT(std::string(deep.status().message()), HasSubstr("more than 32 nested parentheses"));
}

// GCC renames the statics of functions in the symbol table (`initialized.5`); no member name
// starts with a digit, so the suffix belongs to the name.
TEST(ParseExprTest, RenamedStatics) {
  auto e = ParseExpr("initialized.5");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->base, "initialized.5");
  EXPECT_TRUE(e->steps.empty());
  auto member = ParseExpr("&state.12.hits");
  ASSERT_TRUE(member.ok()) << member.status();
  EXPECT_EQ(member->base, "state.12");
  ASSERT_EQ(member->steps.size(), 1u);
  EXPECT_EQ(member->steps[0].member, "hits");
  auto scoped = ParseExpr("'thread.c'::initialized.0");
  ASSERT_TRUE(scoped.ok()) << scoped.status();
  EXPECT_EQ(scoped->base, "'thread.c'::initialized.0");
  // gdb's quoted symbol name.
  auto quoted = ParseExpr("'initialized.5'");
  ASSERT_TRUE(quoted.ok()) << quoted.status();
  EXPECT_EQ(quoted->base, "initialized.5");
  auto quoted_arrow = ParseExpr("'ctx.3'->head");
  ASSERT_TRUE(quoted_arrow.ok()) << quoted_arrow.status();
  EXPECT_EQ(quoted_arrow->base, "ctx.3");
  // Members take no suffix.
  EXPECT_FALSE(ParseExpr("s.a.0").ok());
}

TEST(ParseExprTest, TemplateArguments) {
  struct Case {
    const char* text;
    const char* base;
    size_t steps;
  };
  const Case cases[] = {
      {"Box<int>::value", "Box<int>::value", 0},
      {"ns::Box<long>::value", "ns::Box<long>::value", 0},
      {"ns::Box<long int>::value", "ns::Box<long>::value", 0},
      {"Box<int>::inst.second", "Box<int>::inst", 1},
      {"Arr<int,2>::data[1]", "Arr<int, 2>::data", 1},
      {"Arr<int, 2>::data[1]", "Arr<int, 2>::data", 1},
      {"Box < int > :: value", "Box<int>::value", 0},
      {"Box<Box<int>>::value", "Box<Box<int> >::value", 0},
      {"Two<Box<int>, const char*>::v", "Two<Box<int>, char const*>::v", 0},
      {"Box<unsigned long>::value", "Box<unsigned long>::value", 0},
      {"&Box<long unsigned int>::value", "Box<unsigned long>::value", 0},
      {"pi<double>", "pi<double>", 0},
  };
  for (const Case& c : cases) {
    auto e = ParseExpr(c.text);
    ASSERT_TRUE(e.ok()) << c.text << ": " << e.status();
    EXPECT_EQ(e->base, c.base) << c.text;
    EXPECT_EQ(e->steps.size(), c.steps) << c.text;
  }
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
      {"(struct T *)g_ptr", "kwatch casts addresses only: write (struct T *)0xADDR", 13},
      {"(struct T *)42", "kwatch casts addresses only", 13},
      {"(struct T *)0x10->f",
       "'->' would apply to the address, not to the cast: write ((struct "
       "T *)0x...)->...",
       17},
      {"(struct T *)0x10[1]", "'[' would apply to the address", 17},
      {"(struct *)0x10", "expected a name after 'struct', found '*'", 9},
      {"(struct T *)0x10:8", "a cast gives the length", 17},
      {"((struct T *)0x10", "expected ')' to close the '(' at column 1", 18},
      {"(struct T * 0x10", "expected ')' after the type struct T *, found '0'", 13},
      {"(unsigned foo *)0x10", "unexpected 'foo' after 'unsigned'", 11},
      {"(struct T U *)0x10", "unexpected 'U' after the type name T", 11},
      {"()", "expected a variable name or 0xADDR, found ')'", 2},
      {"(g_x", "expected ')' to close the '(' at column 1", 5},
      {"Box<int::value", "unterminated template argument list: expected '>'", 4},
      {"Box<int;>::value", "unexpected ';' in a template argument list", 8},
      {"calls.0x", "unexpected 'x' after a symbol's numeric suffix", 8},
      {"'a.c' x", "expected '::' and a variable name after the file name", 7},
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
