#include "watch/perf_access.h"

#include <sys/user.h>
#include <unistd.h>

#include <csignal>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "core/symbols/symbolizer.h"
#include "core/symbols/symbols.h"
#include "tests/test_util.h"
#include "tests/watch/debug_traps.h"
#include "watch/perf_breakpoint.h"
#include "watch/perf_util.h"

namespace kwatch::watch {
namespace {

// One function "F" at kStart made of `code`; no lines, no types.
class CodeSymbols : public core::symbols::Symbols {
 public:
  static constexpr uint64_t kStart = 0x401000;
  explicit CodeSymbols(std::vector<uint8_t> code) : code_(std::move(code)) {}

  absl::StatusOr<core::symbols::ResolvedExpr> Resolve(
      const core::symbols::Expr& /*expr*/,
      const core::symbols::MemoryReader& /*read*/) const override {
    return absl::UnimplementedError("no data symbols");
  }
  std::optional<core::symbols::FunctionSymbol> FunctionAt(core::RemoteAddr addr) const override {
    if (addr.value < kStart || addr.value >= kStart + code_.size()) {
      return std::nullopt;
    }
    return core::symbols::FunctionSymbol{"F", core::RemoteAddr{kStart}, code_.size(), "fake"};
  }
  std::optional<core::symbols::SourceLine> LineAt(core::RemoteAddr /*addr*/) const override {
    return std::nullopt;
  }
  absl::Status ReadCode(core::RemoteAddr addr, std::span<uint8_t> out) const override {
    if (addr.value < kStart || addr.value + out.size() > kStart + code_.size()) {
      return absl::OutOfRangeError("outside F");
    }
    std::memcpy(out.data(), code_.data() + (addr.value - kStart), out.size());
    return absl::OkStatus();
  }

 private:
  std::vector<uint8_t> code_;
};

// The general registers as a breakpoint sample carries them (PerfUserRegsMaskGeneral order:
// AX BX CX DX SI DI BP SP IP R8..R15).
std::vector<uint8_t> SampledRegs(const user_regs_struct& r) {
  const uint64_t v[] = {r.rax, r.rbx, r.rcx, r.rdx, r.rsi, r.rdi, r.rbp, r.rsp, r.rip,
                        r.r8,  r.r9,  r.r10, r.r11, r.r12, r.r13, r.r14, r.r15};
  std::vector<uint8_t> out(sizeof(v));
  std::memcpy(out.data(), v, sizeof(v));
  return out;
}

TEST(TrapDecoder, ResolvesStoresLoadsAndRefusalsFromTheRegistersAfterTheAccess) {
  // F: nop; mov %rsi,(%rdi); addq $1,(%rdi); mov (%rax),%rax; movzbl 0x10(%rdi),%ecx; ret
  const std::vector<uint8_t> code = {0x90, 0x48, 0x89, 0x37, 0x48, 0x83, 0x07, 0x01,
                                     0x48, 0x8b, 0x00, 0x0f, 0xb6, 0x4f, 0x10, 0xc3};
  CodeSymbols symbols(code);
  core::symbols::Symbolizer symbolizer(symbols);
  TrapDecoder decoder(symbolizer, PerfUserRegsMaskGeneral());
  constexpr uint64_t kF = CodeSymbols::kStart;

  user_regs_struct r{};
  r.rdi = 0x7000;
  r.rsi = 0xfeedface;
  r.rax = 0x1234;
  r.rcx = 0x9c;
  auto sample = [&](uint64_t trap_ip, const std::vector<uint8_t>& regs) {
    PerfSample s;
    s.ip = trap_ip;
    s.user_regs = regs;
    return decoder.Resolve(s);
  };

  r.rip = kF + 4;  // after mov %rsi,(%rdi)
  std::vector<uint8_t> regs = SampledRegs(r);
  SampledAccess a = sample(kF + 4, regs);
  EXPECT_EQ(a.ip.value, kF + 1);
  EXPECT_TRUE(a.exact_ip);
  EXPECT_TRUE(a.writes);
  ASSERT_TRUE(a.access.addr_known && a.access.value_known);
  EXPECT_EQ(a.access.addr, 0x7000u);
  EXPECT_EQ(a.access.size, 8u);
  EXPECT_EQ(a.access.value, 0xfeedfaceu);
  // The same trap again, other registers: the cached plan, new values.
  r.rdi = 0x7100;
  r.rsi = 77;
  regs = SampledRegs(r);
  a = sample(kF + 4, regs);
  EXPECT_EQ(a.access.addr, 0x7100u);
  EXPECT_EQ(a.access.value, 77u);
  // Registers of another instruction (rip is not the trap address) are not used.
  r.rip = kF + 8;
  regs = SampledRegs(r);
  a = sample(kF + 4, regs);
  EXPECT_FALSE(a.access.addr_known);
  EXPECT_FALSE(a.access.value_known);
  // No registers in the sample.
  a = sample(kF + 4, {});
  EXPECT_FALSE(a.access.addr_known);

  // addq $1,(%rdi): the address, no value.
  r.rip = kF + 8;
  regs = SampledRegs(r);
  a = sample(kF + 8, regs);
  EXPECT_EQ(a.ip.value, kF + 4);
  EXPECT_TRUE(a.writes);
  ASSERT_TRUE(a.access.addr_known);
  EXPECT_EQ(a.access.addr, 0x7100u);
  EXPECT_FALSE(a.access.value_known);

  // mov (%rax),%rax: rax after is the loaded value, not the address.
  r.rip = kF + 11;
  regs = SampledRegs(r);
  a = sample(kF + 11, regs);
  EXPECT_EQ(a.ip.value, kF + 8);
  EXPECT_FALSE(a.writes);
  EXPECT_FALSE(a.access.addr_known);
  ASSERT_TRUE(a.access.value_known);
  EXPECT_EQ(a.access.value, r.rax);
  EXPECT_EQ(a.access.size, 8u);

  // movzbl 0x10(%rdi),%ecx: one byte loaded, in cl.
  r.rip = kF + 15;
  regs = SampledRegs(r);
  a = sample(kF + 15, regs);
  ASSERT_TRUE(a.access.addr_known && a.access.value_known);
  EXPECT_EQ(a.access.addr, 0x7110u);
  EXPECT_EQ(a.access.size, 1u);
  EXPECT_EQ(a.access.value, 0x9cu);

  // A trap address outside any function: nothing known, the trap address as the site.
  a = sample(0x500000, regs);
  EXPECT_EQ(a.ip.value, 0x500000u);
  EXPECT_FALSE(a.exact_ip);
  EXPECT_FALSE(a.access.addr_known);

  const TrapDecodeStats& st = decoder.stats();
  EXPECT_EQ(st.samples, 8u);
  EXPECT_EQ(st.decodes, 5u);  // kF+4, kF+8, kF+11, kF+15, 0x500000
  EXPECT_EQ(st.exact_addresses, 4u);
  EXPECT_EQ(st.exact_values, 4u);  // mov (%rax),%rax: the value without its address
}

alignas(64) volatile uint64_t g_stored = 0;

__attribute__((noinline)) void StoreThrough(volatile uint64_t* target, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i) {
    *target = i * 3 + 1;
  }
}

void OnSigtrap(int /*sig*/) {}

// A real breakpoint on this thread with sampled registers: every store's address and value.
TEST(TrapDecoder, ARealBreakpointSampleGivesTheStoredValueAndAddress) {
  struct sigaction sa = {};
  sa.sa_handler = OnSigtrap;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  ::sigaction(SIGTRAP, &sa, nullptr);

  auto symbols = core::symbols::Symbols::ForProcess(::getpid());
  ASSERT_TRUE(symbols.ok()) << symbols.status();
  core::symbols::Symbolizer symbolizer(**symbols);
  BreakpointRequest req;
  req.addr = core::RemoteAddr{reinterpret_cast<uintptr_t>(&g_stored)};
  req.len = 8;
  req.kind = drmgr::DrKind::kWrite;
  req.tid = ::gettid();
  req.inherit = false;
  req.ring_pages = 64;
  req.sample_regs_user = PerfUserRegsMaskGeneral();
  auto bp = PerfBreakpoint::Open(req);
  KW_REQUIRE_FEATURE(bp.ok(), bp.status().ToString());
  KW_REQUIRE_DEBUG_TRAPS();

  constexpr uint64_t kStores = 50;
  StoreThrough(&g_stored, kStores);
  TrapDecoder decoder(symbolizer, req.sample_regs_user);
  std::vector<SampledAccess> got;
  (*bp)->ring()->Drain([&](const PerfSample& s) {
    EXPECT_EQ(s.user_regs.size(), 17u * 8);
    got.push_back(decoder.Resolve(s));
  });
  ASSERT_EQ(got.size(), kStores);
  for (uint64_t i = 0; i < kStores; ++i) {
    SCOPED_TRACE(i);
    EXPECT_TRUE(got[i].exact_ip);
    ASSERT_TRUE(got[i].access.addr_known);
    EXPECT_EQ(got[i].access.addr, req.addr.value);
    EXPECT_EQ(got[i].access.size, 8u);
    ASSERT_TRUE(got[i].access.value_known);
    EXPECT_EQ(got[i].access.value, i * 3 + 1);
  }
  EXPECT_EQ(decoder.stats().decodes, 1u);
}

}  // namespace
}  // namespace kwatch::watch
