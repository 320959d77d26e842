#include "core/probe/jump_optimizer.h"

#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_format.h"
#include "core/probe/trampoline.h"
#include "core/x86/relocator.h"
#include "tests/core/probe/compiled_function.h"

namespace kwatch::core::probe {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

using Bytes = std::vector<uint8_t>;

constexpr RemoteAddr kF{0x401000};

FunctionCode Fn(const Bytes& bytes, RemoteAddr start = kF, std::string name = "f") {
  return FunctionCode{std::move(name), start, bytes};
}

JumpDecision Refused(const Bytes& bytes, uint64_t probe_offset, JumpRefusal want,
                     const JumpOptions& options = {}) {
  JumpDecision d = PlanJumpProbe(Fn(bytes), kF + probe_offset, options);
  EXPECT_FALSE(d.plan.has_value()) << "accepted f+0x" << std::hex << probe_offset;
  EXPECT_EQ(d.refusal, want) << JumpRefusalName(d.refusal) << ": " << d.reason;
  return d;
}

JumpPlan Accepted(const Bytes& bytes, uint64_t probe_offset, const JumpOptions& options = {}) {
  JumpDecision d = PlanJumpProbe(Fn(bytes), kF + probe_offset, options);
  EXPECT_TRUE(d.plan.has_value()) << d.reason;
  EXPECT_EQ(d.refusal, JumpRefusal::kNone);
  return d.plan.value_or(JumpPlan{});
}

// push %rbp; mov %rsp,%rbp; sub $0x10,%rsp; mov %rdi,%rax; leave; ret
Bytes Prologue() {
  return {0x55, 0x48, 0x89, 0xe5, 0x48, 0x83, 0xec, 0x10, 0x48, 0x89, 0xf8, 0xc9, 0xc3};
}

TEST(JumpOptimizer, AcceptsWholeInstructionsCoveringFiveBytes) {
  const JumpPlan p = Accepted(Prologue(), 0);
  EXPECT_EQ(p.addr, kF);
  EXPECT_EQ(p.len, 8U);  // push (1) + mov (3) + sub (4)
  EXPECT_THAT(p.original, ElementsAre(0x55, 0x48, 0x89, 0xe5, 0x48, 0x83, 0xec, 0x10));
  EXPECT_THAT(p.insn_text, ElementsAre("push %rbp", "mov %rsp, %rbp", "sub $0x10, %rsp"));
  EXPECT_EQ(p.function, "f");
  // From the mov: mov (3) + sub (4); from the sub: sub (4) + mov (3).
  EXPECT_EQ(Accepted(Prologue(), 1).len, 7U);
  EXPECT_EQ(Accepted(Prologue(), 4).len, 7U);
  // A five-byte instruction alone.
  EXPECT_EQ(Accepted({0xb8, 0x2a, 0x00, 0x00, 0x00, 0xc3}, 0).len, 5U);
}

TEST(JumpOptimizer, RefusesAddressesItCannotPatch) {
  EXPECT_THAT(Refused(Prologue(), 2, JumpRefusal::kNotOnBoundary).reason,
              HasSubstr("no jump at f+0x2 (0x401002): the address is inside 'mov %rsp, %rbp' at "
                        "f+0x1 (0x401001)"));
  EXPECT_THAT(Refused(Prologue(), 13, JumpRefusal::kOutsideFunction).reason,
              HasSubstr("outside f (13 bytes at 0x401000)"));
  // From leave: two bytes to the function's end.
  EXPECT_THAT(Refused(Prologue(), 11, JumpRefusal::kTooShort).reason,
              HasSubstr("only 2 bytes of whole instructions from there to the end of f; a jmp "
                        "rel32 needs 5"));
  // nop x4; a 15-byte nop: 19 bytes, more than a patch holds.
  const Bytes long_nop = {0x90, 0x90, 0x90, 0x90, 0x66, 0x66, 0x66, 0x66, 0x66, 0x66,
                          0x2e, 0x0f, 0x1f, 0x84, 0x00, 0x00, 0x00, 0x00, 0x00, 0xc3};
  EXPECT_THAT(Refused(long_nop, 0, JumpRefusal::kTooLong).reason,
              HasSubstr("covering 5 bytes take 19"));
}

TEST(JumpOptimizer, RefusesBranchesIntoTheRange) {
  // 0: xor %eax,%eax  2: add $1,%eax  5: cmp $9,%eax  8: jne 2  a: ret
  const Bytes loop = {0x31, 0xc0, 0x83, 0xc0, 0x01, 0x83, 0xf8, 0x09, 0x75, 0xf8, 0xc3};
  const JumpDecision d = Refused(loop, 0, JumpRefusal::kBranchIntoRange);
  EXPECT_EQ(d.culprit, kF + 8);
  EXPECT_THAT(d.reason, HasSubstr("no jump at f+0x0 (0x401000): 'jnz 0x401002' at f+0x8 "
                                  "(0x401008) jumps to f+0x2 (0x401002), inside the 5 bytes the "
                                  "jump overwrites (f+0x0 (0x401000)..0x401005)"));
  // The loop head itself may be probed: the back edge lands on the jmp's first byte.
  EXPECT_EQ(Accepted(loop, 2).len, 6U);
  // Branches to the range's first byte or to its end are fine.
  const Bytes to_start = {0x31, 0xc0, 0x83, 0xc0, 0x01, 0x74, 0xf9, 0xc3};  // je f+0
  EXPECT_EQ(Accepted(to_start, 0).len, 5U);
  const Bytes to_end = {0x31, 0xc0, 0x83, 0xc0, 0x01, 0x90, 0x74, 0xfd, 0xc3};  // je f+5
  EXPECT_EQ(Accepted(to_end, 0).len, 5U);
}

TEST(JumpOptimizer, RefusesBranchesFromOtherCode) {
  // f: xor %eax,%eax; add $2,%eax; add $3,%eax; ret. Its cold part jumps back into it.
  const Bytes f = {0x31, 0xc0, 0x83, 0xc0, 0x02, 0x83, 0xc0, 0x03, 0xc3};
  const RemoteAddr cold_at{0x402000};
  // f.cold: xor %eax,%eax; jmp TARGET
  auto cold_to = [&](RemoteAddr target) {
    Bytes cold = {0x31, 0xc0, 0xe9, 0, 0, 0, 0};
    const auto rel = static_cast<int32_t>(target.value - (cold_at + 7).value);
    std::memcpy(cold.data() + 3, &rel, sizeof(rel));
    return cold;
  };
  const Bytes into = cold_to(kF + 2);
  JumpOptions options;
  options.other_code.push_back(FunctionCode{"f.cold", cold_at, into});
  const JumpDecision d = PlanJumpProbe(Fn(f), kF, options);
  ASSERT_FALSE(d.plan.has_value());
  EXPECT_EQ(d.refusal, JumpRefusal::kBranchIntoRange);
  EXPECT_EQ(d.culprit, cold_at + 2);
  EXPECT_THAT(d.reason, HasSubstr("'jmp 0x401002' at f.cold+0x2 (0x402002) jumps to f+0x2 "
                                  "(0x401002)"));
  const Bytes to_end = cold_to(kF + 5);
  options.other_code[0].bytes = to_end;
  EXPECT_EQ(Accepted(f, 0, options).len, 5U);
  // Other code that does not decode is refused: its jumps cannot be checked.
  options.other_code[0].bytes = std::span<const uint8_t>(into).first(4);
  EXPECT_EQ(PlanJumpProbe(Fn(f), kF, options).refusal, JumpRefusal::kUndecodable);
}

TEST(JumpOptimizer, RefusesCodeAddressesInsideTheRange) {
  // f: nop; mov $1,%eax; lea -0xc(%rip),%rcx (the address f+1); ret
  const Bytes f = {0x90, 0xb8, 0x01, 0x00, 0x00, 0x00, 0x48,
                   0x8d, 0x0d, 0xf4, 0xff, 0xff, 0xff, 0xc3};
  const JumpDecision d = Refused(f, 0, JumpRefusal::kAddressTaken);
  EXPECT_EQ(d.culprit, kF + 6);
  EXPECT_THAT(d.reason, HasSubstr("'lea -0xc(%rip), %rcx' at f+0x6 (0x401006) takes the address "
                                  "f+0x1 (0x401001)"));
}

TEST(JumpOptimizer, RefusesKnownEntriesAndOtherProbesInside) {
  JumpOptions entries;
  entries.entries = {kF + 4};
  EXPECT_THAT(Refused(Prologue(), 0, JumpRefusal::kEntryInside, entries).reason,
              HasSubstr("f+0x4 (0x401004) is entered from elsewhere"));
  entries.entries = {kF, kF + 8};  // the first byte and the end are fine
  EXPECT_EQ(Accepted(Prologue(), 0, entries).len, 8U);
  JumpOptions probes;
  probes.other_probes = {kF + 1};
  EXPECT_THAT(Refused(Prologue(), 0, JumpRefusal::kProbeInside, probes).reason,
              HasSubstr("another probe at f+0x1 (0x401001)"));
}

TEST(JumpOptimizer, RefusesCallsThatReturnIntoTheRange) {
  // call *%rax; mov %rax,%rdi; ret
  const Bytes f = {0xff, 0xd0, 0x48, 0x89, 0xc7, 0xc3};
  EXPECT_THAT(Refused(f, 0, JumpRefusal::kCallInside).reason,
              HasSubstr("'call %rax' at f+0x0 (0x401000) returns to f+0x2 (0x401002), inside"));
  // Whatever the call mode: a thread in the callee has that return address already.
  JumpOptions from_copy;
  from_copy.call_mode = x86::CallMode::kCallFromCopy;
  Refused(f, 0, JumpRefusal::kCallInside, from_copy);
  // A call that ends the range returns to original code.
  const Bytes g = {0x31, 0xc0, 0xe8, 0x00, 0x00, 0x00, 0x00, 0xc3};  // xor; call next; ret
  const JumpPlan p = Accepted(g, 0);
  EXPECT_EQ(p.len, 7U);
}

TEST(JumpOptimizer, RefusesRangesWhereControlLeavesEarly) {
  // xor %eax,%eax; ret; then bytes only other entries reach.
  const Bytes f = {0x31, 0xc0, 0xc3, 0x90, 0x90, 0x90, 0xc3};
  EXPECT_THAT(Refused(f, 0, JumpRefusal::kFlowEndsInside).reason,
              HasSubstr("'ret' at f+0x2 (0x401002) does not fall through"));
  const Bytes g = {0xeb, 0x03, 0x90, 0x90, 0x90, 0xc3};  // jmp +3 (to g+5): then nops
  Refused(g, 0, JumpRefusal::kFlowEndsInside);
}

TEST(JumpOptimizer, RefusesInstructionsThatCannotMove) {
  const Bytes f = {0x90, 0x90, 0x90, 0x0f, 0x0b};  // nop x3; ud2
  const JumpDecision d = Refused(f, 0, JumpRefusal::kUnrelocatable);
  EXPECT_THAT(d.reason, HasSubstr("cannot relocate 0x401003 (ud2): it raises SIGILL by design"));
  const Bytes x = {0x90, 0x0f, 0x01, 0xd5, 0x90, 0xc3};  // nop; xend; nop; ret
  Refused(x, 0, JumpRefusal::kUnrelocatable);
}

TEST(JumpOptimizer, RefusesFunctionsWithIndirectJumps) {
  // f: mov %rdi,%rax; add $1,%rax; jmp *%rax
  const Bytes f = {0x48, 0x89, 0xf8, 0x48, 0x83, 0xc0, 0x01, 0xff, 0xe0};
  EXPECT_THAT(Refused(f, 0, JumpRefusal::kIndirectJump).reason,
              HasSubstr("f has an indirect jump, 'jmp %rax' at f+0x7 (0x401007), and a jump "
                        "table or a computed goto may land inside the 7 bytes the jump overwrites "
                        "(f+0x0 (0x401000)..0x401007): kwatch was given no image"));
}

// Serves JumpOptions::read_image from byte blocks at fixed addresses.
struct Image {
  std::vector<std::pair<RemoteAddr, Bytes>> blocks;
  std::function<absl::Status(RemoteAddr, std::span<uint8_t>)> Reader() const {
    return [this](RemoteAddr addr, std::span<uint8_t> out) {
      for (const auto& [at, bytes] : blocks) {
        if (addr >= at && addr + out.size() <= at + bytes.size()) {
          std::memcpy(out.data(), bytes.data() + (addr - at), out.size());
          return absl::OkStatus();
        }
      }
      return absl::NotFoundError("not in the image");
    };
  }
};

Bytes Int32s(std::initializer_list<int64_t> values) {
  Bytes out;
  for (const int64_t v : values) {
    const auto u = static_cast<uint32_t>(v);
    out.insert(out.end(), {static_cast<uint8_t>(u), static_cast<uint8_t>(u >> 8),
                           static_cast<uint8_t>(u >> 16), static_cast<uint8_t>(u >> 24)});
  }
  return out;
}

// A PIC switch: cmp $2,%rdi; ja default; lea T(%rip),%rdx; movslq (%rdx,%rdi,4),%rax;
// add %rdx,%rax; jmp *%rax; case 0 falls into case 1; case 2; default. T = 0x402000.
Bytes PicSwitch() {
  return {
      0x48, 0x83, 0xff, 0x02,                    // 0x00 cmp $0x2,%rdi
      0x77, 0x1f,                                // 0x04 ja 0x25
      0x48, 0x8d, 0x15, 0xf3, 0x0f, 0x00, 0x00,  // 0x06 lea 0xff3(%rip),%rdx (0x402000)
      0x48, 0x63, 0x04, 0xba,                    // 0x0d movslq (%rdx,%rdi,4),%rax
      0x48, 0x01, 0xd0,                          // 0x11 add %rdx,%rax
      0xff, 0xe0,                                // 0x14 jmp *%rax
      0x83, 0xc0, 0x01,                          // 0x16 case 0: add $1,%eax
      0xb8, 0x14, 0x00, 0x00, 0x00,              // 0x19 case 1: mov $20,%eax
      0xc3,                                      // 0x1e ret
      0xb8, 0x1e, 0x00, 0x00, 0x00,              // 0x1f case 2: mov $30,%eax
      0xc3,                                      // 0x24 ret
      0x31, 0xc0,                                // 0x25 default: xor %eax,%eax
      0xc3,                                      // 0x27 ret
  };
}
constexpr RemoteAddr kTable{0x402000};

TEST(JumpOptimizer, ProvesPicJumpTables) {
  Image image{{{kTable, Int32s({0x401016 - 0x402000, 0x401019 - 0x402000, 0x40101f - 0x402000})}}};
  JumpOptions options;
  options.read_image = image.Reader();
  auto targets = ProveJumpTable(Fn(PicSwitch()), kF + 0x14, options);
  ASSERT_TRUE(targets.ok()) << targets.status();
  EXPECT_THAT(*targets, ElementsAre(kF + 0x16, kF + 0x19, kF + 0x1f));
  // The entry takes a jump: no case lands in cmp + ja.
  EXPECT_EQ(Accepted(PicSwitch(), 0, options).len, 6U);
  EXPECT_EQ(Accepted(PicSwitch(), 0x1f, options).len, 5U);
  // Case 0's add and case 1's mov: case 1 is inside.
  const JumpDecision d = Refused(PicSwitch(), 0x16, JumpRefusal::kBranchIntoRange, options);
  EXPECT_EQ(d.culprit, kF + 0x14);
  EXPECT_THAT(d.reason, HasSubstr("'jmp %rax' at f+0x14 (0x401014) jumps to f+0x19 (0x401019) "
                                  "(entry 1 of its jump table), inside the 8 bytes"));
  // Without the image, the table cannot be read.
  Refused(PicSwitch(), 0, JumpRefusal::kIndirectJump);
}

TEST(JumpOptimizer, RefusesJumpTablesItCannotProve) {
  JumpOptions options;
  // An entry that leads into the middle of an instruction.
  Image bad{{{kTable, Int32s({0x401016 - 0x402000, 0x401019 - 0x402000, 0x401020 - 0x402000})}}};
  options.read_image = bad.Reader();
  EXPECT_THAT(Refused(PicSwitch(), 0, JumpRefusal::kIndirectJump, options).reason,
              HasSubstr("entry 2 of the jump table at 0x402000 leads to 0x401020, not an "
                        "instruction of f"));
  Image good{{{kTable, Int32s({0x401016 - 0x402000, 0x401019 - 0x402000, 0x40101f - 0x402000})}}};
  options.read_image = good.Reader();
  // No bound: cmp and ja replaced by nops.
  Bytes unbounded = PicSwitch();
  const Bytes nops = {0x0f, 0x1f, 0x40, 0x00, 0x66, 0x90};
  std::copy(nops.begin(), nops.end(), unbounded.begin());
  EXPECT_THAT(Refused(unbounded, 0x1f, JumpRefusal::kIndirectJump, options).reason,
              HasSubstr("not a jump table kwatch can prove ('nop' is not the bound's ja/jae)"));
  // A branch into the dispatch: the default jumps back to the add.
  Bytes entered = PicSwitch();
  entered[0x25] = 0xeb;
  entered[0x26] = 0xea;  // jmp 0x11
  EXPECT_THAT(Refused(entered, 0x1f, JumpRefusal::kIndirectJump, options).reason,
              HasSubstr("a branch at 0x401025 enters the dispatch at 0x401011"));
  // The table unreadable (an image with no blocks; it outlives the reader, which points at it).
  const Image empty;
  options.read_image = empty.Reader();
  Refused(PicSwitch(), 0, JumpRefusal::kIndirectJump, options);
}

TEST(JumpOptimizer, ProvesAbsoluteJumpTables) {
  // cmp $1,%edi; ja default; mov %edi,%edi; jmp *0x402000(,%rdi,8); two cases; default.
  const Bytes f = {0x83, 0xff, 0x01, 0x77, 0x0f, 0x89, 0xff, 0xff, 0x24, 0xfd, 0x00, 0x20,
                   0x40, 0x00, 0xb0, 0x01, 0xc3, 0xb0, 0x02, 0xc3, 0x31, 0xc0, 0xc3};
  Bytes table(16, 0);
  const uint64_t case0 = 0x40100e;
  const uint64_t case1 = 0x401011;
  std::memcpy(table.data(), &case0, 8);
  std::memcpy(table.data() + 8, &case1, 8);
  Image image{{{kTable, table}}};
  JumpOptions options;
  options.read_image = image.Reader();
  auto targets = ProveJumpTable(Fn(f), kF + 7, options);
  ASSERT_TRUE(targets.ok()) << targets.status();
  EXPECT_THAT(*targets, ElementsAre(kF + 0xe, kF + 0x11));
  EXPECT_EQ(Accepted(f, 0, options).len, 5U);
  // Without mov %edi,%edi the index's upper half is unchecked.
  const Bytes g = {0x83, 0xff, 0x01, 0x77, 0x0d, 0xff, 0x24, 0xfd, 0x00, 0x20, 0x40,
                   0x00, 0xb0, 0x01, 0xc3, 0xb0, 0x02, 0xc3, 0x31, 0xc0, 0xc3};
  const uint64_t g_case0 = 0x40100c;
  const uint64_t g_case1 = 0x40100f;
  std::memcpy(image.blocks[0].second.data(), &g_case0, 8);
  std::memcpy(image.blocks[0].second.data() + 8, &g_case1, 8);
  EXPECT_THAT(Refused(g, 0, JumpRefusal::kIndirectJump, options).reason,
              HasSubstr("the bound checks a 32-bit index that is not zero-extended"));
}

TEST(JumpOptimizer, RefusesFunctionsItCannotDecode) {
  Bytes f = Prologue();
  f[11] = 0xcc;  // int3 over leave
  EXPECT_THAT(Refused(f, 0, JumpRefusal::kBreakpoint).reason,
              HasSubstr("an int3 at f+0xb (0x40100b)"));
  f[11] = 0x06;  // invalid in 64-bit mode
  EXPECT_THAT(Refused(f, 0, JumpRefusal::kUndecodable).reason,
              HasSubstr("f does not decode at f+0xb (0x40100b)"));
}

TEST(JumpOptimizer, ThreadsStoppedInsideTheRange) {
  const JumpPlan p = Accepted(Prologue(), 0);
  const std::vector<ThreadRip> fine = {{100, kF}, {101, kF + 8}, {102, RemoteAddr{0x7000}}};
  EXPECT_TRUE(CheckThreadsOutside(p, fine).ok());
  const std::vector<ThreadRip> parked = {{100, kF}, {101, kF + 4}};
  const absl::Status s = CheckThreadsOutside(p, parked);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("thread 101 is stopped at 0x401004, inside the 8 bytes"));
}

class JumpOptimizerCompiled : public ::testing::TestWithParam<std::string> {};

TEST_P(JumpOptimizerCompiled, RefusesAProbeWhereALoopBranchLands) {
  const auto f = CompiledFunction::Load(GetParam(), "jf_loop");
  ASSERT_NE(f, nullptr);
  const std::vector<x86::X86Insn> insns = f->Insns();
  // The loop's head H (the target of a backward branch) and the instruction just before it:
  // shorter than 5 bytes, a jump probe there covers H.
  int checked = 0;
  for (size_t i = 0; i < insns.size(); ++i) {
    const x86::X86Insn& back = insns[i];
    if (back.flow != x86::InsnFlow::kCondJump || !back.branch_target ||
        *back.branch_target >= back.addr) {
      continue;
    }
    const RemoteAddr head = *back.branch_target;
    for (size_t j = 1; j < insns.size(); ++j) {
      if (insns[j].addr != head || insns[j - 1].length >= kJumpPatchBytes) {
        continue;
      }
      const RemoteAddr probe = insns[j - 1].addr;
      const JumpDecision d = PlanJumpProbe(f->code(), probe);
      ASSERT_FALSE(d.plan.has_value()) << "accepted " << std::hex << probe.value;
      EXPECT_EQ(d.refusal, JumpRefusal::kBranchIntoRange) << d.reason;
      // The culprit is a branch (this back edge or another) to the loop's head.
      auto culprit = x86::DecodeX86(std::span(f->code().bytes).subspan(d.culprit - f->code().start),
                                    d.culprit);
      ASSERT_TRUE(culprit.ok());
      EXPECT_EQ(culprit->branch_target, head) << d.reason;
      EXPECT_THAT(d.reason,
                  HasSubstr(absl::StrFormat("jumps to jf_loop+0x%x", head - f->code().start)));
      ++checked;
    }
  }
  EXPECT_GT(checked, 0) << "jf_loop has no loop head right after a short instruction in "
                        << GetParam() << ": the fixture's code changed";
}

TEST_P(JumpOptimizerCompiled, ProvesOrRefusesASwitchWithAJumpTable) {
  const auto f = CompiledFunction::Load(GetParam(), "jf_switch");
  ASSERT_NE(f, nullptr);
  // Without the image: refused on the indirect jmp.
  const JumpDecision blind = PlanJumpProbe(f->code(), f->code().start);
  EXPECT_EQ(blind.refusal, JumpRefusal::kIndirectJump) << blind.reason;
  EXPECT_THAT(blind.reason, HasSubstr("jf_switch has an indirect jump, 'jmp %r"));

  JumpOptions options;
  options.read_image = f->ReadImage();
  if (GetParam() == "jump_funcs_O0") {
    // -O0 loads the index from the stack after the bound check: not a form kwatch proves.
    const JumpDecision d = PlanJumpProbe(f->code(), f->code().start, options);
    EXPECT_EQ(d.refusal, JumpRefusal::kIndirectJump) << d.reason;
    EXPECT_THAT(d.reason, HasSubstr("not a jump table kwatch can prove"));
    return;
  }
  const auto cold = CompiledFunction::Load(GetParam(), "jf_switch.cold");
  ASSERT_NE(cold, nullptr) << "-O2 puts the default case in jf_switch.cold";
  options.other_code.push_back(cold->code());
  // -O2: cmp/ja/lea/movslq/add/jmp *%rax over a table of 8 relative entries.
  std::optional<RemoteAddr> jmp;
  for (const x86::X86Insn& insn : f->Insns()) {
    if (insn.flow == x86::InsnFlow::kIndirectJump) {
      jmp = insn.addr;
    }
  }
  ASSERT_TRUE(jmp.has_value());
  auto targets = ProveJumpTable(f->code(), *jmp, options);
  ASSERT_TRUE(targets.ok()) << targets.status();
  EXPECT_EQ(targets->size(), 8U);
  const JumpDecision entry = PlanJumpProbe(f->code(), f->code().start, options);
  EXPECT_TRUE(entry.plan.has_value()) << entry.reason;
  // A probe just before a case whose label it would cover is refused, naming the table.
  const std::vector<x86::X86Insn> insns = f->Insns();
  int covered = 0;
  for (size_t j = 1; j < insns.size(); ++j) {
    if (std::find(targets->begin(), targets->end(), insns[j].addr) == targets->end() ||
        insns[j - 1].length >= kJumpPatchBytes) {
      continue;
    }
    const JumpDecision d = PlanJumpProbe(f->code(), insns[j - 1].addr, options);
    EXPECT_EQ(d.refusal, JumpRefusal::kBranchIntoRange) << d.reason;
    EXPECT_EQ(d.culprit, *jmp) << d.reason;
    EXPECT_THAT(d.reason, HasSubstr("of its jump table"));
    ++covered;
  }
  EXPECT_GT(covered, 0) << "no case label right after a short instruction in jf_switch";
}

TEST_P(JumpOptimizerCompiled, RefusesAnIndirectCallInsideTheRange) {
  const auto f = CompiledFunction::Load(GetParam(), "jf_indirect");
  ASSERT_NE(f, nullptr);
  int calls = 0;
  for (const x86::X86Insn& insn : f->Insns()) {
    if (insn.flow == x86::InsnFlow::kIndirectCall && insn.length < kJumpPatchBytes) {
      const JumpDecision d = PlanJumpProbe(f->code(), insn.addr);
      EXPECT_EQ(d.refusal, JumpRefusal::kCallInside) << d.reason;
      EXPECT_THAT(d.reason, HasSubstr("'call %r"));
      ++calls;
    }
  }
  EXPECT_EQ(calls, 1);
}

TEST_P(JumpOptimizerCompiled, AcceptsDirectCallsAndRipRelativeOperands) {
  const auto f = CompiledFunction::Load(GetParam(), "jf_calls");
  ASSERT_NE(f, nullptr);
  int calls = 0;
  int rip_relative = 0;
  for (const x86::X86Insn& insn : f->Insns()) {
    if (insn.flow == x86::InsnFlow::kCall) {
      const JumpDecision d = PlanJumpProbe(f->code(), insn.addr);
      ASSERT_TRUE(d.plan.has_value()) << d.reason;
      EXPECT_EQ(d.plan->len, 5U);
      EXPECT_THAT(d.plan->insn_text, ElementsAre(HasSubstr("call 0x")));
      ++calls;
    }
    if (insn.rip_target && insn.length >= kJumpPatchBytes) {
      const JumpDecision d = PlanJumpProbe(f->code(), insn.addr);
      ASSERT_TRUE(d.plan.has_value()) << d.reason;
      // Its trampoline 1 MiB away reads the same global.
      auto t = BuildTrampoline(*d.plan, insn.addr + (1 << 20), 0, RemoteAddr{0x7f0000001000});
      ASSERT_TRUE(t.ok()) << t.status();
      auto moved = x86::DecodeX86(std::span(t->code).subspan(t->displaced_offset), t->xol_addr());
      ASSERT_TRUE(moved.ok());
      EXPECT_EQ(moved->rip_target, insn.rip_target);
      ++rip_relative;
    }
  }
  EXPECT_EQ(calls, 2);
  EXPECT_GE(rip_relative, 1);
}

TEST_P(JumpOptimizerCompiled, EveryBoundaryDecidesAndAcceptedPlansBuild) {
  for (const char* name :
       {"jf_mix", "jf_redzone", "jf_loop", "jf_switch", "jf_indirect", "jf_calls", "main"}) {
    const auto f = CompiledFunction::Load(GetParam(), name);
    ASSERT_NE(f, nullptr);
    int accepted = 0;
    for (const x86::X86Insn& insn : f->Insns()) {
      const JumpDecision d = PlanJumpProbe(f->code(), insn.addr);
      if (!d.plan) {
        EXPECT_NE(d.refusal, JumpRefusal::kNone);
        EXPECT_THAT(d.reason, HasSubstr(absl::StrFormat("no jump at %s+0x", name)));
        continue;
      }
      ++accepted;
      EXPECT_GE(d.plan->len, kJumpPatchBytes);
      auto t = BuildTrampoline(*d.plan, insn.addr + 0x10000, 1, RemoteAddr{0x7f0000001000});
      EXPECT_TRUE(t.ok()) << t.status();
    }
    // Leaf functions without tables take a jump at their entry.
    if (std::string(name) == "jf_mix" || std::string(name) == "jf_redzone") {
      EXPECT_GT(accepted, 0) << name;
      EXPECT_TRUE(PlanJumpProbe(f->code(), f->code().start).plan.has_value()) << name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Levels, JumpOptimizerCompiled,
                         ::testing::Values("jump_funcs_O0", "jump_funcs_O2"));

}  // namespace
}  // namespace kwatch::core::probe
