#include "core/x86/x86_emulate.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/ptrace.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "core/base/unique_fd.h"
#include "tests/test_util.h"

namespace kwatch::core::x86 {
namespace {

// Byte sequences below were assembled with GNU as and checked with objdump; the comment on
// each gives the AT&T disassembly.

constexpr uint64_t kRip = 0x401000;

// A sparse byte-addressed memory. Reads and writes touching an unmapped byte fail without
// changing anything.
class FakeMemory {
 public:
  void Map(uint64_t addr, std::vector<uint8_t> bytes) {
    for (size_t i = 0; i < bytes.size(); ++i) {
      bytes_[addr + i] = bytes[i];
    }
  }
  void Fill(uint64_t addr, size_t n, uint8_t v) { Map(addr, std::vector<uint8_t>(n, v)); }

  std::vector<uint8_t> Get(uint64_t addr, size_t n) const {
    std::vector<uint8_t> out;
    for (size_t i = 0; i < n; ++i) {
      auto it = bytes_.find(addr + i);
      out.push_back(it == bytes_.end() ? 0 : it->second);
    }
    return out;
  }

  EmulatorMemory Callbacks() {
    EmulatorMemory m;
    m.read = [this](uint64_t addr, std::span<uint8_t> out) -> absl::Status {
      ++calls_;
      for (size_t i = 0; i < out.size(); ++i) {
        auto it = bytes_.find(addr + i);
        if (it == bytes_.end()) {
          return absl::OutOfRangeError(absl::StrFormat("unmapped read at 0x%x", addr + i));
        }
        out[i] = it->second;
      }
      return absl::OkStatus();
    };
    m.write = [this](uint64_t addr, std::span<const uint8_t> data) -> absl::Status {
      ++calls_;
      for (size_t i = 0; i < data.size(); ++i) {
        if (!bytes_.contains(addr + i)) {
          return absl::OutOfRangeError(absl::StrFormat("unmapped write at 0x%x", addr + i));
        }
      }
      for (size_t i = 0; i < data.size(); ++i) {
        bytes_[addr + i] = data[i];
      }
      return absl::OkStatus();
    };
    return m;
  }

  int calls() const { return calls_; }
  const std::map<uint64_t, uint8_t>& bytes() const { return bytes_; }

 private:
  std::map<uint64_t, uint8_t> bytes_;
  int calls_ = 0;
};

// Distinct recognisable values in every register.
user_regs_struct BaseRegs() {
  user_regs_struct r{};
  r.rax = 0xa0a0a0a0a0a0a0a0;
  r.rbx = 0xb0b0b0b0b0b0b0b0;
  r.rcx = 0xc0c0c0c0c0c0c0c0;
  r.rdx = 0xd0d0d0d0d0d0d0d0;
  r.rsi = 0x5151515151515151;
  r.rdi = 0xd1d1d1d1d1d1d1d1;
  r.rbp = 0xbbbbbbbbbbbbbbbb;
  r.rsp = 0x7ffc00001000;
  r.r8 = 0x0808080808080808;
  r.r9 = 0x0909090909090909;
  r.r10 = 0x1010101010101010;
  r.r11 = 0x1111111111111111;
  r.r12 = 0x1212121212121212;
  r.r13 = 0x1313131313131313;
  r.r14 = 0x1414141414141414;
  r.r15 = 0x1515151515151515;
  r.rip = kRip;
  r.eflags = 0x246;
  r.fs_base = 0x7f0000100000;
  r.gs_base = 0x7f0000200000;
  return r;
}

bool SameRegs(const user_regs_struct& a, const user_regs_struct& b) {
  return std::memcmp(&a, &b, sizeof(a)) == 0;
}

// Runs the emulator as a fault handler would: 15 bytes read at rip, the tail being whatever
// follows the instruction.
absl::StatusOr<std::optional<EmulatedAccess>> Emulate(std::vector<uint8_t> code,
                                                      user_regs_struct& regs, FakeMemory& mem) {
  code.resize(15, 0xcc);
  const EmulatorMemory cb = mem.Callbacks();
  return EmulateDataMove(code, regs, cb);
}

// Emulates `code`, expecting success; checks the access and that only the registers in
// `expected` differ (rip advanced by the length).
void ExpectEmulated(const std::vector<uint8_t>& code, user_regs_struct& regs, FakeMemory& mem,
                    uint64_t addr, uint32_t size, bool write) {
  const user_regs_struct before = regs;
  auto r = Emulate(code, regs, mem);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->has_value()) << "refused";
  const EmulatedAccess& a = **r;
  EXPECT_EQ(a.addr, addr);
  EXPECT_EQ(a.size, size);
  EXPECT_EQ(a.write, write);
  EXPECT_EQ(a.length, code.size());
  EXPECT_EQ(regs.rip, before.rip + code.size());
  EXPECT_EQ(regs.eflags, before.eflags);
}

// ---------------------------------------------------------------------------------------------
// Stores from registers

struct StoreCase {
  const char* name;
  std::vector<uint8_t> code;
  std::vector<uint8_t> expected;  // bytes at the destination, then one untouched 0xee byte
};

TEST(EmulateDataMove, StoresFromRegisters) {
  const std::vector<StoreCase> cases = {
      // movq %rcx, 0x10(%rax)
      {"movq", {0x48, 0x89, 0x48, 0x10}, {0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11, 0xee}},
      // movl %ecx, 0x10(%rax)
      {"movl", {0x89, 0x48, 0x10}, {0x88, 0x77, 0x66, 0x55, 0xee}},
      // movw %cx, 0x10(%rax)
      {"movw", {0x66, 0x89, 0x48, 0x10}, {0x88, 0x77, 0xee}},
      // movb %cl, 0x10(%rax)
      {"movb", {0x88, 0x48, 0x10}, {0x88, 0xee}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    FakeMemory mem;
    mem.Fill(0x10010, 9, 0xee);
    user_regs_struct regs = BaseRegs();
    regs.rax = 0x10000;
    regs.rcx = 0x1122334455667788;
    user_regs_struct want = regs;
    ExpectEmulated(c.code, regs, mem, 0x10010, c.expected.size() - 1, true);
    EXPECT_EQ(mem.Get(0x10010, c.expected.size()), c.expected);
    want.rip += c.code.size();
    EXPECT_TRUE(SameRegs(regs, want));
  }
}

TEST(EmulateDataMove, StoresHighByteAndExtendedRegisters) {
  const std::vector<StoreCase> cases = {
      // movb %ah, (%rbx)
      {"ah", {0x88, 0x23}, {0xbe, 0xee}},
      // movb %r9b, (%rbx)
      {"r9b", {0x44, 0x88, 0x0b}, {0x08, 0xee}},
      // movw %r9w, (%rbx)
      {"r9w", {0x66, 0x44, 0x89, 0x0b}, {0x08, 0x07, 0xee}},
      // movl %r9d, (%rbx)
      {"r9d", {0x44, 0x89, 0x0b}, {0x08, 0x07, 0x06, 0x05, 0xee}},
      // movq %r9, (%rbx)
      {"r9", {0x4c, 0x89, 0x0b}, {0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01, 0xee}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    FakeMemory mem;
    mem.Fill(0x20000, 9, 0xee);
    user_regs_struct regs = BaseRegs();
    regs.rax = 0xdeadbeef;
    regs.rbx = 0x20000;
    regs.r9 = 0x0102030405060708;
    ExpectEmulated(c.code, regs, mem, 0x20000, c.expected.size() - 1, true);
    EXPECT_EQ(mem.Get(0x20000, c.expected.size()), c.expected);
  }
}

TEST(EmulateDataMove, StoresImmediates) {
  const std::vector<StoreCase> cases = {
      // movb $0x80, (%rbx)
      {"byte", {0xc6, 0x03, 0x80}, {0x80, 0xee}},
      // movw $0x8001, (%rbx)
      {"word", {0x66, 0xc7, 0x03, 0x01, 0x80}, {0x01, 0x80, 0xee}},
      // movl $0x89abcdef, (%rbx)
      {"dword", {0xc7, 0x03, 0xef, 0xcd, 0xab, 0x89}, {0xef, 0xcd, 0xab, 0x89, 0xee}},
      // movq $-2, (%rbx): imm32 sign-extended to 64 bits
      {"qword negative",
       {0x48, 0xc7, 0x03, 0xfe, 0xff, 0xff, 0xff},
       {0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xee}},
      // movq $0x7fffffff, (%rbx)
      {"qword positive",
       {0x48, 0xc7, 0x03, 0xff, 0xff, 0xff, 0x7f},
       {0xff, 0xff, 0xff, 0x7f, 0x00, 0x00, 0x00, 0x00, 0xee}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    FakeMemory mem;
    mem.Fill(0x20000, 9, 0xee);
    user_regs_struct regs = BaseRegs();
    regs.rbx = 0x20000;
    user_regs_struct want = regs;
    ExpectEmulated(c.code, regs, mem, 0x20000, c.expected.size() - 1, true);
    EXPECT_EQ(mem.Get(0x20000, c.expected.size()), c.expected);
    want.rip += c.code.size();
    EXPECT_TRUE(SameRegs(regs, want));
  }
}

// ---------------------------------------------------------------------------------------------
// Loads

struct LoadCase {
  const char* name;
  std::vector<uint8_t> code;
  unsigned long long user_regs_struct::*reg;  // NOLINT(google-runtime-int)
  uint64_t before;
  uint64_t after;
  uint32_t size;
};

TEST(EmulateDataMove, Loads) {
  using R = user_regs_struct;
  const std::vector<LoadCase> cases = {
      // movq (%rbx), %rax
      {"movq", {0x48, 0x8b, 0x03}, &R::rax, 0x1111111111111111, 0xf7e6d5c4b3a29180, 8},
      // movl (%rbx), %eax: zero-extends
      {"movl", {0x8b, 0x03}, &R::rax, 0xffffffffffffffff, 0x00000000b3a29180, 4},
      // movw (%rbx), %ax: keeps bits 16..63
      {"movw", {0x66, 0x8b, 0x03}, &R::rax, 0x1111111111111111, 0x1111111111119180, 2},
      // movb (%rbx), %al
      {"movb al", {0x8a, 0x03}, &R::rax, 0x1111111111111111, 0x1111111111111180, 1},
      // movb (%rbx), %ah: bits 8..15
      {"movb ah", {0x8a, 0x23}, &R::rax, 0x1111111111111111, 0x1111111111118011, 1},
      // movb (%rbx), %r10b
      {"movb r10b", {0x44, 0x8a, 0x13}, &R::r10, 0x2222222222222222, 0x2222222222222280, 1},
      // movzbl (%rbx), %eax
      {"movzbl", {0x0f, 0xb6, 0x03}, &R::rax, 0xffffffffffffffff, 0x80, 1},
      // movzwl (%rbx), %eax
      {"movzwl", {0x0f, 0xb7, 0x03}, &R::rax, 0xffffffffffffffff, 0x9180, 2},
      // movzbl (%rbx), %r15d
      {"movzbl r15d", {0x44, 0x0f, 0xb6, 0x3b}, &R::r15, 0xffffffffffffffff, 0x80, 1},
      // movsbq (%rbx), %rax
      {"movsbq", {0x48, 0x0f, 0xbe, 0x03}, &R::rax, 0, 0xffffffffffffff80, 1},
      // movsbw (%rbx), %ax: 16-bit destination keeps bits 16..63
      {"movsbw", {0x66, 0x0f, 0xbe, 0x03}, &R::rax, 0x1111111111111111, 0x111111111111ff80, 1},
      // movswl (%rbx), %eax: sign-extends to 32, zero-extends to 64
      {"movswl", {0x0f, 0xbf, 0x03}, &R::rax, 0x1234567812345678, 0x00000000ffff9180, 2},
      // movslq (%rbx), %rax
      {"movslq", {0x48, 0x63, 0x03}, &R::rax, 0, 0xffffffffb3a29180, 4},
      // movslq (%rbx), %rcx
      {"movslq rcx", {0x48, 0x63, 0x0b}, &R::rcx, 0, 0xffffffffb3a29180, 4},
      // movsxd (%rbx), %ecx (no REX.W: a 32-bit move)
      {"movsxd r32", {0x63, 0x0b}, &R::rcx, 0xffffffffffffffff, 0x00000000b3a29180, 4},
      // movq (%rbx), %rsp: explicit rsp destination
      {"movq rsp", {0x48, 0x8b, 0x23}, &R::rsp, 0x7ffc00001000, 0xf7e6d5c4b3a29180, 8},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    FakeMemory mem;
    mem.Map(0x20000, {0x80, 0x91, 0xa2, 0xb3, 0xc4, 0xd5, 0xe6, 0xf7});
    const auto snapshot = mem.bytes();
    user_regs_struct regs = BaseRegs();
    regs.rbx = 0x20000;
    regs.*c.reg = c.before;
    user_regs_struct want = regs;
    want.*c.reg = c.after;
    want.rip += c.code.size();
    ExpectEmulated(c.code, regs, mem, 0x20000, c.size, false);
    EXPECT_EQ(regs.*c.reg, c.after) << std::hex << regs.*c.reg;
    EXPECT_TRUE(SameRegs(regs, want));
    EXPECT_EQ(mem.bytes(), snapshot);
  }
}

TEST(EmulateDataMove, SignExtensionOfPositiveValues) {
  FakeMemory mem;
  mem.Map(0x20000, {0x7f, 0x7f, 0x7f, 0x7f});
  user_regs_struct regs = BaseRegs();
  regs.rbx = 0x20000;
  // movsbq (%rbx), %rax
  ExpectEmulated({0x48, 0x0f, 0xbe, 0x03}, regs, mem, 0x20000, 1, false);
  EXPECT_EQ(regs.rax, 0x7fU);
  // movslq (%rbx), %rax
  ExpectEmulated({0x48, 0x63, 0x03}, regs, mem, 0x20000, 4, false);
  EXPECT_EQ(regs.rax, 0x7f7f7f7fU);
}

// ---------------------------------------------------------------------------------------------
// Addressing

TEST(EmulateDataMove, RipRelativeLoad) {
  FakeMemory mem;
  const uint64_t ea = kRip + 7 + 0x100;
  mem.Map(ea, {1, 2, 3, 4, 5, 6, 7, 8});
  user_regs_struct regs = BaseRegs();
  // movq 0x100(%rip), %rax
  ExpectEmulated({0x48, 0x8b, 0x05, 0x00, 0x01, 0x00, 0x00}, regs, mem, ea, 8, false);
  EXPECT_EQ(regs.rax, 0x0807060504030201U);
}

TEST(EmulateDataMove, RipRelativeStoreWithNegativeDisplacement) {
  FakeMemory mem;
  const uint64_t ea = kRip + 6 - 0x20;
  mem.Fill(ea, 4, 0);
  user_regs_struct regs = BaseRegs();
  regs.rdx = 0xcafef00d;
  // movl %edx, -0x20(%rip)
  ExpectEmulated({0x89, 0x15, 0xe0, 0xff, 0xff, 0xff}, regs, mem, ea, 4, true);
  EXPECT_EQ(mem.Get(ea, 4), (std::vector<uint8_t>{0x0d, 0xf0, 0xfe, 0xca}));
}

TEST(EmulateDataMove, BaseIndexScaleDisplacement) {
  FakeMemory mem;
  mem.Fill(0x20014, 8, 0);
  user_regs_struct regs = BaseRegs();
  regs.rbx = 0x20000;
  regs.rcx = 3;
  regs.rdx = 0x0123456789abcdef;
  // movq %rdx, 0x8(%rbx,%rcx,4): 0x20000 + 12 + 8
  ExpectEmulated({0x48, 0x89, 0x54, 0x8b, 0x08}, regs, mem, 0x20014, 8, true);
  EXPECT_EQ(mem.Get(0x20014, 8),
            (std::vector<uint8_t>{0xef, 0xcd, 0xab, 0x89, 0x67, 0x45, 0x23, 0x01}));

  mem.Map(0x30000, {0xaa, 0xbb, 0xcc, 0xdd});
  regs.rsi = 0x30000;
  regs.rdi = 2;
  // movl -0x10(%rsi,%rdi,8), %r11d: 0x30000 + 16 - 16
  ExpectEmulated({0x44, 0x8b, 0x5c, 0xfe, 0xf0}, regs, mem, 0x30000, 4, false);
  EXPECT_EQ(regs.r11, 0xddccbbaaU);
}

TEST(EmulateDataMove, FsAndGsRelative) {
  FakeMemory mem;
  user_regs_struct regs = BaseRegs();
  mem.Map(regs.fs_base + 0x28, {0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88});
  // movq %fs:0x28, %rax
  ExpectEmulated({0x64, 0x48, 0x8b, 0x04, 0x25, 0x28, 0x00, 0x00, 0x00}, regs, mem,
                 regs.fs_base + 0x28, 8, false);
  EXPECT_EQ(regs.rax, 0x8877665544332211U);

  regs.rbx = 0x100;
  mem.Fill(regs.gs_base + 0x110, 4, 0);
  // movl %eax, %gs:0x10(%rbx)
  ExpectEmulated({0x65, 0x89, 0x43, 0x10}, regs, mem, regs.gs_base + 0x110, 4, true);
  EXPECT_EQ(mem.Get(regs.gs_base + 0x110, 4), (std::vector<uint8_t>{0x11, 0x22, 0x33, 0x44}));
}

TEST(EmulateDataMove, MoffsForms) {
  FakeMemory mem;
  const uint64_t moffs = 0x1122334455667788;
  mem.Map(moffs, {0x01, 0x02, 0x03, 0x04});
  user_regs_struct regs = BaseRegs();
  // movabs 0x1122334455667788, %eax
  ExpectEmulated({0xa1, 0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11}, regs, mem, moffs, 4,
                 false);
  EXPECT_EQ(regs.rax, 0x04030201U);
  regs.rax = 0x5a;
  // movabs %al, 0x1122334455667788
  ExpectEmulated({0xa2, 0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11}, regs, mem, moffs, 1, true);
  EXPECT_EQ(mem.Get(moffs, 2), (std::vector<uint8_t>{0x5a, 0x02}));
}

TEST(EmulateDataMove, Addr32WrapsAt4GiB) {
  FakeMemory mem;
  mem.Map(0x1000, {0x44, 0x33, 0x22, 0x11});
  mem.Map(0x8, {0x88, 0x77, 0x66, 0x55});
  user_regs_struct regs = BaseRegs();
  regs.rax = 0xdead00001000;
  // movl (%eax), %ecx
  ExpectEmulated({0x67, 0x8b, 0x08}, regs, mem, 0x1000, 4, false);
  EXPECT_EQ(regs.rcx, 0x11223344U);
  regs.rax = 0xfffffff8;
  // movl 0x10(%eax), %ecx
  ExpectEmulated({0x67, 0x8b, 0x48, 0x10}, regs, mem, 0x8, 4, false);
  EXPECT_EQ(regs.rcx, 0x55667788U);
}

TEST(EmulateDataMove, AddressUsesRegistersBeforeTheLoad) {
  FakeMemory mem;
  mem.Map(0x20000, {1, 0, 0, 0, 0, 0, 0, 0});
  user_regs_struct regs = BaseRegs();
  regs.rbx = 0x20000;
  // movq (%rbx), %rbx
  ExpectEmulated({0x48, 0x8b, 0x1b}, regs, mem, 0x20000, 8, false);
  EXPECT_EQ(regs.rbx, 1U);
}

// ---------------------------------------------------------------------------------------------
// Refusals

TEST(EmulateDataMove, RefusesEverythingElseWithoutSideEffects) {
  const std::vector<std::pair<const char*, std::vector<uint8_t>>> cases = {
      {"lock addl $1, (%rbx)", {0xf0, 0x83, 0x03, 0x01}},
      {"xchg %rax, (%rbx)", {0x48, 0x87, 0x03}},
      {"rep movsb", {0xf3, 0xa4}},
      {"push %rax", {0x50}},
      {"pop (%rbx)", {0x8f, 0x03}},
      {"add %rax, (%rbx)", {0x48, 0x01, 0x03}},
      {"vmovdqu (%rbx), %ymm0", {0xc5, 0xfe, 0x6f, 0x03}},
      {"mov %rax, %rbx", {0x48, 0x89, 0xc3}},
      {"movabs $1, %rax", {0x48, 0xb8, 0x01, 0, 0, 0, 0, 0, 0, 0}},
      {"lea (%rbx), %rax", {0x48, 0x8d, 0x03}},
      {"mov %ds, (%rbx)", {0x8c, 0x1b}},
      {"mov (%rbx), %ds", {0x8e, 0x1b}},
      {"ds mov (%rbx), %rax", {0x3e, 0x48, 0x8b, 0x03}},
      {"cs mov (%rbx), %eax", {0x2e, 0x8b, 0x03}},
      {"xrelease mov %eax, (%rbx)", {0xf3, 0x89, 0x03}},
  };
  for (const auto& [name, code] : cases) {
    SCOPED_TRACE(name);
    FakeMemory mem;
    mem.Fill(0x20000, 16, 0x77);
    const auto snapshot = mem.bytes();
    user_regs_struct regs = BaseRegs();
    regs.rbx = 0x20000;
    regs.rsi = 0x20000;
    regs.rdi = 0x20008;
    regs.rcx = 4;
    const user_regs_struct before = regs;
    auto r = Emulate(code, regs, mem);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_FALSE(r->has_value());
    EXPECT_TRUE(SameRegs(regs, before));
    EXPECT_EQ(mem.calls(), 0);
    EXPECT_EQ(mem.bytes(), snapshot);
  }
}

TEST(EmulateDataMove, RefusesTruncatedAndEmptyCode) {
  FakeMemory mem;
  user_regs_struct regs = BaseRegs();
  const user_regs_struct before = regs;
  const EmulatorMemory cb = mem.Callbacks();
  const std::vector<uint8_t> truncated = {0x48, 0x8b};  // movq (...) without its ModRM
  auto r = EmulateDataMove(truncated, regs, cb);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->has_value());
  r = EmulateDataMove({}, regs, cb);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->has_value());
  EXPECT_TRUE(SameRegs(regs, before));
  EXPECT_EQ(mem.calls(), 0);
}

TEST(EmulateDataMove, CallbackErrorLeavesRegistersUnchanged) {
  FakeMemory mem;  // nothing mapped
  user_regs_struct regs = BaseRegs();
  regs.rbx = 0x20000;
  const user_regs_struct before = regs;
  // movq (%rbx), %rax
  auto r = Emulate({0x48, 0x8b, 0x03}, regs, mem);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_TRUE(SameRegs(regs, before));
  // movq %rax, (%rbx)
  r = Emulate({0x48, 0x89, 0x03}, regs, mem);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_TRUE(SameRegs(regs, before));
  EXPECT_EQ(mem.calls(), 2);
}

// ---------------------------------------------------------------------------------------------
// Live: a traced child faults on a PROT_NONE page; the tracer emulates each access through
// /proc/PID/mem and the child never sees the fault.

constexpr int kTracemeRefused = 77;

// The `data` argument of ptrace requests that take an integer.
void* PtraceData(int v) {
  // NOLINTNEXTLINE(performance-no-int-to-ptr): ptrace's ABI passes integers as pointers.
  return reinterpret_cast<void*>(static_cast<uintptr_t>(v));
}

[[noreturn]] void FaultingChild() {
  if (ptrace(PTRACE_TRACEME, 0, nullptr, nullptr) != 0) {
    _exit(kTracemeRefused);
  }
  raise(SIGSTOP);
  void* page = mmap(nullptr, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (page == MAP_FAILED) {
    _exit(2);
  }
  const uint64_t value = 0x1122334455667788;
  uint64_t loaded = 0;
  asm volatile("movq %1, 8(%0)" : : "r"(page), "r"(value) : "memory");
  asm volatile("movq 8(%1), %0" : "=r"(loaded) : "r"(page) : "memory");
  asm volatile("movb $0x5a, 3(%0)" : : "r"(page) : "memory");
  if (mprotect(page, 4096, PROT_READ) != 0) {
    _exit(3);
  }
  const auto* bytes = static_cast<const volatile uint8_t*>(page);
  uint64_t stored = 0;
  for (int i = 0; i < 8; ++i) {
    stored |= uint64_t{bytes[8 + i]} << (8 * i);
  }
  _exit(loaded == value && stored == value && bytes[3] == 0x5a ? 0 : 1);
}

TEST(EmulateDataMoveLive, EmulatesFaultsOnProtectedPage) {
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    FaultingChild();
  }
  bool reaped = false;
  absl::Cleanup kill_child = [&] {
    if (!reaped) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  };
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  reaped = WIFEXITED(status) || WIFSIGNALED(status);
  if (WIFEXITED(status) && WEXITSTATUS(status) == kTracemeRefused) {
    KW_REQUIRE_FEATURE(false, "ptrace(PTRACE_TRACEME) refused");
  }
  ASSERT_TRUE(WIFSTOPPED(status) && WSTOPSIG(status) == SIGSTOP);
  ASSERT_EQ(ptrace(PTRACE_SETOPTIONS, pid, nullptr, PtraceData(PTRACE_O_EXITKILL)), 0);
  const std::string mem_path = absl::StrFormat("/proc/%d/mem", pid);
  UniqueFd mem_fd(open(mem_path.c_str(), O_RDWR | O_CLOEXEC));
  ASSERT_TRUE(mem_fd.valid()) << mem_path << ": errno " << errno;

  EmulatorMemory mem;
  mem.read = [&](uint64_t addr, std::span<uint8_t> out) -> absl::Status {
    const ssize_t n = pread(mem_fd.get(), out.data(), out.size(), static_cast<off_t>(addr));
    if (n != static_cast<ssize_t>(out.size())) {
      return absl::ErrnoToStatus(errno, "pread(/proc/PID/mem)");
    }
    return absl::OkStatus();
  };
  mem.write = [&](uint64_t addr, std::span<const uint8_t> data) -> absl::Status {
    const ssize_t n = pwrite(mem_fd.get(), data.data(), data.size(), static_cast<off_t>(addr));
    if (n != static_cast<ssize_t>(data.size())) {
      return absl::ErrnoToStatus(errno, "pwrite(/proc/PID/mem)");
    }
    return absl::OkStatus();
  };

  std::vector<EmulatedAccess> accesses;
  std::vector<uint64_t> fault_addrs;
  int sig = 0;
  for (int round = 0; round < 10; ++round) {
    ASSERT_EQ(ptrace(PTRACE_CONT, pid, nullptr, PtraceData(sig)), 0);
    sig = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    reaped = WIFEXITED(status) || WIFSIGNALED(status);
    if (!WIFSTOPPED(status)) {
      break;
    }
    if (WSTOPSIG(status) != SIGSEGV) {
      sig = WSTOPSIG(status);
      continue;
    }
    siginfo_t si{};
    ASSERT_EQ(ptrace(PTRACE_GETSIGINFO, pid, nullptr, &si), 0);
    user_regs_struct regs{};
    ASSERT_EQ(ptrace(PTRACE_GETREGS, pid, nullptr, &regs), 0);
    std::vector<uint8_t> code(15);
    const ssize_t got = pread(mem_fd.get(), code.data(), code.size(), static_cast<off_t>(regs.rip));
    ASSERT_GT(got, 0);
    code.resize(static_cast<size_t>(got));
    auto r = EmulateDataMove(code, regs, mem);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(r->has_value()) << "instruction at 0x" << std::hex << regs.rip << " refused";
    ASSERT_EQ(ptrace(PTRACE_SETREGS, pid, nullptr, &regs), 0);
    accesses.push_back(**r);
    fault_addrs.push_back(reinterpret_cast<uint64_t>(si.si_addr));
  }
  ASSERT_TRUE(WIFEXITED(status)) << "child did not finish; status " << status;
  EXPECT_EQ(WEXITSTATUS(status), 0) << "child saw wrong values";
  ASSERT_EQ(accesses.size(), 3U);
  const std::array<bool, 3> want_write = {true, false, true};
  const std::array<uint32_t, 3> want_size = {8, 8, 1};
  for (size_t i = 0; i < accesses.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(accesses[i].addr, fault_addrs[i]);
    EXPECT_EQ(accesses[i].write, want_write[i]);
    EXPECT_EQ(accesses[i].size, want_size[i]);
  }
  EXPECT_EQ(accesses[0].addr, accesses[1].addr);
  EXPECT_EQ(accesses[2].addr, accesses[0].addr - 5);
}

}  // namespace
}  // namespace kwatch::core::x86
