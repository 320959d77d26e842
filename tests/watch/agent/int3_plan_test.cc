#include "watch/agent/int3_plan.h"

#include <vector>

#include <gtest/gtest.h>

#include "agent/abi.h"
#include "core/probe/insn_fixup.h"

namespace kwatch::watch::agent {
namespace {

namespace ka = kwatch::agent;

constexpr uint64_t kAt = 0x401000;

ProbeEntry Plan(std::vector<uint8_t> bytes) {
  auto insn = core::probe::AnalyzeProbedInsn(bytes, core::RemoteAddr{kAt});
  EXPECT_TRUE(insn.ok()) << insn.status();
  ProbeEntry e;
  if (insn.ok()) {
    const absl::Status s = PlanResume(*insn, e);
    EXPECT_TRUE(s.ok()) << s;
  }
  return e;
}

TEST(PlanResume, RelativeBranchesCallsAndReturnsAreEmulated) {
  ProbeEntry jz = Plan({0x74, 0x10});  // jz .+0x12
  EXPECT_EQ(jz.resume, ka::kKwResumeJcc);
  EXPECT_EQ(jz.cond, 4u);
  EXPECT_EQ(jz.target, kAt + 2 + 0x10);
  EXPECT_EQ(jz.insn_len, 2u);
  ProbeEntry jg = Plan({0x0f, 0x8f, 0x00, 0x01, 0x00, 0x00});  // jg rel32
  EXPECT_EQ(jg.cond, 15u);
  EXPECT_EQ(jg.target, kAt + 6 + 0x100);
  ProbeEntry jrcxz = Plan({0xe3, 0x05});
  EXPECT_EQ(jrcxz.cond, ka::kKwCondJrcxz);
  ProbeEntry loop = Plan({0xe2, 0xfe});
  EXPECT_EQ(loop.cond, ka::kKwCondLoop);
  EXPECT_EQ(loop.target, kAt);
  ProbeEntry loop32 = Plan({0x67, 0xe2, 0xfd});
  EXPECT_EQ(loop32.cond, ka::kKwCondLoop | ka::kKwCondAddr32);
  ProbeEntry jmp = Plan({0xe9, 0xfb, 0xff, 0xff, 0xff});  // jmp .+0 (to itself)
  EXPECT_EQ(jmp.resume, ka::kKwResumeJmp);
  EXPECT_EQ(jmp.target, kAt);
  ProbeEntry call = Plan({0xe8, 0x10, 0x00, 0x00, 0x00});
  EXPECT_EQ(call.resume, ka::kKwResumeCall);
  EXPECT_EQ(call.target, kAt + 5 + 0x10);
  EXPECT_EQ(Plan({0xc3}).resume, ka::kKwResumeRet);
  ProbeEntry ret8 = Plan({0xc2, 0x08, 0x00});
  EXPECT_EQ(ret8.resume, ka::kKwResumeRet);
  EXPECT_EQ(ret8.ret_imm, 8u);
}

TEST(PlanResume, IndirectBranchesNameTheirOperand) {
  ProbeEntry reg = Plan({0xff, 0xe0});  // jmp *%rax
  EXPECT_EQ(reg.resume, ka::kKwResumeIndirect);
  EXPECT_EQ(reg.ind_base, ka::kKwRax + 1u);
  EXPECT_EQ(reg.ind_flags, 0u);
  ProbeEntry r11 = Plan({0x41, 0xff, 0xd3});  // call *%r11
  EXPECT_EQ(r11.ind_base, ka::kKwR11 + 1u);
  EXPECT_EQ(r11.ind_flags, ka::kKwIndCall);
  ProbeEntry rip = Plan({0xff, 0x15, 0x10, 0x00, 0x00, 0x00});  // call *0x10(%rip)
  EXPECT_EQ(rip.ind_flags, ka::kKwIndCall | ka::kKwIndMemory);
  EXPECT_EQ(rip.ind_base, 0u);
  EXPECT_EQ(rip.ind_disp, static_cast<int64_t>(kAt + 6 + 0x10));
  ProbeEntry table = Plan({0xff, 0x64, 0xd8, 0x08});  // jmp *0x8(%rax,%rbx,8)
  EXPECT_EQ(table.ind_flags, ka::kKwIndMemory);
  EXPECT_EQ(table.ind_base, ka::kKwRax + 1u);
  EXPECT_EQ(table.ind_index, ka::kKwRbx + 1u);
  EXPECT_EQ(table.ind_scale, 8u);
  EXPECT_EQ(table.ind_disp, 8);
  ProbeEntry fs = Plan({0x64, 0xff, 0x24, 0x25, 0x28, 0x00, 0x00, 0x00});  // jmp *%fs:0x28
  EXPECT_EQ(fs.ind_flags, ka::kKwIndMemory | ka::kKwIndFs);
  EXPECT_EQ(fs.ind_base, 0u);
  EXPECT_EQ(fs.ind_disp, 0x28);
}

TEST(PlanResume, EverythingElseRunsOutOfLine) {
  ProbeEntry mov = Plan({0x48, 0x89, 0xf8});  // mov %rdi,%rax
  EXPECT_EQ(mov.resume, ka::kKwResumeXol);
  EXPECT_EQ(mov.insn_len, 3u);
  EXPECT_EQ(Plan({0x55}).resume, ka::kKwResumeXol);                                // push %rbp
  EXPECT_EQ(Plan({0x8b, 0x05, 0x10, 0x00, 0x00, 0x00}).resume, ka::kKwResumeXol);  // rip-rel
}

}  // namespace
}  // namespace kwatch::watch::agent
