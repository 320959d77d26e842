#include "core/probe/probe_spec.h"

#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace kwatch::core::probe {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

ProbePoint Point(const std::string& text) {
  absl::StatusOr<ProbePoint> p = ParseProbePoint(text);
  EXPECT_TRUE(p.ok()) << text << ": " << p.status();
  return p.ok() ? *p : ProbePoint{};
}

ProbeArgSpec Arg(const std::string& text) {
  absl::StatusOr<ProbeArgSpec> a = ParseProbeArg(text);
  EXPECT_TRUE(a.ok()) << text << ": " << a.status();
  return a.ok() ? *a : ProbeArgSpec{};
}

std::string PointError(const std::string& text) {
  absl::StatusOr<ProbePoint> p = ParseProbePoint(text);
  EXPECT_FALSE(p.ok()) << text;
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(p.status().message());
}

std::string ArgError(const std::string& text) {
  absl::StatusOr<ProbeArgSpec> a = ParseProbeArg(text);
  EXPECT_FALSE(a.ok()) << text;
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(a.status().message());
}

TEST(ProbeSpecPoint, Function) {
  const ProbePoint p = Point("add_ints");
  EXPECT_EQ(p.kind, ProbePoint::Kind::kFunction);
  EXPECT_EQ(p.function, "add_ints");
  EXPECT_EQ(p.offset, 0u);
  EXPECT_FALSE(p.is_return);
  EXPECT_FALSE(p.line.has_value());
  EXPECT_EQ(p.event, "");
  EXPECT_EQ(p.file, "");
}

TEST(ProbeSpecPoint, OffsetsDecimalAndHex) {
  EXPECT_EQ(Point("f+16").offset, 16u);
  EXPECT_EQ(Point("f+0x10").offset, 16u);
  EXPECT_EQ(Point("f+0").offset, 0u);
}

TEST(ProbeSpecPoint, ReturnRelativeLinePatternAndSource) {
  const ProbePoint r = Point("fact%return");
  EXPECT_TRUE(r.is_return);
  EXPECT_EQ(r.function, "fact");
  const ProbePoint l = Point("loop_lines:4");
  ASSERT_TRUE(l.line.has_value());
  EXPECT_EQ(*l.line, 4);
  EXPECT_EQ(l.kind, ProbePoint::Kind::kFunction);
  const ProbePoint at = Point("add_ints@probe_args.c+4");
  EXPECT_EQ(at.file, "probe_args.c");
  EXPECT_EQ(at.offset, 4u);
  const ProbePoint atr = Point("add_ints@src/probe_args.c%return");
  EXPECT_EQ(atr.file, "src/probe_args.c");
  EXPECT_TRUE(atr.is_return);
  const ProbePoint pat = Point("loop_lines;acc += *");
  EXPECT_EQ(pat.function, "loop_lines");
  EXPECT_EQ(pat.pattern, "acc += *");
}

TEST(ProbeSpecPoint, SourceLinesAndAddresses) {
  const ProbePoint s = Point("probe_args.c:42");
  EXPECT_EQ(s.kind, ProbePoint::Kind::kSourceLine);
  EXPECT_EQ(s.file, "probe_args.c");
  EXPECT_EQ(*s.line, 42);
  const ProbePoint sp = Point("dir/probe_args.c;tick(i)*");
  EXPECT_EQ(sp.kind, ProbePoint::Kind::kSourceLine);
  EXPECT_EQ(sp.file, "dir/probe_args.c");
  EXPECT_EQ(sp.pattern, "tick(i)*");
  const ProbePoint a = Point("0x1149");
  EXPECT_EQ(a.kind, ProbePoint::Kind::kAddress);
  EXPECT_EQ(a.address, 0x1149u);
}

TEST(ProbeSpecPoint, EventAndGroup) {
  const ProbePoint e = Point("myev=add_ints+4");
  EXPECT_EQ(e.event, "myev");
  EXPECT_EQ(e.group, "");
  EXPECT_EQ(e.function, "add_ints");
  EXPECT_EQ(e.offset, 4u);
  const ProbePoint g = Point("grp:ev=probe_args.c:10");
  EXPECT_EQ(g.group, "grp");
  EXPECT_EQ(g.event, "ev");
  EXPECT_EQ(g.kind, ProbePoint::Kind::kSourceLine);
  EXPECT_EQ(Point("r=0x10").address, 0x10u);
}

TEST(ProbeSpecPoint, Errors) {
  EXPECT_EQ(
      PointError(""),
      "empty probe point: give FUNC, FUNC+OFF, FUNC%return, FUNC:RELLINE, SRC:LINE or 0xADDR");
  EXPECT_EQ(PointError("f+0x1g"),
            "bad probe point 'f+0x1g': '0x1g' is not a number (decimal or 0x hexadecimal)");
  EXPECT_EQ(PointError("f%ret"),
            "bad probe point 'f%ret': unknown suffix '%ret': the only one is '%return' (a return "
            "probe)");
  EXPECT_EQ(PointError("f+4%return"),
            "bad probe point 'f+4%return': a return probe takes no offset: write FUNC%return");
  EXPECT_EQ(PointError("f:x"),
            "bad probe point 'f:x': 'x' is not a line number (FUNC:RELLINE counts lines from the "
            "function's first line, 0 being that line)");
  EXPECT_EQ(PointError("probe_args.c"),
            "bad probe point 'probe_args.c': 'probe_args.c' is a source file: give a line "
            "('probe_args.c:42') or a pattern ('probe_args.c;count++')");
  EXPECT_EQ(PointError("a.c+4"),
            "bad probe point 'a.c+4': a source file takes ':LINE' or ';PATTERN', not '+4'");
  EXPECT_EQ(PointError("a.c:0"),
            "bad probe point 'a.c:0': '0' is not a line number (lines start at 1)");
  EXPECT_EQ(PointError("1ev=f"),
            "bad probe point '1ev=f': '1ev' is not a valid event name (letters, digits, '_', not "
            "starting with a digit)");
  EXPECT_EQ(PointError("ev="),
            "bad probe point 'ev=': nothing after 'EVENT=': give the probe site");
  EXPECT_EQ(PointError("f@"),
            "bad probe point 'f@': '@' must be followed by a source file name (FUNC@SRC)");
  EXPECT_EQ(PointError("f;"), "bad probe point 'f;': empty pattern after ';'");
  EXPECT_EQ(PointError("0xzz"),
            "bad probe point '0xzz': '0xzz' is not a number (decimal or 0x hexadecimal)");
  EXPECT_EQ(PointError("f-x"),
            "bad probe point 'f-x': 'f-x' is not a function name (letters, digits, '_'; a source "
            "file name has a '.')");
}

TEST(ProbeSpecArg, Registers) {
  const ProbeArgSpec di = Arg("%di");
  EXPECT_EQ(di.kind, ProbeArgSpec::Kind::kRegister);
  EXPECT_EQ(di.reg, "di");
  EXPECT_EQ(di.text, "%di");
  EXPECT_FALSE(di.type.has_value());
  for (const char* r : {"%ax", "%rdi", "%eax", "%ip", "%sp", "%r8", "%r15d", "%flags", "%rip"}) {
    EXPECT_EQ(Arg(r).kind, ProbeArgSpec::Kind::kRegister) << r;
  }
  EXPECT_EQ(ArgError("%dd"),
            "bad argument '%dd': unknown register '%dd'; did you mean '%di'? (x86-64: %ax..%r15 "
            "as kprobe names them, %rax..%r15, %eax..%r15d)");
}

TEST(ProbeSpecArg, MemoryAndStack) {
  const ProbeArgSpec a = Arg("@0x4010");
  EXPECT_EQ(a.kind, ProbeArgSpec::Kind::kAddress);
  EXPECT_EQ(a.address, 0x4010u);
  EXPECT_EQ(Arg("@4096").address, 4096u);
  const ProbeArgSpec s = Arg("@g_items+8");
  EXPECT_EQ(s.kind, ProbeArgSpec::Kind::kSymbol);
  EXPECT_EQ(s.symbol, "g_items");
  EXPECT_EQ(s.symbol_offset, 8);
  EXPECT_EQ(Arg("@g_total-0x10").symbol_offset, -16);
  EXPECT_EQ(Arg("@g_total").symbol_offset, 0);
  const ProbeArgSpec st = Arg("$stack3");
  EXPECT_EQ(st.kind, ProbeArgSpec::Kind::kStackSlot);
  EXPECT_EQ(st.stack_index, 3u);
  EXPECT_EQ(Arg("$stack").kind, ProbeArgSpec::Kind::kStackPointer);
  EXPECT_EQ(Arg("$retval").kind, ProbeArgSpec::Kind::kRetval);
  EXPECT_EQ(Arg("$comm").kind, ProbeArgSpec::Kind::kComm);
  EXPECT_EQ(Arg("$params").kind, ProbeArgSpec::Kind::kParams);
  EXPECT_EQ(Arg("$vars").kind, ProbeArgSpec::Kind::kVars);
  EXPECT_EQ(ArgError("$stak"),
            "bad argument '$stak': unknown special variable '$stak' (special variables: $stackN, "
            "$stack, $retval, $comm, $params, $vars)");
  EXPECT_EQ(ArgError("@"),
            "bad argument '@': '@' must be followed by an address or a symbol (@0x4010, "
            "@g_count)");
  EXPECT_EQ(ArgError("@g+x"),
            "bad argument '@g+x': 'x' is not a number (decimal or 0x hexadecimal)");
}

TEST(ProbeSpecArg, DereferencesNestAnyDepth) {
  const ProbeArgSpec one = Arg("+8(%di):u32");
  EXPECT_EQ(one.kind, ProbeArgSpec::Kind::kRegister);
  EXPECT_EQ(one.reg, "di");
  EXPECT_THAT(one.derefs, ElementsAre(8));
  EXPECT_EQ(one.type, (ArgType{ArgType::Kind::kUnsigned, 32}));
  const ProbeArgSpec nested = Arg("+4(-0x10(+16($stack2)))");
  EXPECT_EQ(nested.kind, ProbeArgSpec::Kind::kStackSlot);
  EXPECT_EQ(nested.stack_index, 2u);
  EXPECT_THAT(nested.derefs, ElementsAre(16, -16, 4));
  EXPECT_THAT(Arg("0(%ax)").derefs, ElementsAre(0));
  EXPECT_THAT(Arg("+0(p):string").derefs, ElementsAre(0));
  EXPECT_EQ(ArgError("+8%di"),
            "bad argument '+8%di': '+8%di' is not a dereference: write +OFF(ARG), e.g. +8(%di)");
  EXPECT_EQ(ArgError("+8($comm)"), "bad argument '+8($comm)': '$comm' cannot be dereferenced");
  EXPECT_EQ(ArgError("+z(%di)"),
            "bad argument '+z(%di)': 'z' is not a number (decimal or 0x hexadecimal)");
}

TEST(ProbeSpecArg, TypesAndNames) {
  const struct {
    const char* text;
    ArgType type;
  } kCases[] = {
      {"%ax:u8", {ArgType::Kind::kUnsigned, 8}},      {"%ax:u16", {ArgType::Kind::kUnsigned, 16}},
      {"%ax:u64", {ArgType::Kind::kUnsigned, 64}},    {"%ax:s8", {ArgType::Kind::kSigned, 8}},
      {"%ax:s32", {ArgType::Kind::kSigned, 32}},      {"%ax:x16", {ArgType::Kind::kHex, 16}},
      {"%ax:x64", {ArgType::Kind::kHex, 64}},         {"@0x10:string", {ArgType::Kind::kString, 0}},
      {"@0x10:ustring", {ArgType::Kind::kString, 0}},
  };
  for (const auto& c : kCases) {
    EXPECT_EQ(Arg(c.text).type, c.type) << c.text;
  }
  const ProbeArgSpec named = Arg("len=p->len:u32");
  EXPECT_EQ(named.name, "len");
  EXPECT_EQ(named.text, "p->len");
  EXPECT_EQ(named.kind, ProbeArgSpec::Kind::kVariable);
  EXPECT_EQ(ArgType({ArgType::Kind::kSigned, 16}).Name(), "s16");
  EXPECT_EQ(ArgType({ArgType::Kind::kString, 0}).Name(), "string");
  EXPECT_EQ(ArgError("x:u7"),
            "bad argument 'x:u7': unknown type 'u7' (types: u8 u16 u32 u64 s8 s16 s32 s64 x8 x16 "
            "x32 x64 string)");
  EXPECT_EQ(ArgError("a-b=x"),
            "bad argument 'a-b=x': 'a-b' is not a valid argument name (letters, digits, '_', not "
            "starting with a digit)");
  EXPECT_EQ(ArgError("$comm:u32"),
            "bad argument '$comm:u32': $comm is a string: it takes no other type");
  EXPECT_EQ(ArgError("$vars:u8"),
            "bad argument '$vars:u8': '$vars' takes no type: each variable has its own");
  EXPECT_EQ(ArgError("all=$params"),
            "bad argument 'all=$params': '$params' stands for several arguments: it takes no name");
}

TEST(ProbeSpecArg, DwarfExpressions) {
  const ProbeArgSpec v = Arg("p->next->values[2]");
  EXPECT_EQ(v.kind, ProbeArgSpec::Kind::kVariable);
  EXPECT_EQ(v.variable.base, "p");
  ASSERT_EQ(v.variable.steps.size(), 3u);
  EXPECT_EQ(v.variable.steps[0].kind, symbols::ExprStep::Kind::kArrow);
  EXPECT_EQ(v.variable.steps[0].member, "next");
  EXPECT_EQ(v.variable.steps[1].kind, symbols::ExprStep::Kind::kArrow);
  EXPECT_EQ(v.variable.steps[2].kind, symbols::ExprStep::Kind::kIndex);
  EXPECT_EQ(v.variable.steps[2].index, 2);
  const ProbeArgSpec dot = Arg("local.label:string");
  EXPECT_EQ(dot.variable.base, "local");
  EXPECT_EQ(dot.variable.steps[0].kind, symbols::ExprStep::Kind::kMember);
  EXPECT_EQ(dot.type->kind, ArgType::Kind::kString);
  EXPECT_EQ(ArgError("p->"),
            "bad argument 'p->': expected a member name after '->' at column 4\n  p->\n     ^");
  EXPECT_EQ(ArgError("!x"),
            "bad argument '!x': '!x': expected %REG, @ADDR, @SYM, $stackN, $stack, $retval, $comm, "
            "$params, $vars, +OFF(ARG) or a variable name");
}

TEST(ProbeSpec, PointAndArguments) {
  absl::StatusOr<ProbeSpec> s =
      ParseProbeSpec("ev=sum_item p->len:u32  +8(%di):u32\t$stack1 name=%si");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->point.event, "ev");
  EXPECT_EQ(s->point.function, "sum_item");
  ASSERT_EQ(s->args.size(), 4u);
  EXPECT_EQ(s->args[0].text, "p->len");
  EXPECT_EQ(s->args[1].text, "+8(%di)");
  EXPECT_EQ(s->args[2].kind, ProbeArgSpec::Kind::kStackSlot);
  EXPECT_EQ(s->args[3].name, "name");
  EXPECT_FALSE(ParseProbeSpec("  ").ok());
  absl::StatusOr<ProbeSpec> bad = ParseProbeSpec("f %zz");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("unknown register '%zz'"));
}

}  // namespace
}  // namespace kwatch::core::probe
