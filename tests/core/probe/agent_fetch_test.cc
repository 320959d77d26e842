#include "core/probe/agent_fetch.h"

#include <dwarf.h>
#include <sys/ptrace.h>
#include <sys/user.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/probe/fetch.h"
#include "core/probe/fetch_format.h"
#include "core/probe/int3_engine.h"
#include "core/probe/probe_spec.h"
#include "core/probe/probe_target.h"
#include "core/ptrace/maps.h"
#include "core/ptrace/process.h"
#include "tests/core/probe/agent_interpreter.h"
#include "tests/test_util.h"

namespace kwatch::core::probe {
namespace {

using ::kwatch::testing::AgentInterpreter;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr uint64_t kPage = 4096;

// ---------------------------------------------------------------------------------------
// Without a process: registers, %xmm registers and a sparse memory of pages made up by the
// test, evaluated both ways.

class FakeMemory {
 public:
  // Maps the pages covering [addr, addr + bytes.size()) (zero-filled) and writes `bytes`.
  void Put(uint64_t addr, const std::vector<uint8_t>& bytes) {
    for (size_t i = 0; i < bytes.size(); ++i) {
      pages_[(addr + i) / kPage][(addr + i) % kPage] = bytes[i];
    }
  }
  void PutU64(uint64_t addr, uint64_t v) {
    std::vector<uint8_t> b(8);
    std::memcpy(b.data(), &v, 8);
    Put(addr, b);
  }
  void PutString(uint64_t addr, const std::string& s, bool nul = true) {
    std::vector<uint8_t> b(s.begin(), s.end());
    if (nul) {
      b.push_back(0);
    }
    Put(addr, b);
  }
  bool Read(uint64_t addr, std::span<uint8_t> out) const {
    for (size_t i = 0; i < out.size(); ++i) {
      const auto it = pages_.find((addr + i) / kPage);
      if (it == pages_.end()) {
        return false;
      }
      out[i] = it->second[(addr + i) % kPage];
    }
    return true;
  }

 private:
  std::map<uint64_t, std::array<uint8_t, kPage>> pages_;
};

std::string ValueText(const absl::StatusOr<std::string>& v) {
  return v.ok() ? *v : FetchErrorText(v.status());
}

struct Both {
  std::string evaluated;  // core::Evaluate
  std::string agent;      // compiled, interpreted, formatted
  AgentFetchProgram program;
  std::vector<uint8_t> payload;
  uint32_t not_sampled = 0;
};

struct Machine {
  user_regs_struct regs{};
  user_fpregs_struct fp{};
  FakeMemory mem;
  uint64_t bias = 0;
  bool at_return = false;

  Both Run(const CompiledArg& arg, const AgentFetchOptions& opts = {}) const {
    Both b;
    FetchContext ctx;
    ctx.regs = &regs;
    ctx.fpregs = &fp;
    ctx.load_bias = bias;
    ctx.at_return = at_return;
    ctx.tid = getpid();
    ctx.read = [this](RemoteAddr a, std::span<uint8_t> out) {
      return mem.Read(a.value, out) ? absl::OkStatus() : absl::NotFoundError("unmapped");
    };
    b.evaluated = ValueText(Evaluate(arg, ctx));
    const std::vector<CompiledArg> args = {arg};
    absl::StatusOr<AgentFetchProgram> prog = CompileAgentFetch(args, bias, opts);
    EXPECT_TRUE(prog.ok()) << prog.status();
    if (!prog.ok()) {
      return b;
    }
    b.program = *prog;
    AgentInterpreter interp(
        regs, &fp, [this](uint64_t a, std::span<uint8_t> out) { return mem.Read(a, out); });
    b.payload = interp.Run(b.program.ops, b.program.record_bytes);
    EXPECT_LE(b.payload.size(), b.program.record_bytes);
    AgentRecordContext rc;
    rc.load_bias = bias;
    rc.at_return = at_return;
    rc.tid = getpid();
    absl::StatusOr<AgentArgValues> v = FormatAgentRecord(args, b.program, b.payload, rc);
    EXPECT_TRUE(v.ok()) << v.status();
    if (v.ok()) {
      EXPECT_EQ(v->args.size(), 1u);
      b.agent = v->args.empty() ? "" : v->args[0].second;
      b.not_sampled = v->not_sampled;
    }
    return b;
  }
};

CompiledArg RegArg(size_t offset, ArgType type, std::vector<FetchStep> steps = {},
                   uint8_t reg_bytes = 8) {
  CompiledArg a;
  a.name = a.text = "arg";
  a.base = CompiledArg::Base::kRegister;
  a.reg_offset = offset;
  a.reg_bytes = reg_bytes;
  a.type = type;
  a.size = type.bits / 8;
  a.steps = std::move(steps);
  return a;
}

CompiledArg LocArg(std::vector<DwarfOp> ops, ArgType type, std::vector<FetchStep> steps = {}) {
  CompiledArg a;
  a.name = a.text = "var";
  a.base = CompiledArg::Base::kLocation;
  a.location = std::move(ops);
  a.type = type;
  a.size = type.bits / 8;
  a.steps = std::move(steps);
  return a;
}

DwarfOp D(uint8_t atom, uint64_t number = 0, uint64_t number2 = 0) {
  return DwarfOp{atom, number, number2, {}};
}

constexpr ArgType kS32{ArgType::Kind::kSigned, 32};
constexpr ArgType kS64{ArgType::Kind::kSigned, 64};
constexpr ArgType kU64{ArgType::Kind::kUnsigned, 64};
constexpr ArgType kX64{ArgType::Kind::kHex, 64};
constexpr ArgType kF64{ArgType::Kind::kFloat, 64};
constexpr ArgType kF32{ArgType::Kind::kFloat, 32};
constexpr ArgType kString{ArgType::Kind::kString, 0};
const FetchStep kDeref{FetchStep::Kind::kDeref, 0};
FetchStep Off(int64_t o) {
  return FetchStep{FetchStep::Kind::kOffset, o};
}

std::vector<std::string> Shape(const AgentFetchProgram& p) {
  std::vector<std::string> out;
  for (const agent::KwFetchOp& op : p.ops) {
    out.push_back(absl::StrCat(op.op, ":", op.a, ":", op.b, ":", op.imm));
  }
  return out;
}

class AgentFetchPure : public ::testing::Test {
 protected:
  void SetUp() override {
    m_.regs.rdi = 0x10000;
    m_.regs.rsi = 0xfffffffe00000007ULL;  // esi = 7
    m_.regs.rbx = 40;
    m_.regs.rax = 2;
    m_.regs.rsp = 0x7fe000 - 64;
    m_.regs.rbp = 0x7fe000 + 0x100;  // inside the fallback's 512-byte stack slice
    m_.regs.r8 = (m_.regs.rsp << 8) | 0xaa;
    // A struct at 0x10000: {long id = -5; int len = 9; char* name = 0x20000; next = bad}.
    m_.mem.PutU64(0x10000, static_cast<uint64_t>(-5));
    m_.mem.PutU64(0x10008, 9);
    m_.mem.PutU64(0x10010, 0x20000);
    m_.mem.PutU64(0x10018, 0x5000000);  // unmapped
    m_.mem.PutString(0x20000, "hello \"agent\"\n");
    m_.mem.PutU64(0x10100, 0x10000);  // a global pointer to the struct
    // The stack: each word holds its address, but a saved value at rbp - 16 and a pointer to
    // the struct at rbp + 8.
    for (uint64_t a = m_.regs.rsp; a < m_.regs.rbp + 64; a += 8) {
      m_.mem.PutU64(a, a);
    }
    m_.mem.PutU64(m_.regs.rbp - 16, 1234);
    m_.mem.PutU64(m_.regs.rbp + 8, 0x10000);
    const double d = 2.5;
    std::memcpy(&m_.fp.xmm_space[4], &d, 8);  // %xmm1
    const float f = -0.75F;
    std::memcpy(&m_.fp.xmm_space[8], &f, 4);  // %xmm2
  }

  // How an argument was compiled: into a program computing its place (kBytes, kString,
  // kConstant), into parts kwatch finishes (kExpression), or the fallback.
  enum class Tier { kDirect, kParts, kFallback };

  void ExpectSame(const CompiledArg& arg, const std::string& want, Tier tier) {
    const Both b = m_.Run(arg);
    EXPECT_EQ(b.agent, b.evaluated);
    EXPECT_EQ(b.evaluated, want);
    ASSERT_EQ(b.program.args.size(), 1u);
    const AgentArgPlan& plan = b.program.args[0];
    const Tier got = plan.kind == AgentArgPlan::Kind::kFallback     ? Tier::kFallback
                     : plan.kind == AgentArgPlan::Kind::kExpression ? Tier::kParts
                                                                    : Tier::kDirect;
    EXPECT_EQ(got, tier) << plan.reason;
  }

  Machine m_;
};

TEST_F(AgentFetchPure, RegistersAndDerefsCompileToTheirOps) {
  const Both reg = m_.Run(RegArg(offsetof(user_regs_struct, rdi), kX64));
  EXPECT_THAT(Shape(reg.program), ElementsAre("1:0:0:0", "2:14:8:0", "8:0:8:0", "0:0:0:0"));
  EXPECT_EQ(reg.program.record_bytes, 16u);
  EXPECT_EQ(reg.agent, "0x10000");
  EXPECT_EQ(reg.agent, reg.evaluated);

  // +8(%di):u32 is the register's value plus 8, then 4 bytes there.
  const Both mem = m_.Run(RegArg(offsetof(user_regs_struct, rdi),
                                 ArgType{ArgType::Kind::kUnsigned, 32}, {kDeref, Off(8)}));
  EXPECT_THAT(Shape(mem.program),
              ElementsAre("1:0:0:0", "2:14:8:0", "4:0:0:8", "6:0:4:0", "0:0:0:0"));
  EXPECT_EQ(mem.agent, "9");
  EXPECT_EQ(mem.agent, mem.evaluated);

  // +0(+16(%di)):string: two dereferences, a string of at most 257 bytes.
  const Both str =
      m_.Run(RegArg(offsetof(user_regs_struct, rdi), kString, {kDeref, Off(16), kDeref, Off(0)}));
  EXPECT_THAT(Shape(str.program),
              ElementsAre("1:0:0:0", "2:14:8:0", "4:0:0:16", "5:0:0:0", "7:0:257:0", "0:0:0:0"));
  EXPECT_EQ(str.program.record_bytes, 8u + 264u);
  EXPECT_EQ(str.agent, "\"hello \\\"agent\\\"\\n\"");
  EXPECT_EQ(str.agent, str.evaluated);

  // %esi: 4 bytes, zero-extended.
  const Both esi =
      m_.Run(RegArg(offsetof(user_regs_struct, rsi), ArgType{ArgType::Kind::kHex, 32}, {}, 4));
  EXPECT_THAT(Shape(esi.program), ElementsAre("1:0:0:0", "2:13:4:0", "8:0:4:0", "0:0:0:0"));
  EXPECT_EQ(esi.agent, "0x7");
  EXPECT_EQ(esi.agent, esi.evaluated);
}

TEST_F(AgentFetchPure, AddressesTakeTheLoadBias) {
  m_.bias = 0x10000;
  CompiledArg a;
  a.name = a.text = "@g";
  a.base = CompiledArg::Base::kAddress;
  a.address = 0x8;
  a.type = kU64;
  const Both b = m_.Run(a);
  EXPECT_THAT(Shape(b.program), ElementsAre("1:0:0:0", "3:0:0:65544", "6:0:8:0", "0:0:0:0"));
  EXPECT_EQ(b.agent, "9");
  EXPECT_EQ(b.agent, b.evaluated);
}

TEST_F(AgentFetchPure, CommIsReadAtTheHit) {
  CompiledArg a;
  a.name = a.text = "$comm";
  a.base = CompiledArg::Base::kComm;
  a.type = kString;
  const Both b = m_.Run(a);
  EXPECT_THAT(Shape(b.program), ElementsAre("1:0:0:0", "13:0:0:0", "0:0:0:0"));
  EXPECT_EQ(b.program.args[0].kind, AgentArgPlan::Kind::kString);
  EXPECT_EQ(b.program.record_bytes, 8u + 16u);
  EXPECT_EQ(b.agent, b.evaluated);
  EXPECT_EQ(b.agent.front(), '"');
}

TEST_F(AgentFetchPure, RetvalOnlyAtReturnRecords) {
  CompiledArg a = RegArg(offsetof(user_regs_struct, rax), kS64);
  a.needs_return = true;
  m_.at_return = true;
  EXPECT_EQ(m_.Run(a).agent, "2");
  m_.at_return = false;
  const Both b = m_.Run(a);
  EXPECT_EQ(b.agent, b.evaluated);
  EXPECT_EQ(b.agent, "<error: $retval exists only at a function's return>");
}

TEST_F(AgentFetchPure, DwarfFormsThatLower) {
  // DW_OP_reg5 (rdi): the register's value.
  ExpectSame(LocArg({D(DW_OP_reg5)}, kX64), "0x10000", Tier::kDirect);
  // DW_OP_regx 3 (rbx) as a 32-bit int.
  ExpectSame(LocArg({D(DW_OP_regx, 3)}, kS32), "40", Tier::kDirect);
  // DW_OP_breg5 0 then members: p->id, p->name:string, p->next->id (fault).
  ExpectSame(LocArg({D(DW_OP_reg5)}, kS64, {kDeref, Off(0)}), "-5", Tier::kDirect);
  ExpectSame(LocArg({D(DW_OP_reg5)}, kString, {kDeref, Off(16), kDeref}),
             "\"hello \\\"agent\\\"\\n\"", Tier::kDirect);
  ExpectSame(LocArg({D(DW_OP_reg5)}, kS64, {kDeref, Off(24), kDeref, Off(0)}), "(fault)",
             Tier::kDirect);
  // A frame-base variable as CompileLocation expands DW_OP_fbreg -16 with DW_AT_frame_base
  // DW_OP_call_frame_cfa and the CFA rule rbp+16: bregx(6, 16); consts -32; plus.
  ExpectSame(
      LocArg({D(DW_OP_bregx, 6, 16), D(DW_OP_consts, static_cast<uint64_t>(-32)), D(DW_OP_plus)},
             kS64),
      "1234", Tier::kDirect);
  // DW_OP_breg7 (rsp) + plus_uconst, and a pointer on the stack followed.
  ExpectSame(LocArg({D(DW_OP_breg7, m_.regs.rbp + 8 - 16 - m_.regs.rsp), D(DW_OP_plus_uconst, 16)},
                    kS64, {kDeref, Off(8)}),
             "9", Tier::kDirect);
  // DW_OP_addr + bias, deref: a global pointer's target.
  m_.bias = 0x1000;
  ExpectSame(LocArg({D(DW_OP_addr, 0xf100), D(DW_OP_deref), D(DW_OP_lit8), D(DW_OP_plus)}, kU64),
             "9", Tier::kDirect);
  ExpectSame(LocArg({D(DW_OP_addr, 0xf000)}, kS64), "-5", Tier::kDirect);
  m_.bias = 0;
  // Values: DW_OP_breg3 -1; DW_OP_stack_value, DW_OP_lit7; DW_OP_stack_value, implicit.
  ExpectSame(LocArg({D(DW_OP_breg3, static_cast<uint64_t>(-1)), D(DW_OP_stack_value)}, kS32), "39",
             Tier::kDirect);
  ExpectSame(LocArg({D(DW_OP_breg3, 0), D(DW_OP_lit4), D(DW_OP_minus), D(DW_OP_stack_value)}, kS32),
             "36", Tier::kDirect);
  ExpectSame(LocArg({D(DW_OP_lit7), D(DW_OP_stack_value)}, kS32), "7", Tier::kDirect);
  DwarfOp imp{DW_OP_implicit_value, 4, 0, {0xfe, 0xff, 0xff, 0xff}};
  ExpectSame(LocArg({imp}, kS32), "-2", Tier::kDirect);
  // A pointer known as a value (DW_OP_addr; DW_OP_stack_value), dereferenced.
  ExpectSame(LocArg({D(DW_OP_addr, 0x10000), D(DW_OP_stack_value)}, kS64, {kDeref, Off(8)}), "9",
             Tier::kDirect);
  // %xmm1 as a double, %xmm2 as a float.
  ExpectSame(LocArg({D(DW_OP_reg18)}, kF64), "2.5", Tier::kDirect);
  ExpectSame(LocArg({D(DW_OP_reg19)}, kF32), "-0.75", Tier::kDirect);
  // A struct in a register: an offset within its bytes is left to the formatter.
  ExpectSame(LocArg({D(DW_OP_reg4)}, kS32, {Off(4)}), "-2", Tier::kDirect);
}

TEST_F(AgentFetchPure, ConstantsCaptureNothing) {
  const Both b = m_.Run(LocArg({D(DW_OP_lit7), D(DW_OP_stack_value)}, kS32));
  EXPECT_EQ(b.program.args[0].kind, AgentArgPlan::Kind::kConstant);
  EXPECT_THAT(Shape(b.program), ElementsAre("0:0:0:0"));
  EXPECT_EQ(b.program.record_bytes, 0u);
  EXPECT_TRUE(b.payload.empty());
}

TEST_F(AgentFetchPure, ValuesComputedFromParts) {
  // Two registers: DW_OP_breg3 0; DW_OP_breg0 0; DW_OP_plus; DW_OP_stack_value (gcc -O2): the
  // agent stores both, kwatch adds them.
  const Both two =
      m_.Run(LocArg({D(DW_OP_breg3), D(DW_OP_breg0), D(DW_OP_plus), D(DW_OP_stack_value)}, kS64));
  EXPECT_EQ(two.program.args[0].kind, AgentArgPlan::Kind::kExpression);
  EXPECT_THAT(Shape(two.program),
              ElementsAre("1:0:0:0", "2:5:8:0", "8:0:8:0", "2:10:8:0", "8:0:8:0", "0:0:0:0"));
  EXPECT_EQ(two.program.record_bytes, 8u + 16u);
  EXPECT_EQ(two.agent, "42");
  EXPECT_EQ(two.agent, two.evaluated);
  // gcc's sign extension of an int in memory: DW_OP_breg6 -16; DW_OP_deref_size 4;
  // DW_OP_const1u 32; DW_OP_shl; DW_OP_const1u 32; DW_OP_shra; DW_OP_stack_value.
  m_.mem.PutU64(m_.regs.rbp - 16, 0xfffffff9);
  const Both sext = m_.Run(LocArg(
      {D(DW_OP_breg6, static_cast<uint64_t>(-16)), D(DW_OP_deref_size, 4), D(DW_OP_const1u, 32),
       D(DW_OP_shl), D(DW_OP_const1u, 32), D(DW_OP_shra), D(DW_OP_stack_value)},
      kS64));
  EXPECT_THAT(Shape(sext.program),
              ElementsAre("1:0:0:0", "2:4:8:0", "4:0:0:-16", "5:0:4:0", "8:0:8:0", "0:0:0:0"));
  EXPECT_EQ(sext.agent, "-7");
  EXPECT_EQ(sext.agent, sext.evaluated);
  m_.mem.PutU64(m_.regs.rbp - 16, 1234);
  // A value in pieces (a struct passed in rdx:rcx), its second member.
  m_.regs.rdx = 11;
  m_.regs.rcx = static_cast<uint64_t>(-13);
  ExpectSame(
      LocArg({D(DW_OP_reg1), D(DW_OP_piece, 8), D(DW_OP_reg2), D(DW_OP_piece, 8)}, kS64, {Off(8)}),
      "-13", Tier::kParts);
  // Pieces of memory and of %xmm1.
  ExpectSame(LocArg({D(DW_OP_breg6, static_cast<uint64_t>(-16)), D(DW_OP_piece, 4), D(DW_OP_reg19),
                     D(DW_OP_piece, 4)},
                    kX64),
             "0xbf400000000004d2", Tier::kParts);
  const Both xmm =
      m_.Run(LocArg({D(DW_OP_reg18), D(DW_OP_piece, 8), D(DW_OP_reg5), D(DW_OP_piece, 8)}, kF64));
  EXPECT_TRUE(xmm.program.needs_fpregs);
  EXPECT_EQ(xmm.agent, "2.5");
  EXPECT_EQ(xmm.agent, xmm.evaluated);
  // Arithmetic the program has no op for; a register subtracted from a constant.
  ExpectSame(LocArg({D(DW_OP_breg3), D(DW_OP_lit3), D(DW_OP_mul), D(DW_OP_stack_value)}, kS64),
             "120", Tier::kParts);
  ExpectSame(LocArg({D(DW_OP_lit1), D(DW_OP_breg3), D(DW_OP_minus), D(DW_OP_stack_value)}, kS64),
             "-39", Tier::kParts);
  // A global read with DW_OP_deref_size, then masked.
  m_.bias = 0x1000;
  ExpectSame(LocArg({D(DW_OP_addr, 0xf008), D(DW_OP_deref_size, 2), D(DW_OP_lit3), D(DW_OP_and),
                     D(DW_OP_stack_value)},
                    kS64),
             "1", Tier::kParts);
  m_.bias = 0;
  // A fault in a part is the argument's fault.
  ExpectSame(LocArg({D(DW_OP_breg5, 24), D(DW_OP_deref), D(DW_OP_deref), D(DW_OP_breg3),
                     D(DW_OP_plus), D(DW_OP_stack_value)},
                    kS64),
             "(fault)", Tier::kParts);
  // Errors come out as core::Evaluate says them.
  ExpectSame(LocArg({D(DW_OP_breg3), D(DW_OP_lit0), D(DW_OP_div), D(DW_OP_stack_value)}, kS64),
             "<error: 'var': division by zero in a DWARF expression>", Tier::kParts);
}

TEST_F(AgentFetchPure, DwarfFormsThatFallBack) {
  // Memory at an address two registers make.
  m_.regs.rbx = m_.regs.rsp;
  m_.regs.rax = 16;
  const Both two = m_.Run(LocArg({D(DW_OP_breg3), D(DW_OP_breg0), D(DW_OP_plus)}, kX64));
  EXPECT_EQ(two.program.args[0].kind, AgentArgPlan::Kind::kFallback);
  EXPECT_EQ(two.program.args[0].reason, "the location is memory at an address it computes");
  EXPECT_THAT(Shape(two.program), ElementsAre("1:0:0:0", "10:0:216:0", "11:0:512:0", "0:0:0:0"));
  EXPECT_EQ(two.program.record_bytes, 8u + 216u + 512u);
  EXPECT_EQ(two.agent, absl::StrCat("0x", absl::Hex(m_.regs.rsp + 16)));
  EXPECT_EQ(two.agent, two.evaluated);
  m_.regs.rbx = 40;
  m_.regs.rax = 8;
  // A dereference of a computed address.
  ExpectSame(
      LocArg({D(DW_OP_breg7), D(DW_OP_breg0), D(DW_OP_plus), D(DW_OP_deref), D(DW_OP_stack_value)},
             kX64),
      absl::StrCat("0x", absl::Hex(m_.regs.rsp + 8)), Tier::kFallback);
  // A computed value dereferenced by the argument's steps.
  ExpectSame(LocArg({D(DW_OP_breg7), D(DW_OP_breg0), D(DW_OP_plus), D(DW_OP_stack_value)}, kX64,
                    {kDeref, Off(0)}),
             absl::StrCat("0x", absl::Hex(m_.regs.rsp + 8)), Tier::kFallback);
  // A pointer in %xmm, with the register captured.
  m_.fp.xmm_space[12] = static_cast<uint32_t>(m_.regs.rsp);
  m_.fp.xmm_space[13] = static_cast<uint32_t>(m_.regs.rsp >> 32);
  const Both xmm = m_.Run(LocArg({D(DW_OP_reg20)}, kX64, {kDeref, Off(0)}));
  EXPECT_THAT(xmm.program.args[0].xmm, ElementsAre(3));
  EXPECT_TRUE(xmm.program.needs_fpregs);
  EXPECT_EQ(xmm.agent, absl::StrCat("0x", absl::Hex(m_.regs.rsp)));
  EXPECT_EQ(xmm.agent, xmm.evaluated);
  // An offset inside a register before a dereference: r8's bytes 1..7 are rsp.
  ExpectSame(RegArg(offsetof(user_regs_struct, r8), kX64, {Off(1), kDeref}),
             absl::StrCat("0x", absl::Hex(m_.regs.rsp)), Tier::kFallback);
  // Malformed: core::Evaluate's error.
  ExpectSame(LocArg({D(DW_OP_plus)}, kS64),
             "<error: 'var': malformed DWARF expression (stack underflow)>", Tier::kFallback);
}

TEST_F(AgentFetchPure, FallbackMemoryOutsideTheStackSliceIsNotSampled) {
  // A two-register address pointing at the heap: the slice has only the stack.
  m_.regs.rbx = 0x10000;
  m_.regs.rax = 8;
  const Both b = m_.Run(LocArg({D(DW_OP_breg3), D(DW_OP_breg0), D(DW_OP_plus)}, kS64));
  EXPECT_EQ(b.evaluated, "9");
  EXPECT_EQ(b.agent, std::string(kNotSampled));
  EXPECT_EQ(b.not_sampled, 1u);
  // ... and one into the slice is read from it.
  m_.regs.rbx = m_.regs.rsp;
  m_.regs.rax = 16;
  const Both in = m_.Run(LocArg({D(DW_OP_breg3), D(DW_OP_breg0), D(DW_OP_plus)}, kX64));
  EXPECT_EQ(in.agent, in.evaluated);
  EXPECT_EQ(in.not_sampled, 0u);
  // A stack that ends 64 bytes above rsp (the page after it is unmapped): the slice keeps
  // those 64 bytes (status fault), a value in them shows, one past them is not sampled.
  m_.regs.rsp = 0x7ff000 - 64;
  m_.regs.rbx = m_.regs.rsp;
  m_.mem.PutU64(m_.regs.rsp + 16, 77);
  const Both edge = m_.Run(LocArg({D(DW_OP_breg3), D(DW_OP_breg0), D(DW_OP_plus)}, kS64));
  EXPECT_EQ(edge.agent, "77");
  EXPECT_EQ(edge.agent, edge.evaluated);
  EXPECT_EQ(edge.payload.size(), 8u + 216u + 64u);
  m_.regs.rax = 64;
  const Both past = m_.Run(LocArg({D(DW_OP_breg3), D(DW_OP_breg0), D(DW_OP_plus)}, kS64));
  EXPECT_EQ(past.evaluated, "(fault)");
  EXPECT_EQ(past.agent, std::string(kNotSampled));
}

TEST_F(AgentFetchPure, StringsAtTheirLimits) {
  const auto str_at = [this](uint64_t addr) {
    m_.regs.rdx = addr;
    return m_.Run(RegArg(offsetof(user_regs_struct, rdx), kString, {kDeref, Off(0)}));
  };
  std::string s256(256, 'x');
  m_.mem.PutString(0x30000, s256);
  Both b = str_at(0x30000);
  EXPECT_EQ(b.agent, b.evaluated);
  EXPECT_EQ(b.agent, absl::StrCat("\"", s256, "\""));
  m_.mem.PutString(0x31000, s256 + "y");
  b = str_at(0x31000);
  EXPECT_EQ(b.agent, b.evaluated);
  EXPECT_EQ(b.agent, absl::StrCat("\"", s256, "\"..."));
  // Across a page boundary, then into an unmapped page: the bytes before it.
  m_.mem.PutString(0x33000 - 3, "abcdef");
  b = str_at(0x33000 - 3);
  EXPECT_EQ(b.agent, b.evaluated);
  EXPECT_EQ(b.agent, "\"abcdef\"");
  m_.mem.PutString(0x35000 - 3, "end", false);
  b = str_at(0x35000 - 3);
  EXPECT_EQ(b.agent, b.evaluated);
  EXPECT_EQ(b.agent, "\"end\"");
  b = str_at(0x35000);
  EXPECT_EQ(b.agent, b.evaluated);
  EXPECT_EQ(b.agent, "(fault)");
  b = str_at(16);  // below 4096: refused without reading
  EXPECT_EQ(b.agent, b.evaluated);
  EXPECT_EQ(b.agent, "(fault)");
}

TEST_F(AgentFetchPure, BitfieldsSignedAndFloats) {
  m_.mem.PutU64(0x40000, 0x00000000'000fd5b3ULL);
  CompiledArg bf = RegArg(offsetof(user_regs_struct, rdx), kS32, {kDeref, Off(1)});
  bf.size = 2;
  bf.bit_offset = 3;
  bf.bit_size = 4;
  bf.type.bits = 16;
  m_.regs.rdx = 0x40000;
  const Both b = m_.Run(bf);
  EXPECT_EQ(b.agent, b.evaluated);
  EXPECT_EQ(b.program.record_bytes, 16u);
  bf.type.kind = ArgType::Kind::kUnsigned;
  const Both u = m_.Run(bf);
  EXPECT_EQ(u.agent, u.evaluated);
  EXPECT_NE(u.agent, b.agent);
  const double d = -3.25;
  uint64_t raw = 0;
  std::memcpy(&raw, &d, 8);
  m_.mem.PutU64(0x40100, raw);
  m_.regs.rdx = 0x40100;
  const Both f = m_.Run(RegArg(offsetof(user_regs_struct, rdx), kF64, {kDeref, Off(0)}));
  EXPECT_EQ(f.agent, "-3.25");
  EXPECT_EQ(f.agent, f.evaluated);
}

TEST_F(AgentFetchPure, ManyArgumentsInOneRecord) {
  std::vector<CompiledArg> args = {
      RegArg(offsetof(user_regs_struct, rdi), kX64),
      LocArg({D(DW_OP_lit7), D(DW_OP_stack_value)}, kS32),
      RegArg(offsetof(user_regs_struct, rdi), kString, {kDeref, Off(16), kDeref, Off(0)}),
      LocArg({D(DW_OP_breg3), D(DW_OP_breg0), D(DW_OP_plus), D(DW_OP_stack_value)}, kS64),
      RegArg(offsetof(user_regs_struct, rdi), kS64, {kDeref, Off(24), kDeref, Off(0)}),
  };
  for (size_t i = 0; i < args.size(); ++i) {
    args[i].name = absl::StrCat("a", i);
  }
  absl::StatusOr<AgentFetchProgram> prog = CompileAgentFetch(args, 0);
  ASSERT_TRUE(prog.ok()) << prog.status();
  EXPECT_EQ(prog->fallbacks, 0u);
  EXPECT_EQ(prog->record_bytes, 16u + 272u + 24u + 16u);
  AgentInterpreter interp(
      m_.regs, &m_.fp, [this](uint64_t a, std::span<uint8_t> out) { return m_.mem.Read(a, out); });
  const std::vector<uint8_t> payload = interp.Run(prog->ops, prog->record_bytes);
  absl::StatusOr<AgentArgValues> v = FormatAgentRecord(args, *prog, payload, {});
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_THAT(v->args,
              ElementsAre(std::pair<std::string, std::string>{"a0", "0x10000"},
                          std::pair<std::string, std::string>{"a1", "7"},
                          std::pair<std::string, std::string>{"a2", "\"hello \\\"agent\\\"\\n\""},
                          std::pair<std::string, std::string>{"a3", "42"},
                          std::pair<std::string, std::string>{"a4", "(fault)"}));
  // A record cut after the first argument: the others say so.
  absl::StatusOr<AgentArgValues> cut =
      FormatAgentRecord(args, *prog, std::span<const uint8_t>(payload.data(), 16), {});
  ASSERT_TRUE(cut.ok()) << cut.status();
  EXPECT_EQ(cut->args[0].second, "0x10000");
  EXPECT_EQ(cut->args[1].second, "7");
  EXPECT_EQ(cut->args[2].second, "<error: not in the record>");
  EXPECT_EQ(cut->args[4].second, "<error: not in the record>");
  // A payload that does not follow the program.
  std::vector<uint8_t> bad = payload;
  bad[0] = 3;  // the first header names argument 3
  EXPECT_EQ(FormatAgentRecord(args, *prog, bad, {}).status().code(), absl::StatusCode::kDataLoss);
  bad = payload;
  bad[4] = 0xff;  // a length beyond the payload
  bad[5] = 0xff;
  EXPECT_EQ(FormatAgentRecord(args, *prog, bad, {}).status().code(), absl::StatusCode::kDataLoss);
}

// What the agent writes when the record is too small for the program (status cut, record
// flag 2, the program ends there) or when it refuses an op (status invalid): no value shows
// as if it were whole.
TEST_F(AgentFetchPure, RecordCutShortAndRefusedOps) {
  std::vector<CompiledArg> args = {
      RegArg(offsetof(user_regs_struct, rdi), kX64),
      RegArg(offsetof(user_regs_struct, rdi), kString, {kDeref, Off(16), kDeref, Off(0)}),
      RegArg(offsetof(user_regs_struct, rdi), kS64),
  };
  for (size_t i = 0; i < args.size(); ++i) {
    args[i].name = absl::StrCat("a", i);
  }
  absl::StatusOr<AgentFetchProgram> prog = CompileAgentFetch(args, 0);
  ASSERT_TRUE(prog.ok()) << prog.status();
  ASSERT_EQ(prog->record_bytes, 16u + 272u + 16u);
  AgentInterpreter interp(
      m_.regs, &m_.fp, [this](uint64_t a, std::span<uint8_t> out) { return m_.mem.Read(a, out); });
  // Room for the first argument and 8 bytes of the string.
  std::vector<uint8_t> payload = interp.Run(prog->ops, 16 + 16);
  EXPECT_EQ(interp.flags(), 2);
  absl::StatusOr<AgentArgValues> v = FormatAgentRecord(args, *prog, payload, {});
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_THAT(v->args,
              ElementsAre(std::pair<std::string, std::string>{"a0", "0x10000"},
                          std::pair<std::string, std::string>{
                              "a1", "<error: cut at the end of the record>"},
                          std::pair<std::string, std::string>{"a2", "<error: not in the record>"}));
  // A register index the agent refuses (KwRegs has 27).
  AgentFetchProgram bad = *prog;
  bad.ops[1].a = 200;
  payload = interp.Run(bad.ops, bad.record_bytes);
  v = FormatAgentRecord(args, bad, payload, {});
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->args[0].second, "<error: the agent refused an op of this argument's fetch program>");
  EXPECT_EQ(v->args[2].second, "65536");  // the next argument runs
}

TEST_F(AgentFetchPure, Limits) {
  AgentFetchOptions big;
  big.stack_bytes = 65537;
  const std::vector<CompiledArg> one = {RegArg(offsetof(user_regs_struct, rdi), kX64)};
  EXPECT_EQ(CompileAgentFetch(one, 0, big).status().code(), absl::StatusCode::kInvalidArgument);
  AgentFetchOptions odd;
  odd.stack_bytes = 100;  // rounded up to 8
  m_.regs.rbx = m_.regs.rsp;
  const Both b = m_.Run(LocArg({D(DW_OP_breg3), D(DW_OP_breg0), D(DW_OP_plus)}, kS64), odd);
  EXPECT_EQ(b.program.record_bytes, 8u + 216u + 104u);
  EXPECT_EQ(b.agent, b.evaluated);
}

// ---------------------------------------------------------------------------------------
// On a stopped thread: a fixture launched under an Int3Engine. At every hit of every probe
// the arguments are evaluated both ways: core::Evaluate over ptrace, and the agent's program
// run by the agent's interpreter over the same registers and the memory the thread can
// read (its readable mappings), its record formatted by FormatAgentRecord.

class AgentFetchLive : public ::testing::Test {
 protected:
  void TearDown() override {
    engine_.reset();
    if (proc_ != nullptr && proc_->alive()) {
      (void)proc_->Kill();
    }
  }

  void Launch(const std::string& fixture, const std::vector<std::string>& args = {}) {
    path_ = kwatch::testing::TargetPath(fixture);
    auto target = ProbeTarget::Open(path_);
    ASSERT_TRUE(target.ok()) << target.status();
    target_ = *std::move(target);
    std::vector<std::string> argv = {path_};
    argv.insert(argv.end(), args.begin(), args.end());
    auto proc = ptrace::Process::Launch(argv);
    ASSERT_TRUE(proc.ok()) << proc.status();
    proc_ = *std::move(proc);
    ASSERT_TRUE(proc_->RunToEntry().ok());
    auto maps = proc_->Maps();
    ASSERT_TRUE(maps.ok()) << maps.status();
    auto bias = target_->LoadBias(*maps);
    ASSERT_TRUE(bias.ok()) << bias.status();
    bias_ = *bias;
    engine_ = std::make_unique<Int3Engine>(*proc_);
    ASSERT_TRUE(engine_->StopWorld().ok());
  }

  // Resolves "POINT ARGS..." and probes every point it names whose arguments compile
  // (all of them when `all`). Returns the points probed.
  int Add(const std::string& spec_text, bool all = true) {
    auto spec = ParseProbeSpec(spec_text);
    EXPECT_TRUE(spec.ok()) << spec.status();
    if (!spec.ok()) {
      return 0;
    }
    auto points = target_->Resolve(spec->point);
    EXPECT_TRUE(!all || points.ok()) << spec_text << ": " << points.status();
    if (!points.ok()) {
      return 0;
    }
    int added = 0;
    for (const ResolvedPoint& p : *points) {
      auto args = CompileArgs(*target_, p, spec->args);
      EXPECT_TRUE(!all || args.ok()) << spec_text << ": " << args.status();
      if (!args.ok() || args->empty()) {
        continue;
      }
      auto prog = CompileAgentFetch(*args, bias_);
      EXPECT_TRUE(prog.ok()) << prog.status();
      if (!prog.ok()) {
        continue;
      }
      probes_.push_back(std::make_unique<Probe>(Probe{p, *std::move(args), *std::move(prog)}));
      const Probe* probe = probes_.back().get();
      for (const AgentArgPlan& plan : probe->program.args) {
        ++plans_[plan.kind];
        if (plan.kind == AgentArgPlan::Kind::kFallback) {
          reasons_.push_back(plan.reason);
        }
      }
      ProbeHandlers h;
      h.pre = [this, probe](const ProbeContext& ctx) { Hit(*probe, ctx); };
      const RemoteAddr addr{p.vaddr.value + bias_};
      absl::StatusOr<ProbeId> id = p.is_return ? engine_->RegisterReturn(addr, std::move(h))
                                               : engine_->Register(addr, std::move(h));
      EXPECT_TRUE(id.ok()) << p.Where() << ": " << id.status();
      added += id.ok() ? 1 : 0;
    }
    return added;
  }

  // Probes every line with code of `functions` with `args` ("$vars" by default).
  int AddEveryLine(const std::vector<std::string>& functions, const std::string& args) {
    int added = 0;
    for (const std::string& fn : functions) {
      auto point = ParseProbePoint(fn);
      EXPECT_TRUE(point.ok());
      auto listings = target_->ListLines(*point);
      EXPECT_TRUE(listings.ok()) << fn << ": " << listings.status();
      if (!listings.ok()) {
        continue;
      }
      for (const LineListing& l : *listings) {
        for (const ListedLine& line : l.lines) {
          if (line.has_code) {
            added += Add(absl::StrCat(fn, ":", line.relative, " ", args), /*all=*/false);
          }
        }
      }
    }
    return added;
  }

  void RunToExit() {
    ASSERT_TRUE(engine_->ResumeWorld().ok());
    while (proc_->alive()) {
      auto events = proc_->Poll(/*block=*/true);
      ASSERT_TRUE(events.ok()) << events.status();
    }
    ASSERT_TRUE(proc_->exit_info().has_value());
    EXPECT_FALSE(proc_->exit_info()->signaled);
    EXPECT_EQ(proc_->exit_info()->code, 0);
  }

  // Every hit's "EVENT name=value..." both ways, in hit order.
  const std::vector<std::string>& evaluated() const { return evaluated_; }
  const std::vector<std::string>& agent() const { return agent_; }
  int plans(AgentArgPlan::Kind k) const {
    auto it = plans_.find(k);
    return it == plans_.end() ? 0 : it->second;
  }

  std::unique_ptr<ProbeTarget> target_;
  std::vector<std::string> reasons_;
  uint64_t values_ = 0;

 private:
  struct Probe {
    ResolvedPoint point;
    std::vector<CompiledArg> args;
    AgentFetchProgram program;
  };

  void Hit(const Probe& p, const ProbeContext& ctx) {
    user_fpregs_struct fp{};
    EXPECT_EQ(::ptrace(PTRACE_GETFPREGS, ctx.tid, nullptr, &fp), 0);
    FetchContext fc;
    fc.regs = &ctx.regs;
    fc.load_bias = bias_;
    fc.read = [this](RemoteAddr a, std::span<uint8_t> out) { return proc_->ReadMemory(a, out); };
    fc.at_return = ctx.is_return;
    fc.fpregs = &fp;
    fc.tid = ctx.tid;
    evaluated_.push_back(absl::StrCat(p.point.event, " ", EvaluateAll(p.args, fc)));

    absl::StatusOr<std::vector<ptrace::MapEntry>> maps = proc_->Maps();
    EXPECT_TRUE(maps.ok()) << maps.status();
    const auto readable = [&maps](uint64_t a, size_t n) {
      for (const ptrace::MapEntry& m : *maps) {
        if (m.read && a >= m.start.value && a + n <= m.end.value) {
          return true;
        }
      }
      return false;  // (a read spanning two mappings is not needed here)
    };
    AgentInterpreter interp(
        ctx.regs, p.program.needs_fpregs ? &fp : nullptr, [&](uint64_t a, std::span<uint8_t> out) {
          return maps.ok() && readable(a, out.size()) && proc_->ReadMemory(RemoteAddr{a}, out).ok();
        });
    interp.RunAsThread(ctx.tid);
    const std::vector<uint8_t> payload = interp.Run(p.program.ops, p.program.record_bytes);
    EXPECT_LE(payload.size(), p.program.record_bytes);
    AgentRecordContext rc;
    rc.load_bias = bias_;
    rc.at_return = ctx.is_return;
    rc.tid = ctx.tid;
    absl::StatusOr<AgentArgValues> v = FormatAgentRecord(p.args, p.program, payload, rc);
    EXPECT_TRUE(v.ok()) << v.status();
    std::vector<std::string> parts;
    if (v.ok()) {
      for (const auto& [name, value] : v->args) {
        parts.push_back(absl::StrCat(name, "=", value));
      }
      values_ += v->args.size();
    }
    agent_.push_back(absl::StrCat(p.point.event, " ", absl::StrJoin(parts, " ")));
  }

  std::string path_;
  std::unique_ptr<ptrace::Process> proc_;
  std::unique_ptr<Int3Engine> engine_;
  uint64_t bias_ = 0;
  std::vector<std::unique_ptr<Probe>> probes_;
  std::map<AgentArgPlan::Kind, int> plans_;
  std::vector<std::string> evaluated_;
  std::vector<std::string> agent_;
};

// The arguments of tests/core/probe/fetch_test.cc on probe_args (-O1): integers, struct
// members, strings, bitfields, a fault, $comm, doubles in %xmm, recursion and $retval, stack
// slots, frame-base variables, a local struct, loop variables, globals.
TEST_F(AgentFetchLive, FetchTestArgumentsOnProbeArgs) {
  ASSERT_NO_FATAL_FAILURE(Launch("probe_args"));
  EXPECT_EQ(Add("add_ints a b %di:s32 %esi"), 1);
  EXPECT_EQ(Add("sum_item p->id p->len +8(%di):u32 p->label:string p->values[2] p->flags p->kind "
                "p->hot nid=p->next->id lbl=+0(+16(%di)):string $vars"),
            1);
  EXPECT_EQ(Add("name_len name:string limit s=+0(%di):string +0(%si):string $comm p=name"), 1);
  EXPECT_EQ(Add("scale x factor"), 1);
  EXPECT_EQ(Add("fact n"), 1);
  EXPECT_EQ(Add("fact%return $retval r=%ax:u8"), 1);
  EXPECT_EQ(Add("many_args g h $stack1 $stack2 a f ra=$stack0 sp=$stack $params"), 1);
  EXPECT_EQ(Add("local_item:2 local.id local.len local.label:string local.values[3] id"), 1);
  EXPECT_EQ(Add("loop_lines:5 i acc n"), 1);
  EXPECT_EQ(Add("loop_lines @g_items:s64 @g_items+8:u32 g_items[1].id "
                "g_items[0].next->label:string g_total g_items[0].kind"),
            1);
  EXPECT_EQ(Add("tick pc=%ip v"), 1);
  ASSERT_NO_FATAL_FAILURE(RunToExit());
  EXPECT_EQ(agent(), evaluated());
  EXPECT_THAT(evaluated(),
              ::testing::Contains(HasSubstr("p->kind=5 p->hot=1 nid=202 lbl=\"first\"")));
  EXPECT_THAT(evaluated(), ::testing::Contains(HasSubstr("nid=(fault)")));
  EXPECT_THAT(evaluated(), ::testing::Contains(HasSubstr("arg4=(fault) arg5=\"probe_args\"")));
  EXPECT_THAT(evaluated(), ::testing::Contains("scale x=-0.25 factor=8"));
  EXPECT_THAT(evaluated(), ::testing::Contains("fact__return arg1=120 r=120"));
  EXPECT_EQ(agent().size(), 5u + 3 + 1 + 2 + 5 + 5 + 1 + 1 + 4 + 1 + 4);
  // -O1 with frame pointers: every argument lowers, $comm is read at the hit.
  EXPECT_EQ(plans(AgentArgPlan::Kind::kFallback), 0) << absl::StrJoin(reasons_, "; ");
  EXPECT_GT(plans(AgentArgPlan::Kind::kString), 6);
}

// Strings of 255, 256, 257 and 300 bytes, one running into an unmapped page, an unmapped
// pointer, escapes; bitfields; a float and a double; structs by value in two registers
// (DW_OP_piece: parts kwatch puts together); small signed and unsigned integers.
void ExpectEdges(const std::vector<std::string>& hits) {
  const std::string abc = "abcdefghijklmnopqrstuvwxyz";
  std::string s300;
  while (s300.size() < 300) {
    s300 += abc;
  }
  const auto q = [&s300](size_t n) { return absl::StrCat("\"", s300.substr(0, n), "\""); };
  ASSERT_EQ(hits.size(), 5u);
  EXPECT_EQ(hits[0], absl::StrCat("strings s255_string=", q(255), " s256_string=", q(256),
                                  " s257_string=", q(256), "... s300_string=", q(256),
                                  "... edge_string=\"tail\" gone_string=(fault) "
                                  "quoted_string=\"tab\\t nl\\n \\\"q\\\" \\\\ \\x01 "
                                  "\\xc3\\xa9\""));
  EXPECT_EQ(hits[1], "bits p->neg=-3 p->pos=5 p->wide=100000 p->flag=1 p->id=42");
  EXPECT_EQ(hits[2], "floats f=-1.25 d=3.5e+10");
  EXPECT_EQ(hits[3], "pair v.a=7 v.b=-9 w.a=11 w.b=13");
  EXPECT_EQ(hits[4], "smalls c=-5 uc=250 s=-300 us=60000 i=-70000 ul=9223372036854775809");
}

TEST_F(AgentFetchLive, EdgesAtO1) {
  ASSERT_NO_FATAL_FAILURE(Launch("fetch_edges"));
  EXPECT_EQ(Add("strings s255:string s256:string s257:string s300:string edge:string gone:string "
                "quoted:string"),
            1);
  EXPECT_EQ(Add("bits p->neg p->pos p->wide p->flag p->id"), 1);
  EXPECT_EQ(Add("floats f d"), 1);
  EXPECT_EQ(Add("pair v.a v.b w.a w.b"), 1);
  EXPECT_EQ(Add("smalls c uc s us i ul"), 1);
  ASSERT_NO_FATAL_FAILURE(RunToExit());
  EXPECT_EQ(agent(), evaluated());
  ExpectEdges(evaluated());
  // The structs passed in rdi:rsi and rdx:rcx are DW_OP_piece locations: each register is
  // captured, kwatch puts the pieces together.
  EXPECT_EQ(plans(AgentArgPlan::Kind::kExpression), 4);
  EXPECT_EQ(plans(AgentArgPlan::Kind::kFallback), 0) << absl::StrJoin(reasons_, "; ");
}

TEST_F(AgentFetchLive, EdgesAtO2) {
  ASSERT_NO_FATAL_FAILURE(Launch("fetch_edges_o2"));
  EXPECT_EQ(Add("strings s255:string s256:string s257:string s300:string edge:string gone:string "
                "quoted:string"),
            1);
  EXPECT_EQ(Add("bits p->neg p->pos p->wide p->flag p->id"), 1);
  EXPECT_EQ(Add("floats f d"), 1);
  EXPECT_EQ(Add("pair v.a v.b w.a w.b"), 1);
  EXPECT_EQ(Add("smalls c uc s us i ul"), 1);
  ASSERT_NO_FATAL_FAILURE(RunToExit());
  EXPECT_EQ(agent(), evaluated());
  ExpectEdges(evaluated());
}

// -O2 without frame pointers: every line with code of every function, with the variables
// visible there (location lists picked per line, CFA rules that move with rsp, values that
// combine registers).
TEST_F(AgentFetchLive, EveryLineOfProbeArgsAtO2) {
  ASSERT_NO_FATAL_FAILURE(Launch("probe_args_o2"));
  const int points = AddEveryLine({"add_ints", "sum_item", "name_len", "scale", "fact", "many_args",
                                   "local_item", "tick", "loop_lines", "main"},
                                  "$vars");
  EXPECT_GT(points, 20);
  EXPECT_GT(Add("sum_item p->id p->label:string p->kind p->hot p->values[3]"), 0);
  EXPECT_GT(Add("fact%return $retval"), 0);
  ASSERT_NO_FATAL_FAILURE(RunToExit());
  EXPECT_EQ(agent(), evaluated());
  EXPECT_GT(values_, 50u);
  EXPECT_GT(plans(AgentArgPlan::Kind::kBytes), 20);
  EXPECT_THAT(evaluated(), ::testing::Contains(HasSubstr("p->label_string=\"second\"")));
  // gcc 12 -O2 here: sign-extended ints read from memory (DW_OP_deref_size, DW_OP_shl,
  // DW_OP_shra), sums of two registers: parts kwatch finishes; nothing falls back.
  EXPECT_GT(plans(AgentArgPlan::Kind::kExpression), 5);
  EXPECT_GT(plans(AgentArgPlan::Kind::kConstant), 5);
  EXPECT_EQ(plans(AgentArgPlan::Kind::kFallback), 0) << absl::StrJoin(reasons_, "; ");
}

TEST_F(AgentFetchLive, EveryLineOfFetchEdgesAtO2) {
  ASSERT_NO_FATAL_FAILURE(Launch("fetch_edges_o2"));
  const int points = AddEveryLine({"strings", "bits", "floats", "pair", "smalls", "main"}, "$vars");
  EXPECT_GT(points, 10);
  ASSERT_NO_FATAL_FAILURE(RunToExit());
  EXPECT_EQ(agent(), evaluated());
  EXPECT_GT(values_, 50u);
  EXPECT_GT(plans(AgentArgPlan::Kind::kExpression), 5);
  EXPECT_EQ(plans(AgentArgPlan::Kind::kFallback), 0) << absl::StrJoin(reasons_, "; ");
}

// probe_engine's deref(p) = *p on &x (42), on NULL (the program catches its own SIGSEGV),
// then on &x again: the hit before the load sees a bad pointer.
TEST_F(AgentFetchLive, BadPointerAtTheHit) {
  ASSERT_NO_FATAL_FAILURE(Launch("probe_engine", {"fault"}));
  EXPECT_EQ(Add("deref p=%di v=+0(%di):s32 s=+0(%di):string w=+4(%di):u16"), 1);
  ASSERT_NO_FATAL_FAILURE(RunToExit());
  EXPECT_EQ(agent(), evaluated());
  EXPECT_THAT(evaluated(), ElementsAre(HasSubstr(" v=42 s=\"*\" w="),
                                       "deref p=0x0 v=(fault) s=(fault) w=(fault)",
                                       HasSubstr(" v=42 s=\"*\" w=")));
}

// hw_probe_target's hw_tick, as the --hw tests probe it.
TEST_F(AgentFetchLive, HwProbeTargetArguments) {
  ASSERT_NO_FATAL_FAILURE(Launch("hw_probe_target", {"run", "3"}));
  EXPECT_EQ(Add("hw_tick i r->id r->len r->name:string"), 1);
  EXPECT_EQ(Add("hw_tick%return $retval"), 1);
  ASSERT_NO_FATAL_FAILURE(RunToExit());
  EXPECT_EQ(agent(), evaluated());
  EXPECT_THAT(agent(), ElementsAre("hw_tick i=0 r->id=7 r->len=100 r->name_string=\"hw\"",
                                   "hw_tick__return arg1=100",
                                   "hw_tick i=1 r->id=7 r->len=100 r->name_string=\"hw\"",
                                   "hw_tick__return arg1=103",
                                   "hw_tick i=2 r->id=7 r->len=100 r->name_string=\"hw\"",
                                   "hw_tick__return arg1=106"));
}

// uprobe_loop, as the cli probe tests probe it.
TEST_F(AgentFetchLive, UprobeLoopArguments) {
  ASSERT_NO_FATAL_FAILURE(Launch("uprobe_loop"));
  EXPECT_EQ(Add("tick i r->len r->name:string r->id $comm"), 1);
  EXPECT_EQ(Add("tick%return $retval"), 1);
  ASSERT_NO_FATAL_FAILURE(RunToExit());
  EXPECT_EQ(agent(), evaluated());
  ASSERT_EQ(agent().size(), 2000u);
  EXPECT_EQ(agent()[0], "tick i=0 r->len=100 r->name_string=\"loop\" r->id=0 arg5=\"uprobe_loop\"");
  EXPECT_EQ(agent()[1999], "tick__return arg1=3097");
}

}  // namespace
}  // namespace kwatch::core::probe
