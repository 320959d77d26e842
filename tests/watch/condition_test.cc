#include "watch/condition.h"

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/event.h"

namespace kwatch::watch {
namespace {

using ::testing::HasSubstr;

core::AccessEvent Event(std::optional<uint64_t> value, std::optional<uint64_t> old_value,
                        uint32_t size = 8) {
  core::AccessEvent e;
  e.pid = 100;
  e.tid = 1234;
  e.cpu = 1;
  e.addr = core::RemoteAddr{0x601040};
  e.len = 8;
  e.access_addr = core::RemoteAddr{0x601044};
  e.access_size = size;
  e.value = value;
  e.old_value = old_value;
  return e;
}

ConditionOptions SignedOptions(bool is_signed) {
  ConditionOptions o;
  o.signed_values = is_signed;
  return o;
}

Condition Parse(const std::string& text, bool is_signed = false) {
  auto c = Condition::Parse(text, SignedOptions(is_signed));
  EXPECT_TRUE(c.ok()) << text << ": " << c.status();
  return c.ok() ? *std::move(c) : *Condition::Parse("0");
}

bool Eval(const std::string& text, uint64_t value, uint64_t old_value = 0, bool is_signed = false,
          uint32_t size = 8) {
  Condition c = Parse(text, is_signed);
  return c.Matches(Event(value, old_value, size));
}

std::string ParseError(const std::string& text) {
  auto c = Condition::Parse(text);
  EXPECT_FALSE(c.ok()) << text << " parsed";
  if (c.ok()) {
    return "";
  }
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(c.status().message());
}

TEST(ConditionTest, ComparisonsTruthTable) {
  // new in {99, 100, 101} against 100, for every comparison.
  struct Row {
    const char* text;
    bool at99, at100, at101;
  };
  const Row rows[] = {
      {"new > 100", false, false, true},  {"new >= 100", false, true, true},
      {"new < 100", true, false, false},  {"new <= 100", true, true, false},
      {"new == 100", false, true, false}, {"new != 100", true, false, true},
  };
  for (const Row& r : rows) {
    EXPECT_EQ(Eval(r.text, 99), r.at99) << r.text;
    EXPECT_EQ(Eval(r.text, 100), r.at100) << r.text;
    EXPECT_EQ(Eval(r.text, 101), r.at101) << r.text;
  }
}

TEST(ConditionTest, LogicalTruthTable) {
  // new and old each 0 or 1.
  struct Row {
    const char* text;
    bool t00, t01, t10, t11;  // (new, old)
  };
  const Row rows[] = {
      {"new && old", false, false, false, true},  {"new || old", false, true, true, true},
      {"!new", true, true, false, false},         {"new ^ old", false, true, true, false},
      {"new != old", false, true, true, false},   {"!new || old", true, true, false, true},
      {"!(new && old)", true, true, true, false},
  };
  for (const Row& r : rows) {
    EXPECT_EQ(Eval(r.text, 0, 0), r.t00) << r.text;
    EXPECT_EQ(Eval(r.text, 0, 1), r.t01) << r.text;
    EXPECT_EQ(Eval(r.text, 1, 0), r.t10) << r.text;
    EXPECT_EQ(Eval(r.text, 1, 1), r.t11) << r.text;
  }
}

TEST(ConditionTest, NamesReadTheEvent) {
  EXPECT_TRUE(Eval("tid == 1234", 0));
  EXPECT_TRUE(Eval("pid == 100", 0));
  EXPECT_TRUE(Eval("cpu == 1", 0));
  EXPECT_TRUE(Eval("addr == 0x601044", 0));
  EXPECT_TRUE(Eval("len == 4", 0, 0, false, 4));
  EXPECT_TRUE(Eval("new & 0x8000 && tid == 1234", 0x8001));
  EXPECT_FALSE(Eval("new & 0x8000 && tid == 1234", 0x7fff));
  // Without an access size, len is the watched range's length.
  Condition c = Parse("len == 8");
  EXPECT_TRUE(c.Matches(Event(0, 0, 0)));
}

TEST(ConditionTest, Precedence) {
  // Each as C computes it (checked against the C expression itself).
  EXPECT_TRUE(Eval("1 + 2 * 3 == 7", 0));
  EXPECT_TRUE(Eval("(1 + 2) * 3 == 9", 0));
  EXPECT_TRUE(Eval("1 << 2 + 1 == 8", 0));  // + before <<
  EXPECT_TRUE(Eval("(1 | 2 ^ 3 & 1) == (1 | (2 ^ (3 & 1)))", 0));
  EXPECT_TRUE(Eval("(1 | 2 ^ 3 & 1) == 3", 0));
  EXPECT_TRUE(Eval("(2 & 1 == 1) == 0", 0));  // == before &: 2 & (1 == 1) = 0
  EXPECT_TRUE(Eval("10 - 4 - 3 == 3", 0));    // left-associative
  EXPECT_TRUE(Eval("64 / 4 / 2 == 8", 0));
  EXPECT_TRUE(Eval("17 % 5 * 2 == 4", 0));
  EXPECT_TRUE(Eval("-2 * -3 == 6", 0));
  EXPECT_TRUE(Eval("!0 + 1 == 2", 0));  // unary before binary
  EXPECT_TRUE(Eval("~0 == 0xffffffffffffffff", 0));
  EXPECT_TRUE(Eval("1 < 2 == 1", 0));   // < before ==
  EXPECT_TRUE(Eval("0 && 1 || 1", 0));  // && before ||
  EXPECT_FALSE(Eval("0 && (1 || 1)", 0));
  EXPECT_TRUE(Eval("1 || 0 && 0", 0));
  EXPECT_TRUE(Eval("(3 && 5) == 1", 0));  // && gives 0 or 1
  EXPECT_TRUE(Eval("(0 || 7) == 1", 0));
  EXPECT_TRUE(Eval("new - old == 5", 15, 10));
}

// The condition computes what C computes for the same text (small int operands: no overflow,
// so C's int arithmetic and the condition's int64 agree).
#define EXPECT_AS_C(expr)                                                                  \
  EXPECT_TRUE(Eval("(" #expr ") == " + std::to_string(static_cast<long long>(expr)), 0, 0, \
                   /*is_signed=*/true))                                                    \
      << #expr " = " << (expr)

// The expressions below are written as a user would, without the parentheses -Wall asks for.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wparentheses"
TEST(ConditionTest, AgreesWithC) {
  EXPECT_AS_C(-7 / 2 + 5 % -3 * 4 - (3 << 2 >> 1) ^ 6 & 5 | 1);
  EXPECT_AS_C(1 + 2 * 3 - 4 / 2 % 3 << 1);
  EXPECT_AS_C(~5 & 0xff ^ 3 | 8);
  EXPECT_AS_C(!3 + !0 * 10 - ~-1);
  EXPECT_AS_C(1 < 2 < 3 == 1 != 0);
  EXPECT_AS_C(5 > 3 && 2 > 9 || 7 <= 7 && !(1 >= 2));
  EXPECT_AS_C(-(-(-4)) * - -3);
  EXPECT_AS_C(100 / 7 / 2 * 3 % 5);
  EXPECT_AS_C(0x7f & 0x3c | 0x100 ^ 0x1ff);
  EXPECT_AS_C(1 << 3 + 2 >= 32 == 1);
}
#pragma GCC diagnostic pop

TEST(ConditionTest, SignedAndUnsigned) {
  // A 4-byte int holding -1: 0xffffffff in the event.
  EXPECT_TRUE(Eval("new < 0", 0xffffffff, 0, /*is_signed=*/true, 4));
  EXPECT_TRUE(Eval("new == -1", 0xffffffff, 0, true, 4));
  EXPECT_FALSE(Eval("new < 0", 0xffffffff, 0, /*is_signed=*/false, 4));
  EXPECT_TRUE(Eval("new == 0xffffffff", 0xffffffff, 0, false, 4));
  EXPECT_TRUE(Eval("new > 100", 0xffffffff, 0, false, 4));
  EXPECT_FALSE(Eval("new > 100", 0xffffffff, 0, true, 4));
  // 1- and 2-byte values: only the accessed bytes count.
  EXPECT_TRUE(Eval("new == -128", 0x80, 0, true, 1));
  EXPECT_TRUE(Eval("new == 128", 0x80, 0, false, 1));
  EXPECT_TRUE(Eval("new == -2", 0xfffe, 0, true, 2));
  EXPECT_TRUE(Eval("new == 0xfe", 0xabfe, 0, false, 1));
  // Division, remainder and shifts follow the signedness.
  EXPECT_TRUE(Eval("new / 2 == -3", static_cast<uint64_t>(-7), 0, true));
  EXPECT_TRUE(Eval("new % 2 == -1", static_cast<uint64_t>(-7), 0, true));
  EXPECT_TRUE(Eval("new / 2 == 0x7ffffffffffffffc", static_cast<uint64_t>(-7), 0, false));
  EXPECT_TRUE(Eval("new >> 1 == -4", static_cast<uint64_t>(-7), 0, true));
  EXPECT_TRUE(Eval("new >> 1 == 0x7ffffffffffffffc", static_cast<uint64_t>(-7), 0, false));
  EXPECT_TRUE(Eval("-7 / 2 == -3", 0, 0, true));
  EXPECT_TRUE(Eval("7 / -2 == -3", 0, 0, true));
  EXPECT_TRUE(Eval("7 % -2 == 1", 0, 0, true));
  // Signed overflow wraps, shifts out of range are defined.
  EXPECT_TRUE(Eval("(-0x7fffffffffffffff - 1) / -1 == -0x7fffffffffffffff - 1", 0, 0, true));
  EXPECT_TRUE(Eval("1 << 64 == 0", 0));
  EXPECT_TRUE(Eval("new >> 70 == -1", static_cast<uint64_t>(-5), 0, true));
  EXPECT_TRUE(Eval("new >> 70 == 0", static_cast<uint64_t>(-5), 0, false));
  EXPECT_TRUE(Eval("0xffffffffffffffff == -1", 0));
  // Comparing the sign bit: unsigned says big, signed says negative.
  EXPECT_TRUE(Eval("new > 0x7fffffffffffffff", uint64_t{1} << 63, 0, false));
  EXPECT_FALSE(Eval("new > 0x7fffffffffffffff", uint64_t{1} << 63, 0, true));
  EXPECT_TRUE(Eval("new <= -1 && new >= -0x7fffffffffffffff - 1", uint64_t{1} << 63, 0, true));
}

TEST(ConditionTest, MissingValuesAreFalseAndCounted) {
  Condition c = Parse("new != old");
  EXPECT_TRUE(c.uses_new());
  EXPECT_TRUE(c.uses_old());
  EXPECT_FALSE(c.Matches(Event(5, std::nullopt)));
  EXPECT_FALSE(c.Matches(Event(5, std::nullopt)));
  EXPECT_FALSE(c.Matches(Event(std::nullopt, std::nullopt)));
  EXPECT_TRUE(c.Matches(Event(5, 4)));
  EXPECT_FALSE(c.Matches(Event(5, 5)));
  EXPECT_EQ(c.stats().evaluated, 5u);
  EXPECT_EQ(c.stats().matched, 1u);
  EXPECT_EQ(c.stats().missing_old, 2u);
  EXPECT_EQ(c.stats().missing_new, 1u);
  EXPECT_EQ(c.stats().division_by_zero, 0u);
  // A condition without `old` runs on events that lack it.
  Condition d = Parse("tid == 1234");
  EXPECT_TRUE(d.Matches(Event(std::nullopt, std::nullopt)));
  EXPECT_EQ(d.stats().missing_new + d.stats().missing_old, 0u);
}

TEST(ConditionTest, DivisionByZeroIsFalseAndCounted) {
  Condition c = Parse("new / old > 2");
  EXPECT_TRUE(c.Matches(Event(9, 3)));
  EXPECT_FALSE(c.Matches(Event(9, 0)));
  EXPECT_FALSE(c.Matches(Event(9, 5)));
  Condition m = Parse("new % old == 0 || 1");
  EXPECT_FALSE(m.Matches(Event(9, 0)));
  EXPECT_EQ(c.stats().division_by_zero, 1u);
  EXPECT_EQ(c.stats().matched, 1u);
  EXPECT_EQ(m.stats().division_by_zero, 1u);
  // Short-circuit: the division is never evaluated when old is 0.
  Condition s = Parse("old != 0 && new / old > 2");
  EXPECT_FALSE(s.Matches(Event(9, 0)));
  EXPECT_TRUE(s.Matches(Event(9, 2)));
  EXPECT_EQ(s.stats().division_by_zero, 0u);
  // A constant division by zero parses, and counts each time it runs.
  Condition k = Parse("1 / 0");
  EXPECT_FALSE(k.Matches(Event(0, 0)));
  EXPECT_FALSE(k.Matches(Event(0, 0)));
  EXPECT_EQ(k.stats().division_by_zero, 2u);
}

TEST(ConditionTest, ConstantsAreFolded) {
  EXPECT_EQ(Parse("new > -1").Disassemble(), "0: new\n1: const 0xffffffffffffffff\n2: gtu\n");
  EXPECT_EQ(Parse("new & (1 << 15)", true).Disassemble(), "0: new\n1: const 0x8000\n2: and\n");
  EXPECT_EQ(Parse("new < -1", true).Disassemble(), "0: new\n1: const 0xffffffffffffffff\n2: lts\n");
  EXPECT_EQ(Parse("new && old").Disassemble(), "0: new\n1: jz 4\n2: old\n3: bool\n");
  // A folded constant where a jump lands still computes the same.
  EXPECT_TRUE(Eval("(new && old) + 2 * 3 == 6", 0, 1));
  EXPECT_TRUE(Eval("(new && old) + 2 * 3 == 7", 1, 1));
}

TEST(ConditionTest, LiteralsAndSpacing) {
  EXPECT_TRUE(Eval("new==0x10", 16));
  EXPECT_TRUE(Eval("new==0X1f", 31));
  EXPECT_TRUE(Eval("  new\t== 0  ", 0));
  EXPECT_TRUE(Eval("18446744073709551615 == 0xffffffffffffffff", 0));
  EXPECT_TRUE(Eval("0", 0) == false);
  EXPECT_TRUE(Eval("+new == 3", 3));
  EXPECT_TRUE(Eval("--new == 3", 3));  // two unary minus, not a decrement
}

TEST(ConditionTest, ErrorsGiveTheColumnAndACaret) {
  EXPECT_EQ(ParseError("new >> "),
            "--if 'new >> ': expected an operand at column 8\n"
            "  new >> \n"
            "         ^");
  EXPECT_EQ(ParseError(""),
            "--if '': expected an operand at column 1\n"
            "  \n"
            "  ^");
  EXPECT_EQ(ParseError("new > 1 )"),
            "--if 'new > 1 )': expected an operator before ')' at column 9\n"
            "  new > 1 )\n"
            "          ^");
  EXPECT_THAT(ParseError("(new > 1"),
              HasSubstr("expected ')' to match the '(' of column 1 at column 9"));
  EXPECT_THAT(ParseError("new = 1"), HasSubstr("'=' is not a comparison (use '==') at column 5"));
  EXPECT_THAT(
      ParseError("value > 1"),
      HasSubstr("unknown name 'value' (known: new, old, tid, pid, cpu, len, addr) at column 1"));
  EXPECT_THAT(ParseError("new > 18446744073709551616"),
              HasSubstr("integer literal does not fit in 64 bits at column 7"));
  EXPECT_THAT(ParseError("new > 0x10000000000000000"),
              HasSubstr("integer literal does not fit in 64 bits at column 7"));
  EXPECT_THAT(ParseError("new > 0x"), HasSubstr("hexadecimal literal without digits at column 7"));
  EXPECT_THAT(ParseError("new > 010"), HasSubstr("octal literals are not supported"));
  EXPECT_THAT(ParseError("new > 10u"),
              HasSubstr("invalid character in integer literal at column 9"));
  EXPECT_THAT(ParseError("new @ 1"), HasSubstr("unexpected character '@' at column 5"));
  EXPECT_THAT(ParseError("new * * 2"), HasSubstr("expected an operand before '*' at column 7"));
  EXPECT_THAT(ParseError("new 5"), HasSubstr("expected an operator before '5' at column 5"));
  EXPECT_THAT(ParseError("()"), HasSubstr("expected an operand before ')' at column 2"));
  EXPECT_THAT(ParseError("new > 1 &&"), HasSubstr("expected an operand at column 11"));
  // The caret follows tabs so that it stays under the column.
  EXPECT_THAT(ParseError("\tnew >"), HasSubstr("\n  \tnew >\n  \t     ^"));
}

TEST(ConditionTest, DepthLimits) {
  std::string deep(300, '(');
  deep += "1";
  deep += std::string(300, ')');
  EXPECT_THAT(ParseError(deep), HasSubstr("nested more than 200 levels deep at column 202"));
  std::string nested_ok(100, '(');
  nested_ok += "new";
  nested_ok += std::string(100, ')');
  EXPECT_TRUE(Eval(nested_ok, 1));
  // Right-nested additions keep a value pending per level.
  std::string wide;
  for (int i = 0; i < 70; ++i) {
    wide += "new + (";
  }
  wide += "new";
  wide += std::string(70, ')');
  EXPECT_THAT(ParseError(wide), HasSubstr("condition too complex (more than 64 pending values)"));
  std::string fits;
  for (int i = 0; i < 60; ++i) {
    fits += "new + (";
  }
  fits += "new";
  fits += std::string(60, ')');
  fits += " == 61";
  EXPECT_TRUE(Eval(fits, 1));
}

// Type names as core/symbols spells them: qualifiers lead, but a pointer's follow its '*'.
TEST(TypeNames, QualifiersAreStrippedOnBothSides) {
  EXPECT_EQ(UnqualifiedType("volatile long"), "long");
  EXPECT_EQ(UnqualifiedType("const volatile int"), "int");
  EXPECT_EQ(UnqualifiedType("struct handle *volatile"), "struct handle *");
  EXPECT_EQ(UnqualifiedType("const char * const"), "char *");
  EXPECT_EQ(UnqualifiedType("char *restrict"), "char *");
  EXPECT_EQ(UnqualifiedType("my_const"), "my_const");  // a name ending in a qualifier's letters
  EXPECT_TRUE(IsSignedType("const volatile short"));
  EXPECT_FALSE(IsSignedType("unsigned long"));
  EXPECT_FALSE(IsSignedType("long *volatile"));
}

}  // namespace
// Probe conditions: the probe's arguments by index, paths as names, strings.
ConditionOptions ProbeOptions() {
  ConditionOptions o;
  o.access_names = false;
  o.variables = {{"x", ConditionVariable::Kind::kSigned, ""},
                 {"r->len", ConditionVariable::Kind::kUnsigned, ""},
                 {"comm", ConditionVariable::Kind::kString, "$comm"},
                 {"arg1", ConditionVariable::Kind::kSigned, "$retval"}};
  return o;
}

bool Probe(const std::string& text, std::vector<std::optional<uint64_t>> numbers,
           std::optional<std::string_view> comm = std::nullopt) {
  auto c = Condition::Parse(text, ProbeOptions());
  EXPECT_TRUE(c.ok()) << c.status();
  if (!c.ok()) {
    return false;
  }
  numbers.resize(4);
  std::vector<std::optional<std::string_view>> strings(4);
  strings[2] = comm;
  ConditionInputs in;
  in.tid = 7;
  in.pid = 5;
  in.cpu = 1;
  in.numbers = numbers;
  in.strings = strings;
  return c->Matches(in);
}

TEST(ConditionTest, ProbeVariablesByNameAndAlias) {
  EXPECT_TRUE(Probe("x % 100 == 0", {300}));
  EXPECT_FALSE(Probe("x % 100 == 0", {301}));
  EXPECT_TRUE(Probe("r->len > 10 && tid == 7 && pid == 5 && cpu == 1", {0, 11}));
  EXPECT_TRUE(Probe("$retval == -4", {0, 0, 0, static_cast<uint64_t>(-4)}));
  EXPECT_TRUE(Probe("arg1 < 0", {0, 0, 0, static_cast<uint64_t>(-4)}));
}

TEST(ConditionTest, ProbeSignednessFollowsTheVariablesUsed) {
  // x alone is signed: -1 < 0. With the unsigned r->len taking part, the comparison is
  // unsigned, as C's usual arithmetic conversions make it: -1 is 2^64-1.
  EXPECT_TRUE(Probe("x < 0", {static_cast<uint64_t>(-1), 5}));
  EXPECT_FALSE(Probe("x < 0 + r->len", {static_cast<uint64_t>(-1), 5}));
  EXPECT_TRUE(Probe("x / 2 == -3", {static_cast<uint64_t>(-7)}));
}

TEST(ConditionTest, ProbeStringsCompareWithLiterals) {
  EXPECT_TRUE(Probe("comm == \"prog\"", {}, "prog"));
  EXPECT_TRUE(Probe("\"prog\" == $comm", {}, "prog"));
  EXPECT_FALSE(Probe("comm == \"prog\"", {}, "prog2"));
  EXPECT_TRUE(Probe("comm != \"a\\tb\" && x == 1", {1}, "a b"));
  EXPECT_TRUE(Probe("comm == \"a\\x41\\\"\"", {}, "aA\""));
}

TEST(ConditionTest, ProbeMissingValueIsFalseAndCounted) {
  auto c = Condition::Parse("x == 1 || r->len == 2", ProbeOptions());
  ASSERT_TRUE(c.ok());
  std::vector<std::optional<uint64_t>> numbers = {std::nullopt, 2, std::nullopt, std::nullopt};
  std::vector<std::optional<std::string_view>> strings(4);
  ConditionInputs in;
  in.numbers = numbers;
  in.strings = strings;
  EXPECT_FALSE(c->Matches(in));
  EXPECT_EQ(c->stats().missing_value, 1U);
  EXPECT_TRUE(c->uses_variable(0));
  EXPECT_TRUE(c->uses_variable(1));
  EXPECT_FALSE(c->uses_variable(2));
}

TEST(ConditionTest, ProbeErrorsPointIntoTheSpec) {
  ConditionOptions o = ProbeOptions();
  o.context = "tick x if x >> ";
  o.context_offset = 10;
  auto c = Condition::Parse("x >> ", o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(),
            "probe 'tick x if x >> ': expected an operand at column 16\n  tick x if x >> \n"
            "                 ^");
  EXPECT_THAT(Condition::Parse("new == 1", ProbeOptions()).status().message(),
              HasSubstr("unknown name 'new' (known: tid, pid, cpu, x, r->len, comm, arg1)"));
  EXPECT_THAT(Condition::Parse("comm + 1", ProbeOptions()).status().message(),
              HasSubstr("'comm' is a string: compare it with == or != to a \"literal\""));
  EXPECT_THAT(Condition::Parse("x == \"a", ProbeOptions()).status().message(),
              HasSubstr("string literal without its closing"));
  // Access conditions keep their names, and no strings or paths.
  EXPECT_THAT(Condition::Parse("new == \"a\"").status().message(),
              HasSubstr("unexpected character '\"'"));
}

TEST(ConditionTest, NamesInListsPathsOnce) {
  EXPECT_THAT(Condition::NamesIn("r->len > 2 && x[3] == $retval || r->len < a.b->c"),
              ::testing::ElementsAre("r->len", "x[3]", "$retval", "a.b->c"));
  EXPECT_THAT(Condition::NamesIn("comm == \"x y\""), ::testing::ElementsAre("comm"));
}

}  // namespace kwatch::watch
