#include "core/x86/access_regs.h"

#include <sys/user.h>

#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

namespace kwatch::core::x86 {
namespace {

constexpr uint64_t kIp = 0x401000;

// Plans `code` at kIp; the bytes are one whole instruction.
AccessPlan Plan(const std::vector<uint8_t>& code) {
  const absl::StatusOr<AccessPlan> p = PlanAccess(code, kIp);
  EXPECT_TRUE(p.ok()) << p.status();
  if (!p.ok()) {
    return {};
  }
  EXPECT_EQ(p->length, code.size());
  return *p;
}

// Registers after the instruction: distinct values everywhere, so a wrong register shows.
user_regs_struct After() {
  user_regs_struct r{};
  r.rax = 0x1111111111111111;
  r.rbx = 0x2222222222222222;
  r.rcx = 3;
  r.rdx = 0x4444444444444444;
  r.rsi = 0x1122334455667788;
  r.rdi = 0x7ffd0000;
  r.rbp = 0x7ffe1000;
  r.rsp = 0x7ffe0000;
  r.r8 = 0x8888888888888888;
  r.rip = kIp + 16;
  return r;
}

// --- stores: the value is the source after the instruction (mov changes no register) ---

TEST(AccessRegs, StoreOfA64BitRegisterThroughABaseRegister) {
  const AccessPlan p = Plan({0x48, 0x89, 0x37});  // mov %rsi,(%rdi)
  EXPECT_EQ(p.address, AccessPlan::Address::kFromRegisters);
  EXPECT_EQ(p.value, AccessPlan::Value::kRegister);
  EXPECT_TRUE(p.writes);
  EXPECT_FALSE(p.reads);
  const user_regs_struct r = After();
  const RegisterAccess a = EvaluateAccess(p, &r);
  ASSERT_TRUE(a.addr_known);
  EXPECT_EQ(a.addr, 0x7ffd0000u);
  EXPECT_EQ(a.size, 8u);
  ASSERT_TRUE(a.value_known);
  EXPECT_EQ(a.value, 0x1122334455667788u);
}

TEST(AccessRegs, NarrowerStoresTakeTheLowBytesOfTheSource) {
  const user_regs_struct r = After();
  // mov %esi,0x8(%rdi)
  RegisterAccess a = EvaluateAccess(Plan({0x89, 0x77, 0x08}), &r);
  ASSERT_TRUE(a.addr_known && a.value_known);
  EXPECT_EQ(a.addr, 0x7ffd0008u);
  EXPECT_EQ(a.size, 4u);
  EXPECT_EQ(a.value, 0x55667788u);
  // mov %si,0x2(%rdi,%rcx,4): base + index * scale + disp
  a = EvaluateAccess(Plan({0x66, 0x89, 0x74, 0x8f, 0x02}), &r);
  ASSERT_TRUE(a.addr_known && a.value_known);
  EXPECT_EQ(a.addr, 0x7ffd0000u + 3 * 4 + 2);
  EXPECT_EQ(a.size, 2u);
  EXPECT_EQ(a.value, 0x7788u);
  // mov %ah,(%rdi): bits 8..15 of rax
  user_regs_struct r2 = r;
  r2.rax = 0xa5c3;
  a = EvaluateAccess(Plan({0x88, 0x27}), &r2);
  ASSERT_TRUE(a.value_known);
  EXPECT_EQ(a.size, 1u);
  EXPECT_EQ(a.value, 0xa5u);
  // movnti %rsi,(%rdi)
  a = EvaluateAccess(Plan({0x48, 0x0f, 0xc3, 0x37}), &r);
  ASSERT_TRUE(a.value_known);
  EXPECT_EQ(a.value, 0x1122334455667788u);
  // mov %rax,(%rsp): rsp is a base the instruction keeps
  a = EvaluateAccess(Plan({0x48, 0x89, 0x04, 0x24}), &r);
  ASSERT_TRUE(a.addr_known && a.value_known);
  EXPECT_EQ(a.addr, 0x7ffe0000u);
  EXPECT_EQ(a.value, 0x1111111111111111u);
}

TEST(AccessRegs, ImmediateStoresNeedNoRegistersWhenTheAddressIsRipRelative) {
  // movq $-1,0x10(%rip): 11 bytes, imm32 sign-extended to 64 bits
  const AccessPlan p = Plan({0x48, 0xc7, 0x05, 0x10, 0x00, 0x00, 0x00, 0xff, 0xff, 0xff, 0xff});
  EXPECT_EQ(p.address, AccessPlan::Address::kFixed);
  EXPECT_EQ(p.value, AccessPlan::Value::kImmediate);
  const RegisterAccess a = EvaluateAccess(p, nullptr);
  ASSERT_TRUE(a.addr_known && a.value_known);
  EXPECT_EQ(a.addr, kIp + 11 + 0x10);
  EXPECT_EQ(a.size, 8u);
  EXPECT_EQ(a.value, 0xffffffffffffffffu);
  // movb $0x7f,(%rax)
  const user_regs_struct r = After();
  const RegisterAccess b = EvaluateAccess(Plan({0xc6, 0x00, 0x7f}), &r);
  ASSERT_TRUE(b.addr_known && b.value_known);
  EXPECT_EQ(b.addr, r.rax);
  EXPECT_EQ(b.size, 1u);
  EXPECT_EQ(b.value, 0x7fu);
}

TEST(AccessRegs, AbsoluteAddressesAreFixed) {
  const user_regs_struct r = After();
  // mov %rbx,0x601040 (SIB, no base, no index)
  RegisterAccess a = EvaluateAccess(Plan({0x48, 0x89, 0x1c, 0x25, 0x40, 0x10, 0x60, 0x00}), &r);
  ASSERT_TRUE(a.addr_known && a.value_known);
  EXPECT_EQ(a.addr, 0x601040u);
  EXPECT_EQ(a.value, 0x2222222222222222u);
  // movabs %rax,0x601040 (moffs64)
  a = EvaluateAccess(Plan({0x48, 0xa3, 0x40, 0x10, 0x60, 0x00, 0x00, 0x00, 0x00, 0x00}), &r);
  ASSERT_TRUE(a.addr_known && a.value_known);
  EXPECT_EQ(a.addr, 0x601040u);
  EXPECT_EQ(a.value, 0x1111111111111111u);
}

TEST(AccessRegs, Addr32WrapsTheAddress) {
  user_regs_struct r = After();
  r.rdi = 0xffffffff00001000;
  const RegisterAccess a = EvaluateAccess(Plan({0x67, 0x89, 0x07}), &r);  // mov %eax,(%edi)
  ASSERT_TRUE(a.addr_known);
  EXPECT_EQ(a.addr, 0x1000u);
  EXPECT_EQ(a.value, 0x11111111u);
}

// --- loads: the loaded bytes are the destination's low `size` bytes after the instruction ---

TEST(AccessRegs, LoadsReadTheDestinationAfterTheInstruction) {
  user_regs_struct r = After();
  r.rax = 0x0123456789abcdef;
  // mov (%rdi),%rax
  RegisterAccess a = EvaluateAccess(Plan({0x48, 0x8b, 0x07}), &r);
  ASSERT_TRUE(a.addr_known && a.value_known);
  EXPECT_EQ(a.addr, 0x7ffd0000u);
  EXPECT_EQ(a.size, 8u);
  EXPECT_EQ(a.value, 0x0123456789abcdefu);
  // mov (%rdi),%eax: the 32-bit destination was zero-extended; the loaded bytes are 4
  r.rax = 0x00000000deadbeef;
  a = EvaluateAccess(Plan({0x8b, 0x07}), &r);
  ASSERT_TRUE(a.value_known);
  EXPECT_EQ(a.size, 4u);
  EXPECT_EQ(a.value, 0xdeadbeefu);
  // mov (%rdi),%ah
  r.rax = 0x1234;
  a = EvaluateAccess(Plan({0x8a, 0x27}), &r);
  ASSERT_TRUE(a.value_known);
  EXPECT_EQ(a.size, 1u);
  EXPECT_EQ(a.value, 0x12u);
}

TEST(AccessRegs, ExtendingLoadsKeepOnlyTheBytesLoaded) {
  user_regs_struct r = After();
  // movzbl (%rdi),%eax
  r.rax = 0xf0;
  RegisterAccess a = EvaluateAccess(Plan({0x0f, 0xb6, 0x07}), &r);
  ASSERT_TRUE(a.value_known);
  EXPECT_EQ(a.size, 1u);
  EXPECT_EQ(a.value, 0xf0u);
  // movswq (%rdi),%rax: sign-extended 0x8001
  r.rax = 0xffffffffffff8001;
  a = EvaluateAccess(Plan({0x48, 0x0f, 0xbf, 0x07}), &r);
  ASSERT_TRUE(a.value_known);
  EXPECT_EQ(a.size, 2u);
  EXPECT_EQ(a.value, 0x8001u);
  // movslq (%rdi),%rax
  r.rax = 0xffffffff80000000;
  a = EvaluateAccess(Plan({0x48, 0x63, 0x07}), &r);
  ASSERT_TRUE(a.value_known);
  EXPECT_EQ(a.size, 4u);
  EXPECT_EQ(a.value, 0x80000000u);
}

// --- refused: the instruction wrote a register its address uses ---

TEST(AccessRegs, ABaseOrIndexTheInstructionOverwritesIsRefused) {
  const user_regs_struct r = After();
  for (const std::vector<uint8_t>& code : std::vector<std::vector<uint8_t>>{
           {0x50},  // push %rax (rsp)
           {0x58},  // pop %rax
       }) {
    const AccessPlan p = Plan(code);
    EXPECT_EQ(p.address, AccessPlan::Address::kUnknown) << int{code[0]};
    const RegisterAccess a = EvaluateAccess(p, &r);
    EXPECT_FALSE(a.addr_known) << int{code[0]};
    EXPECT_FALSE(a.value_known) << int{code[0]};
  }
}

// A load into its own base register: the address is gone after it ran, the value is not (it
// is what the register holds), and it is planned independently.
TEST(AccessRegs, ALoadIntoItsBaseKeepsItsValueWithoutAnAddress) {
  const user_regs_struct r = After();
  for (const std::vector<uint8_t>& code : std::vector<std::vector<uint8_t>>{
           {0x48, 0x8b, 0x00},        // mov (%rax),%rax
           {0x48, 0x8b, 0x40, 0x10},  // mov 0x10(%rax),%rax
           {0x48, 0x8b, 0x04, 0xc7},  // mov (%rdi,%rax,8),%rax
       }) {
    const AccessPlan p = Plan(code);
    EXPECT_EQ(p.address, AccessPlan::Address::kUnknown) << code.size();
    EXPECT_EQ(p.value, AccessPlan::Value::kRegister) << code.size();
    const RegisterAccess a = EvaluateAccess(p, &r);
    EXPECT_FALSE(a.addr_known) << code.size();
    ASSERT_TRUE(a.value_known) << code.size();
    EXPECT_EQ(a.value, r.rax) << code.size();
    EXPECT_EQ(a.size, 8u) << code.size();
  }
  // 32-bit: mov 0x8(%rax),%eax
  const RegisterAccess narrow = EvaluateAccess(Plan({0x8b, 0x40, 0x08}), &r);
  EXPECT_FALSE(narrow.addr_known);
  ASSERT_TRUE(narrow.value_known);
  EXPECT_EQ(narrow.value, r.rax & 0xffffffffU);
  EXPECT_EQ(narrow.size, 4u);
}

TEST(AccessRegs, SeveralMemoryOperandsOrAnFsBaseLeaveTheAddressUnknown) {
  const user_regs_struct r = After();
  for (const std::vector<uint8_t>& code : std::vector<std::vector<uint8_t>>{
           {0x48, 0xa5},                                            // movsq
           {0x64, 0x48, 0x8b, 0x04, 0x25, 0x28, 0x00, 0x00, 0x00},  // mov %fs:0x28,%rax
       }) {
    const RegisterAccess a = EvaluateAccess(Plan(code), &r);
    EXPECT_FALSE(a.addr_known);
    // A movs has no single value; the %fs load's value is what rax holds after it.
    EXPECT_EQ(a.value_known, code[0] == 0x64);
  }
  // lea touches no memory
  const AccessPlan lea = Plan({0x48, 0x8d, 0x47, 0x08});
  EXPECT_EQ(lea.size, 0u);
  EXPECT_FALSE(EvaluateAccess(lea, &r).addr_known);
}

// --- no value: anything but a plain mov keeps the value unknown, the address when it can ---

TEST(AccessRegs, ReadModifyWriteAndExchangesGiveTheAddressButNoValue) {
  const user_regs_struct r = After();
  struct Case {
    std::vector<uint8_t> code;
    uint32_t size;
    bool reads;
  };
  for (const Case& c : std::vector<Case>{
           {{0x48, 0x83, 0x07, 0x01}, 8, true},        // addq $1,(%rdi)
           {{0x48, 0x87, 0x07}, 8, true},              // xchg %rax,(%rdi)
           {{0xf0, 0x48, 0x0f, 0xb1, 0x37}, 8, true},  // lock cmpxchg %rsi,(%rdi)
           {{0xf3, 0x0f, 0x7f, 0x07}, 16, false},      // movdqu %xmm0,(%rdi)
           {{0x8c, 0x1f}, 2, false},                   // mov %ds,(%rdi)
       }) {
    const AccessPlan p = Plan(c.code);
    EXPECT_EQ(p.value, AccessPlan::Value::kNone) << int{c.code[0]};
    const RegisterAccess a = EvaluateAccess(p, &r);
    ASSERT_TRUE(a.addr_known) << int{c.code[0]};
    EXPECT_EQ(a.addr, 0x7ffd0000u);
    EXPECT_EQ(a.size, c.size);
    EXPECT_TRUE(p.writes);
    EXPECT_EQ(p.reads, c.reads);
    EXPECT_FALSE(a.value_known);
  }
  // addl $1,0x20(%rip): RIP-relative, known without registers
  const AccessPlan rip = Plan({0x83, 0x05, 0x20, 0x00, 0x00, 0x00, 0x01});
  EXPECT_EQ(rip.address, AccessPlan::Address::kFixed);
  const RegisterAccess a = EvaluateAccess(rip, nullptr);
  ASSERT_TRUE(a.addr_known);
  EXPECT_EQ(a.addr, kIp + 7 + 0x20);
  EXPECT_EQ(a.size, 4u);
  EXPECT_FALSE(a.value_known);
}

TEST(AccessRegs, WithoutRegistersOnlyFixedAddressesAndImmediatesAreKnown) {
  const RegisterAccess a = EvaluateAccess(Plan({0x48, 0x89, 0x37}), nullptr);  // mov %rsi,(%rdi)
  EXPECT_FALSE(a.addr_known);
  EXPECT_FALSE(a.value_known);
  // mov %rbx,0x601040: address fixed, the value needs rbx
  const RegisterAccess b =
      EvaluateAccess(Plan({0x48, 0x89, 0x1c, 0x25, 0x40, 0x10, 0x60, 0x00}), nullptr);
  EXPECT_TRUE(b.addr_known);
  EXPECT_EQ(b.addr, 0x601040u);
  EXPECT_FALSE(b.value_known);
}

TEST(AccessRegs, BytesThatDoNotDecodeAreAnError) {
  const std::vector<uint8_t> code = {0x48};  // a REX prefix and nothing after it
  EXPECT_EQ(PlanAccess(code, kIp).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kwatch::core::x86
