#include "core/probe/trampoline.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "agent/abi.h"
#include "core/probe/jump_optimizer.h"
#include "core/x86/relocator.h"
#include "tests/core/probe/compiled_function.h"

namespace kwatch::core::probe {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

using Bytes = std::vector<uint8_t>;

constexpr RemoteAddr kF{0x401000};
constexpr RemoteAddr kT{0x402000};
constexpr RemoteAddr kEntry{0x7f1234567890};

// push %rbp; mov %rsp,%rbp; sub $0x10,%rsp; mov %rdi,%rax; leave; ret
Bytes Prologue() {
  return {0x55, 0x48, 0x89, 0xe5, 0x48, 0x83, 0xec, 0x10, 0x48, 0x89, 0xf8, 0xc9, 0xc3};
}

JumpPlan PlanAt(const Bytes& code, RemoteAddr start, uint64_t offset, x86::CallMode mode) {
  JumpOptions options;
  options.call_mode = mode;
  const JumpDecision d = PlanJumpProbe(FunctionCode{"f", start, code}, start + offset, options);
  EXPECT_TRUE(d.plan.has_value()) << d.reason;
  return d.plan.value_or(JumpPlan{});
}

JumpPlan Plan(const Bytes& code, uint64_t offset = 0,
              x86::CallMode mode = x86::CallMode::kPushReturn) {
  return PlanAt(code, kF, offset, mode);
}

// The trampoline's instructions as AT&T text, up to the literals.
std::vector<std::string> Listing(const Trampoline& t) {
  std::vector<std::string> out;
  for (uint32_t off = 0; off < t.rip_slot_offset;) {
    auto d = x86::DecodeX86(std::span(t.code).subspan(off), t.at + off);
    if (!d.ok() || d->insn.mnemonic == ZYDIS_MNEMONIC_INT3) {
      break;
    }
    out.push_back(d->Text());
    off += d->length;
  }
  return out;
}

TEST(Trampoline, FollowsTheDocumentedLayout) {
  auto t = BuildTrampoline(Plan(Prologue()), kT, 7, kEntry);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_THAT(
      t->code,
      ElementsAreArray(Bytes{
          0x48, 0x8d, 0x64, 0x24, 0x80,                          // lea -0x80(%rsp),%rsp
          0x9c, 0xfc,                                            // pushfq; cld
          0x6a, 0x00, 0x6a, 0x00, 0x6a, 0x00, 0x6a, 0x00,        // gs fs es ds
          0x6a, 0x00, 0x6a, 0x00, 0x6a, 0x00,                    // gs_base fs_base ss
          0x54, 0x48, 0x81, 0x04, 0x24, 0xc0, 0x00, 0x00, 0x00,  // rsp: push %rsp; addq $192
          0xff, 0x74, 0x24, 0x40,                                // eflags: push 0x40(%rsp)
          0x6a, 0x00,                                            // cs
          0xff, 0x35, 0x66, 0x00, 0x00, 0x00,                    // rip: push 0x66(%rip)
          0x6a, 0xff,                                            // orig_rax: -1
          0x57, 0x56, 0x52, 0x51, 0x50,                          // rdi rsi rdx rcx rax
          0x41, 0x50, 0x41, 0x51, 0x41, 0x52, 0x41, 0x53,        // r8 r9 r10 r11
          0x53, 0x55,                                            // rbx rbp
          0x41, 0x54, 0x41, 0x55, 0x41, 0x56, 0x41, 0x57,        // r12 r13 r14 r15
          0x48, 0x89, 0xe6,                                      // mov %rsp,%rsi
          0xbf, 0x07, 0x00, 0x00, 0x00,                          // mov $7,%edi
          0x48, 0x89, 0xe3,                                      // mov %rsp,%rbx
          0x48, 0x83, 0xe4, 0xf0,                                // and $-16,%rsp
          0xff, 0x15, 0x40, 0x00, 0x00, 0x00,                    // call *0x40(%rip)
          0x48, 0x89, 0xdc,                                      // mov %rbx,%rsp
          0x41, 0x5f, 0x41, 0x5e, 0x41, 0x5d, 0x41, 0x5c,        // r15 r14 r13 r12
          0x5d, 0x5b,                                            // rbp rbx
          0x41, 0x5b, 0x41, 0x5a, 0x41, 0x59, 0x41, 0x58,        // r11 r10 r9 r8
          0x58, 0x59, 0x5a, 0x5e, 0x5f,                          // rax rcx rdx rsi rdi
          0x48, 0x8d, 0x64, 0x24, 0x60,                          // lea 0x60(%rsp),%rsp
          0x9d,                                                  // popfq
          0x48, 0x8d, 0xa4, 0x24, 0x80, 0x00, 0x00, 0x00,        // lea 0x80(%rsp),%rsp
          0x55, 0x48, 0x89, 0xe5, 0x48, 0x83, 0xec, 0x10,        // the displaced instructions
          0xe9, 0x7b, 0xef, 0xff, 0xff,                          // jmp 0x401008
          0xcc, 0xcc, 0xcc,                                      // fill
          0x00, 0x10, 0x40, 0x00, 0x00, 0x00, 0x00, 0x00,        // the probe's address
          0x90, 0x78, 0x56, 0x34, 0x12, 0x7f, 0x00, 0x00,        // the agent's entry
      }));
  EXPECT_EQ(t->call_offset, 82U);
  EXPECT_EQ(t->return_offset, 88U);
  EXPECT_EQ(t->displaced_offset, 128U);
  EXPECT_EQ(t->jump_back_offset, 136U);
  EXPECT_EQ(t->rip_slot_offset, 144U);
  EXPECT_EQ(t->entry_slot_offset, 152U);
  EXPECT_EQ(t->xol_addr(), kT + 128);
  const std::vector<std::string> listing = Listing(*t);
  ASSERT_EQ(listing.size(), 59U);
  EXPECT_EQ(listing[0], "lea -0x80(%rsp), %rsp");
  EXPECT_EQ(listing[10], "push %rsp");
  EXPECT_EQ(listing[11], "addq $0xc0, (%rsp)");
  EXPECT_EQ(listing[12], "push 0x40(%rsp)");
  EXPECT_EQ(listing[14], "push 0x66(%rip)");
  EXPECT_EQ(listing[35], "call 0x40(%rip)");  // Zydis AT&T: no star
  EXPECT_EQ(listing.back(), "jmp 0x401008");
}

TEST(Trampoline, KwRegsIsPushedInUserRegsOrder) {
  // The pushes, last first, name KwRegs' fields from r15 (lowest address) up.
  auto t = BuildTrampoline(Plan(Prologue()), kT, 0, kEntry);
  ASSERT_TRUE(t.ok());
  const std::vector<std::string> listing = Listing(*t);
  std::vector<std::string> pushes;
  for (const std::string& line : listing) {
    if (absl::StartsWith(line, "push")) {
      pushes.push_back(line);
    }
    if (absl::StartsWith(line, "mov %rsp, %rsi")) {
      break;
    }
  }
  // gs fs es ds gs_base fs_base ss | rsp eflags cs rip orig_rax | rdi .. r15 (pushfq first).
  ASSERT_EQ(pushes.size(), 1U + 27U);
  EXPECT_EQ(pushes[0], "pushfq");
  const std::vector<std::string> gprs(pushes.end() - 15, pushes.end());
  EXPECT_THAT(gprs, ElementsAre("push %rdi", "push %rsi", "push %rdx", "push %rcx", "push %rax",
                                "push %r8", "push %r9", "push %r10", "push %r11", "push %rbx",
                                "push %rbp", "push %r12", "push %r13", "push %r14", "push %r15"));
  static_assert(offsetof(agent::KwRegs, r15) == 0);
  static_assert(offsetof(agent::KwRegs, rdi) == 14 * sizeof(uint64_t));
  static_assert(offsetof(agent::KwRegs, gs) == 26 * sizeof(uint64_t));
}

TEST(Trampoline, RelocatesTheDisplacedInstructions) {
  // xor %eax,%eax; cmp $1,%edi; ja f+0x20 ... (the jcc ends the range) ; far trampoline-free
  const Bytes f = {0x31, 0xc0, 0x83, 0xff, 0x01, 0x77, 0x19, 0xc3, 0x90, 0x90, 0x90,
                   0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90,
                   0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0xc3};
  const JumpPlan p = Plan(f, 2);  // cmp (3) + ja (2)
  ASSERT_EQ(p.len, 5U);
  auto t = BuildTrampoline(p, kT, 0, kEntry);
  ASSERT_TRUE(t.ok()) << t.status();
  const std::vector<std::string> listing = Listing(*t);
  ASSERT_GE(listing.size(), 3U);
  EXPECT_THAT(std::vector<std::string>(listing.end() - 3, listing.end()),
              ElementsAre("cmp $0x1, %edi", "jnbe 0x401020", "jmp 0x401007"));
  // The same bytes as a displaced copy elsewhere (the INT3 path while the probe goes).
  auto copy = BuildDisplacedCopy(p, t->xol_addr());
  ASSERT_TRUE(copy.ok());
  ASSERT_EQ(copy->size(), t->jump_back_offset - t->displaced_offset + 5);
  EXPECT_THAT(*copy, ElementsAreArray(t->code.begin() + t->displaced_offset,
                                      t->code.begin() + t->displaced_offset + copy->size()));
}

TEST(Trampoline, RefusesPlacesOutOfReach) {
  const JumpPlan p = Plan(Prologue());
  auto far = BuildTrampoline(p, RemoteAddr{0x7f0000000000}, 0, kEntry);
  ASSERT_FALSE(far.ok());
  EXPECT_EQ(far.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_FALSE(TrampolineFits(p, RemoteAddr{0x7f0000000000}));
  EXPECT_TRUE(TrampolineFits(p, kT));
  // A RIP-relative operand whose target a trampoline 1.5 GiB the other way cannot reach.
  // mov 0x7fff0000(%rip),%rax: its target is ~2 GiB above the probe.
  const Bytes rip = {0x48, 0x8b, 0x05, 0x00, 0x00, 0xff, 0x7f, 0xc3};
  const JumpPlan q = PlanAt(rip, RemoteAddr{0x100000000}, 0, x86::CallMode::kPushReturn);
  EXPECT_TRUE(TrampolineFits(q, RemoteAddr{0x100000000 + (1ULL << 20)}));
  const RemoteAddr below{0x100000000 - (3ULL << 29)};
  EXPECT_FALSE(TrampolineFits(q, below));
  EXPECT_THAT(BuildTrampoline(q, below, 0, kEntry).status().message(), HasSubstr("beyond +-2 GiB"));
  auto patch = BuildJumpPatch(p, RemoteAddr{0x7f0000000000});
  EXPECT_EQ(patch.status().code(), absl::StatusCode::kOutOfRange);
}

TEST(Trampoline, PatchBytesAndTheInt3FirstSequence) {
  const JumpPlan p = Plan(Prologue());
  auto patch = BuildJumpPatch(p, kT);
  ASSERT_TRUE(patch.ok()) << patch.status();
  // jmp 0x402000 from 0x401000: rel32 = 0x402000 - 0x401005; int3 fill to 8 bytes.
  EXPECT_THAT(patch->patched, ElementsAre(0xe9, 0xfb, 0x0f, 0x00, 0x00, 0xcc, 0xcc, 0xcc));
  EXPECT_THAT(patch->original, ElementsAreArray(p.original));
  const std::vector<PatchStep> arm = ArmSteps(*patch);
  ASSERT_EQ(arm.size(), 3U);
  EXPECT_EQ(arm[0].addr, kF);
  EXPECT_THAT(arm[0].bytes, ElementsAre(0xcc));
  EXPECT_EQ(arm[1].addr, kF + 1);
  EXPECT_THAT(arm[1].bytes, ElementsAre(0xfb, 0x0f, 0x00, 0x00, 0xcc, 0xcc, 0xcc));
  EXPECT_EQ(arm[2].addr, kF);
  EXPECT_THAT(arm[2].bytes, ElementsAre(0xe9));
  const std::vector<PatchStep> remove = RemoveSteps(*patch);
  ASSERT_EQ(remove.size(), 3U);
  EXPECT_THAT(remove[0].bytes, ElementsAre(0xcc));
  EXPECT_THAT(remove[1].bytes, ElementsAre(0x48, 0x89, 0xe5, 0x48, 0x83, 0xec, 0x10));
  EXPECT_THAT(remove[2].bytes, ElementsAre(0x55));
  // Applied in order to a copy of the code, each sequence gives the expected bytes.
  Bytes code = Prologue();
  for (const PatchStep& s : arm) {
    std::memcpy(code.data() + (s.addr - kF), s.bytes.data(), s.bytes.size());
  }
  EXPECT_THAT(Bytes(code.begin(), code.begin() + 8), ElementsAreArray(patch->patched));
  for (const PatchStep& s : remove) {
    std::memcpy(code.data() + (s.addr - kF), s.bytes.data(), s.bytes.size());
  }
  EXPECT_THAT(code, ElementsAreArray(Prologue()));

  agent::KwPatch journal{};
  FillKwPatch(*patch, 3, journal);
  EXPECT_EQ(journal.state.load(), agent::kKwPatchFree);  // the controller publishes it
  EXPECT_EQ(journal.len, 8U);
  EXPECT_EQ(journal.addr, kF.value);
  EXPECT_EQ(journal.probe_index, 3U);
  EXPECT_THAT(journal.original,
              ElementsAre(0x55, 0x48, 0x89, 0xe5, 0x48, 0x83, 0xec, 0x10, 0, 0, 0, 0, 0, 0, 0, 0));
  EXPECT_THAT(journal.patched,
              ElementsAre(0xe9, 0xfb, 0x0f, 0x00, 0x00, 0xcc, 0xcc, 0xcc, 0, 0, 0, 0, 0, 0, 0, 0));
}

// ---------------------------------------------------------------------------------------
// Execution: code and trampolines in an RWX mapping of this process, the "agent entry" a
// function of this test that counts hits and checks the registers it is given.

class ExecArea {
 public:
  static constexpr size_t kSize = 1 << 16;
  ExecArea() {
    void* p = mmap(nullptr, kSize, PROT_READ | PROT_WRITE | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS,
                   -1, 0);
    const int err = errno;
    EXPECT_NE(p, MAP_FAILED) << "mmap RWX: " << std::generic_category().message(err);
    base_ = p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p);
    if (base_ != nullptr) {
      std::memset(base_, 0xcc, kSize);
    }
  }
  ~ExecArea() {
    if (base_ != nullptr) {
      munmap(base_, kSize);
    }
  }
  ExecArea(const ExecArea&) = delete;
  ExecArea& operator=(const ExecArea&) = delete;
  ExecArea(ExecArea&&) = delete;
  ExecArea& operator=(ExecArea&&) = delete;

  bool Ok() const { return base_ != nullptr; }
  RemoteAddr Addr(size_t off) const { return RemoteAddr{reinterpret_cast<uint64_t>(base_) + off}; }

 private:
  uint8_t* base_ = nullptr;
};

// Code and data in the area, by absolute address.
void WriteAt(RemoteAddr at, std::span<const uint8_t> bytes) {
  std::memcpy(reinterpret_cast<void*>(at.value),  // NOLINT(performance-no-int-to-ptr)
              bytes.data(), bytes.size());
}
std::span<const uint8_t> ReadAt(RemoteAddr at, size_t n) {
  return {reinterpret_cast<const uint8_t*>(at.value), n};  // NOLINT(performance-no-int-to-ptr)
}
void ApplySteps(const std::vector<PatchStep>& steps) {
  for (const PatchStep& s : steps) {
    WriteAt(s.addr, s.bytes);
  }
}

// Offsets in the area.
constexpr size_t kStubAt = 0;       // the caller stub
constexpr size_t kCodeAt = 0x100;   // the probed function's copy
constexpr size_t kTrampAt = 0x800;  // its trampoline
constexpr size_t kDataAt = 0xf00;   // data the hand-made code reads

// sub $8,%rsp; call *%rdx; add $8,%rsp; ret: calls the function in %rdx with %rdi and %rsi,
// so that at its entry (%rsp) holds kStubAt + 6.
Bytes Stub() {
  return {0x48, 0x83, 0xec, 0x08, 0xff, 0xd2, 0x48, 0x83, 0xc4, 0x08, 0xc3};
}
constexpr size_t kStubReturn = 6;
using StubFn = int64_t (*)(int64_t, int64_t, uint64_t);

// What the entry expects of every hit; set before the calls, read-only while they run.
struct Expectation {
  uint32_t index = 0;
  uint64_t rip = 0;
  uint64_t return_slot = 0;     // (regs->rsp + return_slot) holds return_address
  uint64_t return_address = 0;  // 0: not checked
  bool paired_args = false;     // regs->rsi == Pair(regs->rdi) (entry probes)
  int64_t add_to_rdi = 0;       // the entry changes rdi by this (KwRegs is restored from)
};
Expectation g_expect;
std::atomic<uint64_t> g_hits{0};
std::atomic<uint64_t> g_bad{0};
std::atomic<uint64_t> g_first_bad_field{0};

int64_t Pair(int64_t a) {
  return (a ^ 0x55) - 3;
}

void Bad(uint64_t field) {
  if (g_bad.fetch_add(1) == 0) {
    g_first_bad_field.store(field);
  }
}

void CheckingEntry(uint32_t index, agent::KwRegs* regs) {
  g_hits.fetch_add(1, std::memory_order_relaxed);
  if ((reinterpret_cast<uintptr_t>(__builtin_frame_address(0)) & 15) != 0) {
    Bad(100);  // the call's stack is not 16-byte aligned
  }
  if (index != g_expect.index) {
    Bad(101);
  }
  if (regs->rip != g_expect.rip) {
    Bad(agent::kKwRip);
  }
  if (regs->orig_rax != ~0ULL || regs->cs != 0 || regs->fs_base != 0 || regs->gs != 0) {
    Bad(agent::kKwOrigRax);
  }
  if ((regs->eflags & 0x202) != 0x202) {  // bit 1 (always set) and IF
    Bad(agent::kKwEflags);
  }
  if (g_expect.return_address != 0 &&
      // NOLINTNEXTLINE(performance-no-int-to-ptr): the stack slot the trampoline reported
      *reinterpret_cast<const uint64_t*>(regs->rsp + g_expect.return_slot) !=
          g_expect.return_address) {
    Bad(agent::kKwRsp);
  }
  if (g_expect.paired_args &&
      static_cast<int64_t>(regs->rsi) != Pair(static_cast<int64_t>(regs->rdi))) {
    Bad(agent::kKwRsi);
  }
  regs->rdi += g_expect.add_to_rdi;
}

// The three leaf functions of jump_funcs.c, as the C source says.
int64_t RefMix(int64_t a, int64_t b) {
  int64_t x = a * 3 + b;
  x ^= x >> 7;
  return x - (b << 2);
}
int64_t RefRedzone(int64_t a, int64_t b) {
  int64_t s = a * 5 + b;
  s += (a ^ b) * 7;
  s -= a + b;
  return s;
}
int64_t RefLoop(int64_t x) {
  auto u = static_cast<uint32_t>(x);
  uint32_t c = 0;
  while (u > 1) {
    u = (u & 1) != 0 ? 3 * u + 1 : u / 2;
    c++;
  }
  return c;
}

struct Leaf {
  const char* name;
  int64_t (*ref)(int64_t, int64_t);
  bool straight;  // no branch: every instruction runs once a call
};

class JumpExecution : public ::testing::TestWithParam<std::string> {};

// Stack bytes the function pushed before `probe` (push/pop only: the leaves here have no other
// %rsp writer before their return); nullopt when something else writes %rsp.
std::optional<uint64_t> PushedBefore(const std::vector<x86::X86Insn>& insns, RemoteAddr probe) {
  uint64_t pushed = 0;
  for (const x86::X86Insn& insn : insns) {
    if (insn.addr >= probe) {
      break;
    }
    if (insn.insn.mnemonic == ZYDIS_MNEMONIC_PUSH) {
      pushed += 8;
    } else if (insn.insn.mnemonic == ZYDIS_MNEMONIC_POP) {
      pushed -= 8;
    } else {
      for (uint8_t i = 0; i < insn.insn.operand_count_visible; ++i) {
        const ZydisDecodedOperand& op = insn.operands[i];
        if (op.type == ZYDIS_OPERAND_TYPE_REGISTER && op.reg.value == ZYDIS_REGISTER_RSP &&
            (op.actions & ZYDIS_OPERAND_ACTION_MASK_WRITE) != 0) {
          return std::nullopt;
        }
      }
    }
  }
  return pushed;
}

TEST_P(JumpExecution, EveryAcceptedProbeOfTheLeavesRunsExactly) {
  ExecArea area;
  ASSERT_TRUE(area.Ok());
  WriteAt(area.Addr(kStubAt), Stub());
  const auto stub =
      reinterpret_cast<StubFn>(area.Addr(kStubAt).value);  // NOLINT(performance-no-int-to-ptr)
  const RemoteAddr fn_at = area.Addr(kCodeAt);
  const RemoteAddr tramp_at = area.Addr(kTrampAt);
  const RemoteAddr entry{reinterpret_cast<uint64_t>(&CheckingEntry)};
  int probes = 0;
  for (const Leaf& leaf : {Leaf{"jf_mix", RefMix, true}, Leaf{"jf_redzone", RefRedzone, true},
                           Leaf{"jf_loop", [](int64_t a, int64_t) { return RefLoop(a); }, false}}) {
    const auto f = CompiledFunction::Load(GetParam(), leaf.name);
    ASSERT_NE(f, nullptr);
    // The copy: a leaf without RIP-relative operands or branches out of itself runs anywhere.
    const FunctionCode copy{leaf.name, fn_at, f->bytes()};
    WriteAt(fn_at, f->bytes());
    std::vector<x86::X86Insn> insns;
    for (const x86::X86Insn& insn : f->Insns()) {
      auto moved = x86::DecodeX86(ReadAt(fn_at + (insn.addr - f->code().start), insn.length),
                                  fn_at + (insn.addr - f->code().start));
      ASSERT_TRUE(moved.ok());
      ASSERT_FALSE(moved->rip_target.has_value()) << leaf.name << ": " << moved->Text();
      ASSERT_NE(moved->flow, x86::InsnFlow::kCall) << leaf.name;
      insns.push_back(*moved);
    }
    for (const x86::X86Insn& at : insns) {
      // The entry point of every function; every point of the straight-line ones.
      if (!leaf.straight && at.addr != fn_at) {
        continue;
      }
      const JumpDecision d = PlanJumpProbe(copy, at.addr);
      if (!d.plan) {
        continue;
      }
      const std::optional<uint64_t> pushed = PushedBefore(insns, at.addr);
      ASSERT_TRUE(pushed.has_value()) << leaf.name << ": %rsp written before " << at.Text();
      auto t = BuildTrampoline(*d.plan, tramp_at, 7, entry);
      ASSERT_TRUE(t.ok()) << t.status();
      auto patch = BuildJumpPatch(*d.plan, tramp_at);
      ASSERT_TRUE(patch.ok()) << patch.status();
      WriteAt(tramp_at, t->code);
      ApplySteps(ArmSteps(*patch));

      g_expect = Expectation{};
      g_expect.index = 7;
      g_expect.rip = at.addr.value;
      g_expect.return_slot = *pushed;
      g_expect.return_address = area.Addr(kStubAt + kStubReturn).value;
      g_expect.paired_args = at.addr == fn_at;
      g_hits = 0;
      g_bad = 0;
      constexpr int kCalls = 3000;
      int wrong = 0;
      for (int i = 0; i < kCalls; ++i) {
        // jf_loop's Collatz steps stay below 2^32 from these.
        const int64_t a = leaf.straight ? i * 7919 - 1000000 : i % 5000 + 1;
        const int64_t b = Pair(a);
        if (stub(a, b, fn_at.value) != leaf.ref(a, b)) {
          ++wrong;
        }
      }
      const std::string where =
          absl::StrFormat("%s %s+0x%x (%s)", GetParam(), leaf.name, at.addr - fn_at, at.Text());
      EXPECT_EQ(wrong, 0) << where;
      EXPECT_EQ(g_hits.load(), static_cast<uint64_t>(kCalls)) << where;
      EXPECT_EQ(g_bad.load(), 0U) << where << ": KwRegs field " << g_first_bad_field.load();

      ApplySteps(RemoveSteps(*patch));
      ASSERT_TRUE(std::equal(f->bytes().begin(), f->bytes().end(),
                             ReadAt(fn_at, f->bytes().size()).begin()))
          << where << ": not restored";
      ++probes;
    }
  }
  EXPECT_GE(probes, 6) << "too few jump probes accepted in the leaves of " << GetParam();
}

TEST_P(JumpExecution, TheAgentMayChangeRegistersAndFourThreadsCountExactly) {
  ExecArea area;
  ASSERT_TRUE(area.Ok());
  WriteAt(area.Addr(kStubAt), Stub());
  const auto stub =
      reinterpret_cast<StubFn>(area.Addr(kStubAt).value);  // NOLINT(performance-no-int-to-ptr)
  const auto f = CompiledFunction::Load(GetParam(), "jf_mix");
  ASSERT_NE(f, nullptr);
  const RemoteAddr fn_at = area.Addr(kCodeAt);
  WriteAt(fn_at, f->bytes());
  const JumpDecision d = PlanJumpProbe(FunctionCode{"jf_mix", fn_at, f->bytes()}, fn_at);
  ASSERT_TRUE(d.plan.has_value()) << d.reason;
  auto t = BuildTrampoline(*d.plan, area.Addr(kTrampAt), 1,
                           RemoteAddr{reinterpret_cast<uint64_t>(&CheckingEntry)});
  ASSERT_TRUE(t.ok()) << t.status();
  auto patch = BuildJumpPatch(*d.plan, area.Addr(kTrampAt));
  ASSERT_TRUE(patch.ok());
  WriteAt(t->at, t->code);
  ApplySteps(ArmSteps(*patch));

  g_expect = Expectation{};
  g_expect.index = 1;
  g_expect.rip = fn_at.value;
  g_expect.return_address = area.Addr(kStubAt + kStubReturn).value;
  g_expect.add_to_rdi = 1;  // the function then computes jf_mix(a + 1, b)
  g_hits = 0;
  g_bad = 0;
  constexpr int kThreads = 4;
  constexpr int kCalls = 20000;
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  threads.reserve(kThreads);
  for (int th = 0; th < kThreads; ++th) {
    threads.emplace_back([&, th] {
      for (int i = 0; i < kCalls; ++i) {
        const int64_t a = th * 1000003LL + i;
        if (stub(a, 77, fn_at.value) != RefMix(a + 1, 77)) {
          wrong.fetch_add(1);
        }
      }
    });
  }
  for (std::thread& th : threads) {
    th.join();
  }
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(g_hits.load(), static_cast<uint64_t>(kThreads) * kCalls);
  EXPECT_EQ(g_bad.load(), 0U) << "KwRegs field " << g_first_bad_field.load();

  // The displaced copy alone (xol_addr: the INT3 path while the probe is removed) runs the
  // function without a hit.
  g_hits = 0;
  g_expect.add_to_rdi = 0;
  for (int i = 0; i < 100; ++i) {
    EXPECT_EQ(stub(i, 5, t->xol_addr().value), RefMix(i, 5));
  }
  EXPECT_EQ(g_hits.load(), 0U);
  ApplySteps(RemoveSteps(*patch));
}

INSTANTIATE_TEST_SUITE_P(Levels, JumpExecution,
                         ::testing::Values("jump_funcs_O0", "jump_funcs_O2"));

// Hand-made code for what the compiled leaves do not have: calls, RIP-relative operands and
// conditional jumps displaced, each executed through its trampoline.
class HandMade : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(area_.Ok());
    WriteAt(area_.Addr(kStubAt), Stub());
  }
  // Installs `code` at kCodeAt with a jump probe at its start; returns the trampoline.
  Trampoline Install(const Bytes& code, x86::CallMode mode) {
    const RemoteAddr fn_at = area_.Addr(kCodeAt);
    WriteAt(fn_at, code);
    JumpOptions options;
    options.call_mode = mode;
    const JumpDecision d = PlanJumpProbe(FunctionCode{"g", fn_at, code}, fn_at, options);
    EXPECT_TRUE(d.plan.has_value()) << d.reason;
    if (!d.plan) {
      return Trampoline{};
    }
    auto t = BuildTrampoline(*d.plan, area_.Addr(kTrampAt), 2,
                             RemoteAddr{reinterpret_cast<uint64_t>(&CheckingEntry)});
    EXPECT_TRUE(t.ok()) << t.status();
    auto patch = BuildJumpPatch(*d.plan, area_.Addr(kTrampAt));
    EXPECT_TRUE(patch.ok());
    if (!t.ok() || !patch.ok()) {
      return Trampoline{};
    }
    WriteAt(t->at, t->code);
    ApplySteps(ArmSteps(*patch));
    g_expect = Expectation{};
    g_expect.index = 2;
    g_expect.rip = fn_at.value;
    g_expect.return_address = area_.Addr(kStubAt + kStubReturn).value;
    g_hits = 0;
    g_bad = 0;
    return *t;
  }
  int64_t Call(int64_t a, int64_t b) {
    const auto stub =
        reinterpret_cast<StubFn>(area_.Addr(kStubAt).value);  // NOLINT(performance-no-int-to-ptr)
    return stub(a, b, area_.Addr(kCodeAt).value);
  }

  ExecArea area_;
};

// g: call h; ret.   h (at g+0x40): mov (%rsp),%rax; ret   -> g returns h's return address.
Bytes CallsItsNeighbour() {
  Bytes g(0x48, 0x90);
  const Bytes call = {0xe8, 0x3b, 0x00, 0x00, 0x00, 0xc3};  // call g+0x40; ret
  const Bytes h = {0x48, 0x8b, 0x04, 0x24, 0xc3};           // mov (%rsp),%rax; ret
  std::copy(call.begin(), call.end(), g.begin());
  std::copy(h.begin(), h.end(), g.begin() + 0x40);
  return g;
}

TEST_F(HandMade, APushReturnCallReturnsToTheOriginalSuccessor) {
  const Trampoline t = Install(CallsItsNeighbour(), x86::CallMode::kPushReturn);
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(static_cast<uint64_t>(Call(i, i)), area_.Addr(kCodeAt + 5).value);
  }
  EXPECT_EQ(g_hits.load(), 10U);
  EXPECT_EQ(g_bad.load(), 0U) << g_first_bad_field.load();
}

TEST_F(HandMade, ACallFromTheCopyReturnsIntoTheTrampoline) {
  const Trampoline t = Install(CallsItsNeighbour(), x86::CallMode::kCallFromCopy);
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(static_cast<uint64_t>(Call(i, i)), t.xol_addr().value + 5);
  }
  EXPECT_EQ(g_hits.load(), 10U);
}

TEST_F(HandMade, RipRelativeOperandsReadTheSameData) {
  // g: mov disp(%rip),%rax (the quad at kDataAt); add %rdi,%rax; ret
  const RemoteAddr data = area_.Addr(kDataAt);
  const uint64_t value = 0x1122334455667788;
  WriteAt(data, std::span(reinterpret_cast<const uint8_t*>(&value), sizeof(value)));
  Bytes g = {0x48, 0x8b, 0x05, 0, 0, 0, 0, 0x48, 0x01, 0xf8, 0xc3};
  const auto disp = static_cast<int32_t>(data.value - area_.Addr(kCodeAt + 7).value);
  std::memcpy(g.data() + 3, &disp, sizeof(disp));
  Install(g, x86::CallMode::kPushReturn);
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(static_cast<uint64_t>(Call(i, 0)), value + i);
  }
  EXPECT_EQ(g_hits.load(), 10U);
}

TEST_F(HandMade, ConditionalJumpsTakeBothWays) {
  // g: test %rdi,%rdi; je L (rel8); mov $1,%eax; ret; L: mov $2,%eax; ret
  const Bytes g = {0x48, 0x85, 0xff, 0x74, 0x06, 0xb8, 0x01, 0x00, 0x00,
                   0x00, 0xc3, 0xb8, 0x02, 0x00, 0x00, 0x00, 0xc3};
  Install(g, x86::CallMode::kPushReturn);
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(Call(i % 2, 0), i % 2 == 0 ? 2 : 1);
  }
  EXPECT_EQ(g_hits.load(), 10U);
}

}  // namespace
}  // namespace kwatch::core::probe
