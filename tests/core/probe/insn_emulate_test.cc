#include "core/probe/insn_emulate.h"

#include <cstring>
#include <map>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_format.h"

namespace kwatch::core::probe {
namespace {

constexpr RemoteAddr kAt{0x401000};
constexpr uint64_t kStatusFlags = 0x8d5;  // CF PF AF ZF SF OF

ProbedInsn Analyze(std::vector<uint8_t> code, RemoteAddr at = kAt) {
  auto p = AnalyzeProbedInsn(code, at);
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? *p : ProbedInsn{};
}

// A sparse little memory: 8-byte words by address.
struct FakeMemory {
  std::map<uint64_t, uint8_t> bytes;
  bool fail = false;
  x86::EmulatorMemory Callbacks() {
    x86::EmulatorMemory m;
    m.read = [this](uint64_t addr, std::span<uint8_t> out) {
      if (fail) {
        return absl::InternalError("read fault");
      }
      for (size_t i = 0; i < out.size(); ++i) {
        out[i] = bytes[addr + i];
      }
      return absl::OkStatus();
    };
    m.write = [this](uint64_t addr, std::span<const uint8_t> data) {
      if (fail) {
        return absl::InternalError("write fault");
      }
      for (size_t i = 0; i < data.size(); ++i) {
        bytes[addr + i] = data[i];
      }
      return absl::OkStatus();
    };
    return m;
  }
  uint64_t Word(uint64_t addr) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; --i) {
      v = (v << 8) | bytes[addr + i];
    }
    return v;
  }
  void SetWord(uint64_t addr, uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      bytes[addr + i] = static_cast<uint8_t>(v >> (8 * i));
    }
  }
};

user_regs_struct Regs() {
  user_regs_struct r{};
  r.rip = kAt.value;
  r.rsp = 0x7ffc0000;
  r.rbp = 0x1111;
  r.rdi = 0x2222;
  r.eflags = 0x202;
  return r;
}

TEST(InsnEmulate, PushMovAndPop) {
  FakeMemory mem;
  auto m = mem.Callbacks();
  user_regs_struct r = Regs();
  ASSERT_TRUE(EmulateProbedInsn(Analyze({0x55}), r, m).ok());  // push %rbp
  EXPECT_EQ(r.rsp, 0x7ffc0000u - 8);
  EXPECT_EQ(mem.Word(r.rsp), 0x1111u);
  EXPECT_EQ(r.rip, kAt.value + 1);
  r.rip = kAt.value;
  ASSERT_TRUE(EmulateProbedInsn(Analyze({0x48, 0x89, 0xe5}), r, m).ok());  // mov %rsp,%rbp
  EXPECT_EQ(r.rbp, r.rsp);
  EXPECT_EQ(r.rip, kAt.value + 3);
  r.rip = kAt.value;
  r.rbx = 0;
  ASSERT_TRUE(EmulateProbedInsn(Analyze({0x5b}), r, m).ok());  // pop %rbx
  EXPECT_EQ(r.rbx, 0x1111u);
  EXPECT_EQ(r.rsp, 0x7ffc0000u);
  // mov %edi,%eax zero-extends; mov $imm32,%eax too.
  r.rip = kAt.value;
  r.rax = ~0ULL;
  r.rdi = 0xffffffff80000001ULL;
  ASSERT_TRUE(EmulateProbedInsn(Analyze({0x89, 0xf8}), r, m).ok());
  EXPECT_EQ(r.rax, 0x80000001u);
  r.rip = kAt.value;
  ASSERT_TRUE(EmulateProbedInsn(Analyze({0x48, 0xc7, 0xc0, 0xff, 0xff, 0xff, 0xff}), r, m).ok());
  EXPECT_EQ(r.rax, ~0ULL);  // mov $-1,%rax sign-extends its imm32
}

TEST(InsnEmulate, LeaComputesAddressesWithoutMemory) {
  FakeMemory mem;
  mem.fail = true;
  auto m = mem.Callbacks();
  user_regs_struct r = Regs();
  r.rdi = 10;
  r.rsi = 3;
  ASSERT_TRUE(EmulateProbedInsn(Analyze({0x48, 0x8d, 0x44, 0x77, 0x05}), r, m).ok());
  EXPECT_EQ(r.rax, 10u + 3 * 2 + 5);  // lea 5(%rdi,%rsi,2),%rax
  r.rip = kAt.value;
  ASSERT_TRUE(EmulateProbedInsn(Analyze({0x48, 0x8d, 0x05, 0x10, 0x00, 0x00, 0x00}), r, m).ok());
  EXPECT_EQ(r.rax, kAt.value + 7 + 0x10);  // lea 0x10(%rip),%rax
}

// Flags of `a OP b` computed by this CPU.
uint64_t HostFlags(bool sub, bool wide, uint64_t a, uint64_t b, uint64_t* result) {
  uint64_t flags = 0;
  uint64_t r = a;
  if (sub && wide) {
    __asm__("sub %2, %0\n\tlea -128(%%rsp), %%rsp\n\tpushfq\n\tpop %1\n\tlea 128(%%rsp), %%rsp"
            : "+r"(r), "=r"(flags)
            : "r"(b)
            : "cc");
  } else if (!sub && wide) {
    __asm__("add %2, %0\n\tlea -128(%%rsp), %%rsp\n\tpushfq\n\tpop %1\n\tlea 128(%%rsp), %%rsp"
            : "+r"(r), "=r"(flags)
            : "r"(b)
            : "cc");
  } else {
    auto r32 = static_cast<uint32_t>(a);
    const auto b32 = static_cast<uint32_t>(b);
    if (sub) {
      __asm__("sub %2, %0\n\tlea -128(%%rsp), %%rsp\n\tpushfq\n\tpop %1\n\tlea 128(%%rsp), %%rsp"
              : "+r"(r32), "=r"(flags)
              : "r"(b32)
              : "cc");
    } else {
      __asm__("add %2, %0\n\tlea -128(%%rsp), %%rsp\n\tpushfq\n\tpop %1\n\tlea 128(%%rsp), %%rsp"
              : "+r"(r32), "=r"(flags)
              : "r"(b32)
              : "cc");
    }
    r = r32;
  }
  *result = r;
  return flags & kStatusFlags;
}

TEST(InsnEmulate, AddSubFlagsMatchTheCpu) {
  FakeMemory mem;
  auto m = mem.Callbacks();
  const std::vector<uint64_t> values = {0,
                                        1,
                                        0x7f,
                                        0x80,
                                        0xff,
                                        0x7fffffff,
                                        0x80000000,
                                        0xffffffff,
                                        0x7fffffffffffffffULL,
                                        0x8000000000000000ULL,
                                        ~0ULL,
                                        0x123456789abcdef0ULL};
  // imm8 forms: 48 83 /0 (add) and /5 (sub) on %rax; 83 /0 and /5 on %eax.
  const std::vector<int8_t> imms = {0, 1, -1, 0x7f, -0x80, 0x10};
  for (const bool sub : {false, true}) {
    for (const bool wide : {true, false}) {
      for (const uint64_t a : values) {
        for (const int8_t imm : imms) {
          std::vector<uint8_t> code;
          if (wide) {
            code.push_back(0x48);
          }
          code.insert(code.end(),
                      {0x83, static_cast<uint8_t>(sub ? 0xe8 : 0xc0), static_cast<uint8_t>(imm)});
          user_regs_struct r = Regs();
          r.rax = a;
          r.eflags = 0x202 | kStatusFlags;  // every status flag set before
          ASSERT_TRUE(EmulateProbedInsn(Analyze(code), r, m).ok());
          uint64_t expect = 0;
          const uint64_t flags =
              HostFlags(sub, wide, a, static_cast<uint64_t>(static_cast<int64_t>(imm)), &expect);
          EXPECT_EQ(r.rax, expect)
              << absl::StrFormat("%s%d %#x %d", sub ? "sub" : "add", wide ? 64 : 32, a, imm);
          EXPECT_EQ(r.eflags & kStatusFlags, flags)
              << absl::StrFormat("%s%d %#x %d", sub ? "sub" : "add", wide ? 64 : 32, a, imm);
          EXPECT_EQ(r.eflags & ~kStatusFlags, 0x202u);
        }
      }
    }
  }
}

// Whether this CPU takes jcc with condition code `cc` (0..15) under `flags`.
bool HostTakes(int cc, uint64_t flags) {
  uint8_t taken = 0;
#define KW_SETCC(n, insn)                                                                        \
  case n:                                                                                        \
    __asm__("lea -128(%%rsp), %%rsp\n\tpush %1\n\tpopfq\n\t" insn " %0\n\tlea 128(%%rsp), %%rsp" \
            : "=r"(taken)                                                                        \
            : "r"(flags)                                                                         \
            : "cc", "memory");                                                                   \
    break;
  switch (cc) {
    KW_SETCC(0, "seto")
    KW_SETCC(1, "setno")
    KW_SETCC(2, "setb")
    KW_SETCC(3, "setae")
    KW_SETCC(4, "sete")
    KW_SETCC(5, "setne")
    KW_SETCC(6, "setbe")
    KW_SETCC(7, "seta")
    KW_SETCC(8, "sets")
    KW_SETCC(9, "setns")
    KW_SETCC(10, "setp")
    KW_SETCC(11, "setnp")
    KW_SETCC(12, "setl")
    KW_SETCC(13, "setge")
    KW_SETCC(14, "setle")
    KW_SETCC(15, "setg")
    default:
      break;
  }
#undef KW_SETCC
  return taken != 0;
}

TEST(InsnEmulate, ConditionalJumpsFollowTheFlagsLikeTheCpu) {
  FakeMemory mem;
  auto m = mem.Callbacks();
  for (int cc = 0; cc < 16; ++cc) {
    const ProbedInsn jcc = Analyze({static_cast<uint8_t>(0x70 + cc), 0x10});  // jcc +0x10
    for (uint64_t bits = 0; bits < 64; ++bits) {
      // Every combination of CF PF AF ZF SF OF.
      const uint64_t flags = 0x202 | ((bits & 1) ? 0x1 : 0) | ((bits & 2) ? 0x4 : 0) |
                             ((bits & 4) ? 0x10 : 0) | ((bits & 8) ? 0x40 : 0) |
                             ((bits & 16) ? 0x80 : 0) | ((bits & 32) ? 0x800 : 0);
      user_regs_struct r = Regs();
      r.eflags = flags;
      ASSERT_TRUE(EmulateProbedInsn(jcc, r, m).ok());
      const bool taken = HostTakes(cc, flags);
      EXPECT_EQ(r.rip, kAt.value + 2 + (taken ? 0x10 : 0))
          << jcc.text << absl::StrFormat(" flags %#x", flags);
      EXPECT_EQ(ConditionHolds(jcc, r), taken);
    }
  }
}

TEST(InsnEmulate, LoopAndJrcxz) {
  FakeMemory mem;
  auto m = mem.Callbacks();
  user_regs_struct r = Regs();
  r.rcx = 2;
  const ProbedInsn loop = Analyze({0xe2, 0xfe});  // loop to itself
  ASSERT_TRUE(EmulateProbedInsn(loop, r, m).ok());
  EXPECT_EQ(r.rcx, 1u);
  EXPECT_EQ(r.rip, kAt.value);  // taken
  ASSERT_TRUE(EmulateProbedInsn(loop, r, m).ok());
  EXPECT_EQ(r.rcx, 0u);
  EXPECT_EQ(r.rip, kAt.value + 2);  // falls through at zero
  r.rip = kAt.value;
  ASSERT_TRUE(EmulateProbedInsn(Analyze({0xe3, 0x20}), r, m).ok());  // jrcxz
  EXPECT_EQ(r.rip, kAt.value + 2 + 0x20);
}

TEST(InsnEmulate, CallAndRetUseTheStack) {
  FakeMemory mem;
  auto m = mem.Callbacks();
  user_regs_struct r = Regs();
  ASSERT_TRUE(EmulateProbedInsn(Analyze({0xe8, 0x00, 0x01, 0x00, 0x00}), r, m).ok());
  EXPECT_EQ(r.rip, kAt.value + 5 + 0x100);
  EXPECT_EQ(r.rsp, 0x7ffc0000u - 8);
  EXPECT_EQ(mem.Word(r.rsp), kAt.value + 5);
  r.rip = kAt.value;
  ASSERT_TRUE(EmulateProbedInsn(Analyze({0xc3}), r, m).ok());
  EXPECT_EQ(r.rip, kAt.value + 5);
  EXPECT_EQ(r.rsp, 0x7ffc0000u);
  // ret $16 pops 16 more bytes.
  mem.SetWord(r.rsp, 0xabcdef);
  r.rip = kAt.value;
  ASSERT_TRUE(EmulateProbedInsn(Analyze({0xc2, 0x10, 0x00}), r, m).ok());
  EXPECT_EQ(r.rip, 0xabcdefu);
  EXPECT_EQ(r.rsp, 0x7ffc0000u + 8 + 16);
}

TEST(InsnEmulate, IndirectCallsAndJumps) {
  FakeMemory mem;
  auto m = mem.Callbacks();
  user_regs_struct r = Regs();
  r.rax = 0x500000;
  ASSERT_TRUE(EmulateProbedInsn(Analyze({0xff, 0xd0}), r, m).ok());  // call *%rax
  EXPECT_EQ(r.rip, 0x500000u);
  EXPECT_EQ(mem.Word(r.rsp), kAt.value + 2);
  // call *0x10(%rip): the pointer at addr + 6 + 0x10.
  mem.SetWord(kAt.value + 6 + 0x10, 0x600000);
  r = Regs();
  ASSERT_TRUE(EmulateProbedInsn(Analyze({0xff, 0x15, 0x10, 0x00, 0x00, 0x00}), r, m).ok());
  EXPECT_EQ(r.rip, 0x600000u);
  EXPECT_EQ(mem.Word(r.rsp), kAt.value + 6);
  // jmp *%fs:0x28 adds the fs base.
  r = Regs();
  r.fs_base = 0x7000000;
  mem.SetWord(0x7000028, 0x700000);
  ASSERT_TRUE(
      EmulateProbedInsn(Analyze({0x64, 0xff, 0x24, 0x25, 0x28, 0x00, 0x00, 0x00}), r, m).ok());
  EXPECT_EQ(r.rip, 0x700000u);
  EXPECT_EQ(r.rsp, 0x7ffc0000u);
}

TEST(InsnEmulate, FailedAccessLeavesRegistersUnchanged) {
  FakeMemory mem;
  mem.fail = true;
  auto m = mem.Callbacks();
  const user_regs_struct before = Regs();
  for (const std::vector<uint8_t>& code : std::vector<std::vector<uint8_t>>{
           {0x55}, {0x5d}, {0xe8, 0, 0, 0, 0}, {0xc3}, {0xff, 0x10}}) {
    user_regs_struct r = before;
    EXPECT_FALSE(EmulateProbedInsn(Analyze(code), r, m).ok());
    EXPECT_EQ(std::memcmp(&r, &before, sizeof(r)), 0);
  }
  user_regs_struct r = before;
  const ProbedInsn other = Analyze({0x0f, 0x05});  // syscall: not emulated
  EXPECT_EQ(EmulateProbedInsn(other, r, m).code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace kwatch::core::probe
