#include "core/x86/relocator.h"

#include <cstdint>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace kwatch::core::x86 {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

using Bytes = std::vector<uint8_t>;

constexpr RemoteAddr kFrom{0x401000};
constexpr RemoteAddr kTo{0x402000};
constexpr RemoteAddr kFar{0x7f0000000000};  // beyond any rel32 from kFrom

Bytes Moved(const Bytes& code, RemoteAddr to = kTo, CallMode mode = CallMode::kPushReturn) {
  auto r = Relocate(code, kFrom, to, mode);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? r->code : Bytes{};
}

std::string Refusal(const Bytes& code, CallMode mode = CallMode::kPushReturn) {
  auto r = Relocate(code, kFrom, kTo, mode);
  EXPECT_FALSE(r.ok()) << "relocated " << code.size() << " bytes";
  return r.ok() ? "" : std::string{r.status().message()};
}

// The little-endian bytes of `v`.
Bytes Le32(int64_t v) {
  const auto u = static_cast<uint32_t>(v);
  return {static_cast<uint8_t>(u), static_cast<uint8_t>(u >> 8), static_cast<uint8_t>(u >> 16),
          static_cast<uint8_t>(u >> 24)};
}

Bytes Cat(std::initializer_list<Bytes> parts) {
  Bytes out;
  for (const Bytes& p : parts) {
    out.insert(out.end(), p.begin(), p.end());
  }
  return out;
}

TEST(Relocator, DecodesFlowAndTargets) {
  auto jcc = DecodeX86(Bytes{0x74, 0x10}, kFrom);
  ASSERT_TRUE(jcc.ok()) << jcc.status();
  EXPECT_EQ(jcc->flow, InsnFlow::kCondJump);
  EXPECT_EQ(jcc->branch_target, kFrom + 0x12);
  auto lea = DecodeX86(Bytes{0x48, 0x8d, 0x05, 0x10, 0x00, 0x00, 0x00}, kFrom);
  ASSERT_TRUE(lea.ok());
  EXPECT_EQ(lea->flow, InsnFlow::kNext);
  EXPECT_EQ(lea->rip_target, kFrom + 0x17);
  EXPECT_FALSE(lea->branch_target.has_value());
  EXPECT_EQ(lea->Text(), "lea 0x10(%rip), %rax");
  EXPECT_EQ(DecodeX86(Bytes{0xff, 0xe0}, kFrom)->flow, InsnFlow::kIndirectJump);
  EXPECT_EQ(DecodeX86(Bytes{0xff, 0xd0}, kFrom)->flow, InsnFlow::kIndirectCall);
  EXPECT_EQ(DecodeX86(Bytes{0xe8, 0, 0, 0, 0}, kFrom)->flow, InsnFlow::kCall);
  EXPECT_EQ(DecodeX86(Bytes{0xc3}, kFrom)->flow, InsnFlow::kReturn);
  EXPECT_EQ(DecodeX86(Bytes{0x0f, 0x0b}, kFrom)->flow, InsnFlow::kStop);  // ud2
  EXPECT_EQ(DecodeX86(Bytes{0x0f, 0x05}, kFrom)->flow, InsnFlow::kNext);  // syscall
  EXPECT_EQ(DecodeX86(Bytes{0xe2, 0xfe}, kFrom)->branch_target, kFrom);   // loop to itself
  auto bad = DecodeX86(Bytes{0x06}, kFrom);                               // push %es: invalid
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("0x401000 (06) do not decode"));
}

TEST(Relocator, CopiesPositionIndependentInstructions) {
  const Bytes code = {0x55, 0x48, 0x89, 0xe5, 0x0f, 0x05, 0xf0, 0x48, 0x0f, 0xb1, 0x0f};
  // push %rbp; mov %rsp,%rbp; syscall; lock cmpxchg %rcx,(%rdi)
  auto r = Relocate(code, kFrom, kTo);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->code, ElementsAreArray(code));
  EXPECT_EQ(r->length, code.size());
  ASSERT_EQ(r->insns.size(), 4U);
  EXPECT_EQ(r->insns[1].from, kFrom + 1);
  EXPECT_EQ(r->insns[1].out_offset, 1U);
  EXPECT_EQ(r->insns[1].text, "mov %rsp, %rbp");
  EXPECT_TRUE(r->falls_through);
}

TEST(Relocator, RebasesRipRelativeOperands) {
  // mov 0x10(%rip),%rax at kFrom reads kFrom + 7 + 0x10; from kTo the disp32 is that - (kTo+7).
  EXPECT_THAT(Moved({0x48, 0x8b, 0x05, 0x10, 0x00, 0x00, 0x00}),
              ElementsAreArray(Cat({{0x48, 0x8b, 0x05}, Le32(0x401017 - 0x402007)})));
  // movl $1,0x20(%rip): the immediate follows the displacement.
  EXPECT_THAT(Moved({0xc7, 0x05, 0x20, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00}),
              ElementsAreArray(Cat({{0xc7, 0x05}, Le32(0x40102a - 0x40200a), {1, 0, 0, 0}})));
  // The second instruction's new place counts the first's relocated length.
  EXPECT_THAT(Moved({0x90, 0x48, 0x8d, 0x0d, 0x00, 0x01, 0x00, 0x00}),  // nop; lea 0x100(%rip),%rcx
              ElementsAreArray(Cat({{0x90, 0x48, 0x8d, 0x0d}, Le32(0x401108 - 0x402008)})));
}

TEST(Relocator, RefusesRipRelativeTargetsOutOfReach) {
  auto r = Relocate(Bytes{0x48, 0x8b, 0x05, 0x10, 0x00, 0x00, 0x00}, kFrom, kFar);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(r.status().message(),
              HasSubstr("cannot relocate 0x401000 (mov 0x10(%rip), %rax): its RIP-relative "
                        "target 0x401017 is beyond +-2 GiB of 0x7f0000000000"));
}

TEST(Relocator, RewritesJumpsToRel32) {
  // jmp rel8 to kFrom+0x12 becomes jmp rel32 from kTo.
  EXPECT_THAT(Moved({0xeb, 0x10}), ElementsAreArray(Cat({{0xe9}, Le32(0x401012 - 0x402005)})));
  EXPECT_THAT(Moved({0xe9, 0x00, 0x01, 0x00, 0x00}),
              ElementsAreArray(Cat({{0xe9}, Le32(0x401105 - 0x402005)})));
  // Out of rel32's reach: jmp *0(%rip) and the address.
  EXPECT_THAT(Moved({0xeb, 0x10}, kFar),
              ElementsAreArray(Bytes{0xff, 0x25, 0, 0, 0, 0, 0x12, 0x10, 0x40, 0, 0, 0, 0, 0}));
  auto r = Relocate(Bytes{0xeb, 0x10}, kFrom, kTo);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->falls_through);
}

TEST(Relocator, RewritesConditionalJumpsToRel32) {
  // je rel8 -> je rel32 (0f 84).
  EXPECT_THAT(Moved({0x74, 0x10}),
              ElementsAreArray(Cat({{0x0f, 0x84}, Le32(0x401012 - 0x402006)})));
  // jg rel32 keeps its condition; the hint prefix (3e) goes.
  EXPECT_THAT(Moved({0x3e, 0x0f, 0x8f, 0x00, 0x02, 0x00, 0x00}),
              ElementsAreArray(Cat({{0x0f, 0x8f}, Le32(0x401207 - 0x402006)})));
  // Far: the inverse condition (jne) skips the 14-byte absolute jump.
  EXPECT_THAT(Moved({0x74, 0x10}, kFar), ElementsAreArray(Bytes{0x75, 0x0e, 0xff, 0x25, 0, 0, 0, 0,
                                                                0x12, 0x10, 0x40, 0, 0, 0, 0, 0}));
  auto r = Relocate(Bytes{0x74, 0x10}, kFrom, kTo);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->falls_through);
}

TEST(Relocator, RewritesCounterJumpsAsShortSequences) {
  // jrcxz L; jmp over; L: jmp rel32 target.
  EXPECT_THAT(Moved({0xe3, 0x10}),
              ElementsAreArray(Cat({{0xe3, 0x02, 0xeb, 0x05, 0xe9}, Le32(0x401012 - 0x402009)})));
  // jecxz keeps its address-size prefix.
  EXPECT_THAT(
      Moved({0x67, 0xe3, 0x10}),
      ElementsAreArray(Cat({{0x67, 0xe3, 0x02, 0xeb, 0x05, 0xe9}, Le32(0x401013 - 0x40200a)})));
  // loop back to kFrom (the range's start: the original code).
  EXPECT_THAT(Moved({0xe2, 0xfe}),
              ElementsAreArray(Cat({{0xe2, 0x02, 0xeb, 0x05, 0xe9}, Le32(0x401000 - 0x402009)})));
  EXPECT_THAT(Moved({0xe1, 0x10}, kFar),
              ElementsAreArray(Bytes{0xe1, 0x02, 0xeb, 0x0e, 0xff, 0x25, 0, 0, 0, 0, 0x12, 0x10,
                                     0x40, 0, 0, 0, 0, 0}));
}

TEST(Relocator, CallsPushTheOriginalReturnAddress) {
  // call rel32 (to kFrom+0x15): push kFrom+5 (push $lo32; movl $hi32,4(%rsp)); jmp target.
  EXPECT_THAT(Moved({0xe8, 0x10, 0x00, 0x00, 0x00}),
              ElementsAreArray(Cat({{0x68, 0x05, 0x10, 0x40, 0x00},
                                    {0xc7, 0x44, 0x24, 0x04, 0x00, 0x00, 0x00, 0x00},
                                    {0xe9},
                                    Le32(0x401015 - 0x402012)})));
  // A PIE address: the high half is written by the movl.
  auto r = Relocate(Bytes{0xe8, 0x10, 0x00, 0x00, 0x00}, RemoteAddr{0x555555555000},
                    RemoteAddr{0x555555556000});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->code, ElementsAreArray(Cat({{0x68, 0x05, 0x50, 0x55, 0x55},
                                             {0xc7, 0x44, 0x24, 0x04, 0x55, 0x55, 0x00, 0x00},
                                             {0xe9},
                                             Le32(0x555555555015 - 0x555555556012)})));
  EXPECT_FALSE(r->falls_through);  // the callee returns to the original code
  // call *%rax -> push; jmp *%rax. call *0x10(%rip) -> push; jmp *disp(%rip) rebased.
  EXPECT_THAT(Moved({0xff, 0xd0}),
              ElementsAreArray(Bytes{0x68, 0x02, 0x10, 0x40, 0x00, 0xc7, 0x44, 0x24, 0x04, 0x00,
                                     0x00, 0x00, 0x00, 0xff, 0xe0}));
  EXPECT_THAT(Moved({0xff, 0x15, 0x10, 0x00, 0x00, 0x00}),
              ElementsAreArray(Cat({{0x68, 0x06, 0x10, 0x40, 0x00},
                                    {0xc7, 0x44, 0x24, 0x04, 0x00, 0x00, 0x00, 0x00},
                                    {0xff, 0x25},
                                    Le32(0x401016 - 0x402013)})));
  // call *%r11 (REX): the ModRM's reg field changes, the prefix stays.
  EXPECT_THAT(Moved({0x41, 0xff, 0xd3}),
              ElementsAreArray(Bytes{0x68, 0x03, 0x10, 0x40, 0x00, 0xc7, 0x44, 0x24, 0x04, 0x00,
                                     0x00, 0x00, 0x00, 0x41, 0xff, 0xe3}));
}

TEST(Relocator, CallsFromTheCopy) {
  EXPECT_THAT(Moved({0xe8, 0x10, 0x00, 0x00, 0x00}, kTo, CallMode::kCallFromCopy),
              ElementsAreArray(Cat({{0xe8}, Le32(0x401015 - 0x402005)})));
  // Far: call *2(%rip); jmp over the address; the address.
  EXPECT_THAT(Moved({0xe8, 0x10, 0x00, 0x00, 0x00}, kFar, CallMode::kCallFromCopy),
              ElementsAreArray(
                  Bytes{0xff, 0x15, 0x02, 0, 0, 0, 0xeb, 0x08, 0x15, 0x10, 0x40, 0, 0, 0, 0, 0}));
  // Not last: the callee returns into the copy, which goes on.
  auto r = Relocate(Bytes{0xff, 0xd0, 0x90}, kFrom, kTo, CallMode::kCallFromCopy);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->code, ElementsAreArray(Bytes{0xff, 0xd0, 0x90}));
  EXPECT_TRUE(r->falls_through);
}

TEST(Relocator, RefusesWhatCannotMoveSayingWhy) {
  EXPECT_THAT(Refusal({0x90, 0xcc}), HasSubstr("cannot relocate 0x401001 (int3): it is a "
                                               "breakpoint already"));
  EXPECT_THAT(Refusal({0xcd, 0x03}), HasSubstr("breakpoint already"));
  EXPECT_THAT(Refusal({0xf1}), HasSubstr("int1 raises a debug trap"));
  EXPECT_THAT(Refusal({0x0f, 0x0b}), HasSubstr("raises SIGILL by design"));
  EXPECT_THAT(Refusal({0xf4}), HasSubstr("privileged instruction"));          // hlt
  EXPECT_THAT(Refusal({0x0f, 0x07}), HasSubstr("privilege-level transfer"));  // sysret
  EXPECT_THAT(Refusal({0xc7, 0xf8, 0x10, 0x00, 0x00, 0x00}), HasSubstr("xbegin"));
  EXPECT_THAT(Refusal({0xc6, 0xf8, 0x01}), HasSubstr("transactional code"));  // xabort
  EXPECT_THAT(Refusal({0x0f, 0x01, 0xd5}), HasSubstr("transactional code"));  // xend
  EXPECT_THAT(Refusal({0xff, 0x2c, 0x24}), HasSubstr("far branches"));        // ljmp *(%rsp)
  EXPECT_THAT(Refusal({0x66, 0xe9, 0x10, 0x00, 0x00, 0x00}), HasSubstr("16-bit near branches"));
  EXPECT_THAT(Refusal({0x66, 0x74, 0x10}), HasSubstr("16-bit near branches"));
  EXPECT_THAT(Refusal({0x67, 0x8b, 0x05, 0, 0, 0, 0}), HasSubstr("EIP-relative"));
  EXPECT_THAT(Refusal({0x06}), HasSubstr("do not decode"));
  EXPECT_THAT(Refusal({0x48, 0x8b}), HasSubstr("do not decode"));  // cut short
}

TEST(Relocator, RefusesJumpsIntoTheMovedBytes) {
  // jmp +1 from kFrom lands on kFrom+3, inside the four bytes.
  EXPECT_THAT(Refusal({0xeb, 0x01, 0x90, 0x90}),
              HasSubstr("(jmp 0x401003): it jumps to 0x401003, inside the instructions being "
                        "moved (0x401000..0x401004)"));
  // To the range's start is fine: the original code there.
  EXPECT_THAT(Moved({0x90, 0x75, 0xfd}),
              ElementsAreArray(Cat({{0x90, 0x0f, 0x85}, Le32(0x401000 - 0x402007)})));
}

TEST(Relocator, PushReturnCallsMustEndTheRange) {
  EXPECT_THAT(Refusal({0xe8, 0x10, 0x00, 0x00, 0x00, 0x90}),
              HasSubstr("the call returns to 0x401005, inside the instructions being moved"));
  EXPECT_THAT(Refusal({0xff, 0x54, 0x24, 0x08}), HasSubstr("a call through %rsp"));
}

TEST(Relocator, AppendJumpPicksTheForm) {
  Bytes out = {0x90};
  AppendJump(out, RemoteAddr{0x1000}, RemoteAddr{0x2000});
  EXPECT_THAT(out, ElementsAreArray(Cat({{0x90, 0xe9}, Le32(0x2000 - 0x1006)})));
  EXPECT_TRUE(Rel32Reaches(RemoteAddr{0x80000001}, RemoteAddr{0x100000000}));   // +2^31-1
  EXPECT_FALSE(Rel32Reaches(RemoteAddr{0x80000000}, RemoteAddr{0x100000000}));  // +2^31
  EXPECT_TRUE(Rel32Reaches(RemoteAddr{0x100000000}, RemoteAddr{0x80000000}));   // -2^31
}

}  // namespace
}  // namespace kwatch::core::x86
