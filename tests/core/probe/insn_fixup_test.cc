#include "core/probe/insn_fixup.h"

#include <Zydis/Zydis.h>

#include <cstring>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace kwatch::core::probe {
namespace {

using ::testing::HasSubstr;

constexpr RemoteAddr kAt{0x555555555000};

ProbedInsn Analyze(std::vector<uint8_t> code, RemoteAddr at = kAt) {
  auto p = AnalyzeProbedInsn(code, at);
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? *p : ProbedInsn{};
}

std::string Refusal(std::vector<uint8_t> code) {
  auto p = AnalyzeProbedInsn(code, kAt);
  EXPECT_FALSE(p.ok()) << "accepted " << p->text;
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(p.status().message());
}

TEST(InsnFixup, ClassifiesPrologueInstructions) {
  const ProbedInsn push = Analyze({0x55});
  EXPECT_EQ(push.kind, InsnKind::kPush);
  EXPECT_EQ(push.length, 1);
  EXPECT_TRUE(push.can_emulate);
  EXPECT_TRUE(push.can_run_out_of_line);
  EXPECT_TRUE(push.emulation_touches_memory);
  EXPECT_FALSE(push.PreferEmulation());  // a copy needs no system call; emulation would

  const ProbedInsn mov = Analyze({0x48, 0x89, 0xe5});  // mov %rsp,%rbp
  EXPECT_EQ(mov.kind, InsnKind::kMovRegReg);
  EXPECT_TRUE(mov.PreferEmulation());
  EXPECT_EQ(mov.text, "mov %rsp, %rbp");

  EXPECT_EQ(Analyze({0x48, 0x83, 0xec, 0x10}).kind, InsnKind::kAddSubImm);  // sub $0x10,%rsp
  EXPECT_EQ(Analyze({0xf3, 0x0f, 0x1e, 0xfa}).kind, InsnKind::kNop);        // endbr64
  EXPECT_EQ(Analyze({0x66, 0x0f, 0x1f, 0x44, 0x00, 0x00}).kind, InsnKind::kNop);
  EXPECT_EQ(Analyze({0xb8, 0x39, 0x00, 0x00, 0x00}).kind, InsnKind::kMovRegImm);
  const ProbedInsn lea = Analyze({0x48, 0x8d, 0x47, 0x05});  // lea 5(%rdi),%rax
  EXPECT_EQ(lea.kind, InsnKind::kLea);
  EXPECT_TRUE(lea.PreferEmulation());
}

TEST(InsnFixup, BranchesAreEmulatedOnly) {
  for (const std::vector<uint8_t>& code : std::vector<std::vector<uint8_t>>{
           {0xe9, 0x10, 0x00, 0x00, 0x00},        // jmp rel32
           {0xeb, 0x05},                          // jmp rel8
           {0x7c, 0x05},                          // jl rel8
           {0x0f, 0x84, 0x00, 0x01, 0x00, 0x00},  // je rel32
           {0xe3, 0x02},                          // jrcxz
           {0xe2, 0xfe},                          // loop
           {0xe8, 0x00, 0x00, 0x00, 0x00},        // call rel32
           {0xff, 0xd0},                          // call *%rax
           {0xff, 0x15, 0x10, 0x00, 0x00, 0x00},  // call *0x10(%rip)
           {0xc3},                                // ret
           {0xc2, 0x08, 0x00},                    // ret $8
       }) {
    const ProbedInsn p = Analyze(code);
    EXPECT_TRUE(p.can_emulate) << p.text;
    EXPECT_FALSE(p.can_run_out_of_line) << p.text;
    EXPECT_TRUE(p.PreferEmulation()) << p.text;
  }
  const ProbedInsn jmp = Analyze({0xff, 0xe0});  // jmp *%rax: a copy works, never falls through
  EXPECT_EQ(jmp.kind, InsnKind::kJmpIndirect);
  EXPECT_TRUE(jmp.can_run_out_of_line);
  EXPECT_FALSE(jmp.falls_through);
}

TEST(InsnFixup, RefusesWhatCannotBeDisplacedSayingWhy) {
  EXPECT_THAT(Refusal({0xcc}), HasSubstr("breakpoint already"));
  EXPECT_THAT(Refusal({0xcd, 0x03}), HasSubstr("breakpoint already"));
  EXPECT_THAT(Refusal({0xf1}), HasSubstr("int1"));
  EXPECT_THAT(Refusal({0x0f, 0x0b}), HasSubstr("SIGILL"));            // ud2
  EXPECT_THAT(Refusal({0xf4}), HasSubstr("privileged"));              // hlt
  EXPECT_THAT(Refusal({0x0f, 0x01, 0xf8}), HasSubstr("privileged"));  // swapgs
  EXPECT_THAT(Refusal({0x0f, 0x34}), HasSubstr("privilege-level"));   // sysenter
  EXPECT_THAT(Refusal({0x48, 0xcf}), HasSubstr("privilege-level"));   // iretq
  EXPECT_THAT(Refusal({0xff, 0x2c, 0x24}), HasSubstr("far"));         // ljmp *(%rsp)
  EXPECT_THAT(Refusal({0xc7, 0xf8, 0x00, 0x00, 0x00, 0x00}), HasSubstr("xbegin"));
  EXPECT_THAT(Refusal({0x0f, 0xff, 0xc0}), HasSubstr("SIGILL"));  // ud0
  const std::string undecodable = Refusal({0x0f, 0x04});
  EXPECT_THAT(undecodable, HasSubstr("do not decode"));
  EXPECT_THAT(undecodable, HasSubstr("0f 04"));
  EXPECT_THAT(Refusal({}), HasSubstr("do not decode"));
}

TEST(InsnFixup, AcceptsSyscallLockAndRipRelative) {
  EXPECT_EQ(Analyze({0x0f, 0x05}).kind, InsnKind::kOther);  // syscall: runs out of line
  // addl $1, 0x100(%rip)
  const ProbedInsn add = Analyze({0x83, 0x05, 0x00, 0x01, 0x00, 0x00, 0x01});
  EXPECT_EQ(add.kind, InsnKind::kOther);
  EXPECT_EQ(add.rip_disp_offset, 2);
  EXPECT_EQ(RipRelativeTarget(add).value, kAt.value + 7 + 0x100);
  // lock incl 0x10(%rip)
  const ProbedInsn lock = Analyze({0xf0, 0xff, 0x05, 0x10, 0x00, 0x00, 0x00});
  EXPECT_TRUE(lock.can_run_out_of_line);
  EXPECT_EQ(lock.rip_disp_offset, 3);
  // lea 0x10(%rip),%rax is emulated, its copy fixed up as well
  const ProbedInsn lea = Analyze({0x48, 0x8d, 0x05, 0x10, 0x00, 0x00, 0x00});
  EXPECT_EQ(lea.kind, InsnKind::kLea);
  EXPECT_EQ(lea.rip_disp_offset, 3);
}

// Decodes `code` at `at` and returns the absolute target of its RIP-relative operand.
uint64_t DecodedRipTarget(const std::vector<uint8_t>& code, uint64_t at) {
  ZydisDecoder dec;
  ZydisDecoderInit(&dec, ZYDIS_MACHINE_MODE_LONG_64, ZYDIS_STACK_WIDTH_64);
  ZydisDecodedInstruction insn;
  ZydisDecodedOperand ops[ZYDIS_MAX_OPERAND_COUNT];
  EXPECT_TRUE(ZYAN_SUCCESS(ZydisDecoderDecodeFull(&dec, code.data(), code.size(), &insn, ops)));
  for (int i = 0; i < insn.operand_count_visible; ++i) {
    if (ops[i].type == ZYDIS_OPERAND_TYPE_MEMORY && ops[i].mem.base == ZYDIS_REGISTER_RIP) {
      uint64_t target = 0;
      EXPECT_TRUE(ZYAN_SUCCESS(ZydisCalcAbsoluteAddress(&insn, &ops[i], at, &target)));
      return target;
    }
  }
  ADD_FAILURE() << "no RIP-relative operand";
  return 0;
}

TEST(InsnFixup, OutOfLineCopyKeepsTheRipRelativeTargetAndJumpsBack) {
  // addl $1, 0x100(%rip), copied 1 MiB below.
  const ProbedInsn add = Analyze({0x83, 0x05, 0x00, 0x01, 0x00, 0x00, 0x01});
  const RemoteAddr slot{kAt.value - (1 << 20)};
  auto copy = BuildOutOfLineCopy(add, slot, XolTail::kJumpBack);
  ASSERT_TRUE(copy.ok()) << copy.status();
  ASSERT_EQ(copy->size(), 7u + 5u);
  EXPECT_EQ(DecodedRipTarget(*copy, slot.value), kAt.value + 7 + 0x100);
  EXPECT_EQ((*copy)[6], 0x01);  // the immediate after the displacement is untouched
  EXPECT_EQ((*copy)[7], 0xe9);  // jmp rel32 ...
  int32_t rel = 0;
  std::memcpy(&rel, copy->data() + 8, 4);
  EXPECT_EQ(slot.value + 7 + 5 + static_cast<int64_t>(rel), kAt.value + 7);  // ... to addr+len

  auto trap = BuildOutOfLineCopy(add, slot + 32, XolTail::kTrap);
  ASSERT_TRUE(trap.ok());
  ASSERT_EQ(trap->size(), 8u);
  EXPECT_EQ(trap->back(), 0xcc);
  EXPECT_EQ(DecodedRipTarget(*trap, slot.value + 32), kAt.value + 7 + 0x100);
}

TEST(InsnFixup, FarSlotsUseAnAbsoluteJumpOrAreRefused) {
  const ProbedInsn push = Analyze({0x55});
  const RemoteAddr far{0x10000000};  // ~85 TiB away
  auto copy = BuildOutOfLineCopy(push, far, XolTail::kJumpBack);
  ASSERT_TRUE(copy.ok());
  ASSERT_EQ(copy->size(), 1u + 14u);
  EXPECT_EQ((*copy)[1], 0xff);
  EXPECT_EQ((*copy)[2], 0x25);
  uint64_t abs = 0;
  std::memcpy(&abs, copy->data() + 7, 8);
  EXPECT_EQ(abs, kAt.value + 1);

  const ProbedInsn add = Analyze({0x83, 0x05, 0x00, 0x01, 0x00, 0x00, 0x01});
  auto refused = BuildOutOfLineCopy(add, far, XolTail::kJumpBack);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_FALSE(RipRelativeReaches(far, 7, RipRelativeTarget(add)));
  EXPECT_TRUE(RipRelativeReaches(RemoteAddr{kAt.value - 0x7fff0000}, 7, RipRelativeTarget(add)));

  const ProbedInsn call = Analyze({0xe8, 0x00, 0x00, 0x00, 0x00});
  EXPECT_EQ(BuildOutOfLineCopy(call, far, XolTail::kJumpBack).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // jmp *%rax never falls through: an INT3 guards its end.
  auto jmp = BuildOutOfLineCopy(Analyze({0xff, 0xe0}), far, XolTail::kJumpBack);
  ASSERT_TRUE(jmp.ok());
  EXPECT_EQ(*jmp, (std::vector<uint8_t>{0xff, 0xe0, 0xcc}));
}

TEST(InsnFixup, InstructionBoundaries) {
  // push %rbp; mov %rsp,%rbp; addl $1,0x100(%rip); pop %rbp; ret
  const std::vector<uint8_t> fn = {0x55, 0x48, 0x89, 0xe5, 0x83, 0x05, 0x00,
                                   0x01, 0x00, 0x00, 0x01, 0x5d, 0xc3};
  for (uint64_t ok : {0, 1, 4, 11, 12}) {
    EXPECT_TRUE(CheckInstructionBoundary(fn, kAt, kAt + ok).ok()) << ok;
  }
  const absl::Status mid = CheckInstructionBoundary(fn, kAt, kAt + 6);
  EXPECT_EQ(mid.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(mid.message()), HasSubstr("not on an instruction boundary"));
  // Instructions read as objdump prints them (core/x86/format.h), as in every other message.
  EXPECT_THAT(std::string(mid.message()), HasSubstr("'addl $0x1, 0x100(%rip)'"));
  EXPECT_THAT(std::string(mid.message()), HasSubstr("+0x4"));
  EXPECT_FALSE(CheckInstructionBoundary(fn, kAt, kAt + 13).ok());
}

}  // namespace
}  // namespace kwatch::core::probe
