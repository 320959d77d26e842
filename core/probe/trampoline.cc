#include "core/probe/trampoline.h"

#include <algorithm>
#include <cstring>
#include <initializer_list>

#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"

namespace kwatch::core::probe {

namespace {

// A little assembler: bytes and the rel32 fields to fill once the literals have their place.
class Code {
 public:
  void Put(std::initializer_list<uint8_t> bytes) { out_.insert(out_.end(), bytes); }
  void Put32(uint32_t v) {
    for (int i = 0; i < 4; ++i) {
      out_.push_back(static_cast<uint8_t>(v >> (8 * i)));
    }
  }
  void Put64(uint64_t v) {
    Put32(static_cast<uint32_t>(v));
    Put32(static_cast<uint32_t>(v >> 32));
  }
  uint32_t Size() const { return static_cast<uint32_t>(out_.size()); }
  std::vector<uint8_t>& Out() { return out_; }
  // Writes at `field` the rel32 from the end of the instruction ending at `next` to `target`
  // (offsets in this code).
  void PatchRel32(uint32_t field, uint32_t next, uint32_t target) {
    const auto rel = static_cast<int32_t>(static_cast<int64_t>(target) - next);
    std::memcpy(out_.data() + field, &rel, sizeof(rel));
  }

 private:
  std::vector<uint8_t> out_;
};

// Bytes under %rsp the trampoline uses before `push %rsp` reads it: the red zone, pushfq's
// slot, and the seven zero fields (gs .. ss).
constexpr uint32_t kRspFix = kRedZoneBytes + 8 + 7 * 8;
static_assert(kRspFix == 192);
// KwRegs fields after rdi (orig_rax .. gs), skipped when the registers are popped.
constexpr uint32_t kTailFields = agent::kKwRegCount - agent::kKwOrigRax;
static_assert(kTailFields * 8 == 96);

}  // namespace

absl::StatusOr<Trampoline> BuildTrampoline(const JumpPlan& plan, RemoteAddr at,
                                           uint32_t probe_index, RemoteAddr agent_entry) {
  if (!x86::Rel32Reaches(plan.addr + kJumpPatchBytes, at)) {
    return absl::OutOfRangeError(
        absl::StrFormat("a trampoline at 0x%x is beyond a jmp rel32 from the probe at 0x%x",
                        at.value, plan.addr.value));
  }
  Trampoline t;
  t.at = at;
  Code c;
  c.Put({0x48, 0x8d, 0x64, 0x24, 0x80});  // lea -0x80(%rsp),%rsp
  c.Put({0x9c, 0xfc});                    // pushfq; cld
  for (int i = 0; i < 7; ++i) {
    c.Put({0x6a, 0x00});  // push $0: gs, fs, es, ds, gs_base, fs_base, ss
  }
  c.Put({0x54});                    // push %rsp
  c.Put({0x48, 0x81, 0x04, 0x24});  // addq $kRspFix,(%rsp)
  c.Put32(kRspFix);
  c.Put({0xff, 0x74, 0x24, 0x40});  // push 0x40(%rsp): eflags from pushfq's slot
  c.Put({0x6a, 0x00});              // push $0: cs
  c.Put({0xff, 0x35});              // push rip_slot(%rip)
  const uint32_t rip_field = c.Size();
  c.Put32(0);
  const uint32_t rip_next = c.Size();
  c.Put({0x6a, 0xff});  // push $-1: orig_rax
  // rdi rsi rdx rcx rax r8 r9 r10 r11 rbx rbp r12 r13 r14 r15: KwRegs from rdi down to r15.
  c.Put({0x57, 0x56, 0x52, 0x51, 0x50, 0x41, 0x50, 0x41, 0x51, 0x41, 0x52, 0x41,
         0x53, 0x53, 0x55, 0x41, 0x54, 0x41, 0x55, 0x41, 0x56, 0x41, 0x57});
  c.Put({0x48, 0x89, 0xe6});  // mov %rsp,%rsi
  c.Put({0xbf});              // mov $probe_index,%edi
  c.Put32(probe_index);
  c.Put({0x48, 0x89, 0xe3});        // mov %rsp,%rbx
  c.Put({0x48, 0x83, 0xe4, 0xf0});  // and $-16,%rsp
  t.call_offset = c.Size();
  c.Put({0xff, 0x15});  // call *entry_slot(%rip)
  const uint32_t entry_field = c.Size();
  c.Put32(0);
  t.return_offset = c.Size();
  c.Put({0x48, 0x89, 0xdc});  // mov %rbx,%rsp
  // r15 r14 r13 r12 rbp rbx r11 r10 r9 r8 rax rcx rdx rsi rdi
  c.Put({0x41, 0x5f, 0x41, 0x5e, 0x41, 0x5d, 0x41, 0x5c, 0x5d, 0x5b, 0x41, 0x5b,
         0x41, 0x5a, 0x41, 0x59, 0x41, 0x58, 0x58, 0x59, 0x5a, 0x5e, 0x5f});
  c.Put({0x48, 0x8d, 0x64, 0x24, static_cast<uint8_t>(kTailFields * 8)});  // lea 96(%rsp),%rsp
  c.Put({0x9d});                                                           // popfq
  c.Put({0x48, 0x8d, 0xa4, 0x24});                                         // lea 0x80(%rsp),%rsp
  c.Put32(kRedZoneBytes);

  t.displaced_offset = c.Size();
  auto displaced = x86::Relocate(plan.original, plan.addr, at + t.displaced_offset, plan.call_mode);
  if (!displaced.ok()) {
    return displaced.status();
  }
  t.displaced = *std::move(displaced);
  c.Out().insert(c.Out().end(), t.displaced.code.begin(), t.displaced.code.end());
  t.jump_back_offset = c.Size();
  if (t.displaced.falls_through) {
    x86::AppendJump(c.Out(), at, plan.addr + plan.len);
  }
  while (c.Size() % 8 != 0) {
    c.Put({0xcc});
  }
  t.rip_slot_offset = c.Size();
  c.Put64(plan.addr.value);
  t.entry_slot_offset = c.Size();
  c.Put64(agent_entry.value);
  c.PatchRel32(rip_field, rip_next, t.rip_slot_offset);
  c.PatchRel32(entry_field, t.return_offset, t.entry_slot_offset);
  t.code = std::move(c.Out());
  if (t.code.size() > kMaxTrampolineBytes) {
    return absl::InternalError(absl::StrFormat("a trampoline of %d bytes, over the %d allowed",
                                               t.code.size(), kMaxTrampolineBytes));
  }
  return t;
}

bool TrampolineFits(const JumpPlan& plan, RemoteAddr at) {
  return BuildTrampoline(plan, at, 0, RemoteAddr{0}).ok();
}

absl::StatusOr<std::vector<uint8_t>> BuildDisplacedCopy(const JumpPlan& plan, RemoteAddr at) {
  KW_ASSIGN_OR_RETURN(x86::Relocation r,
                      x86::Relocate(plan.original, plan.addr, at, plan.call_mode));
  if (r.falls_through) {
    x86::AppendJump(r.code, at, plan.addr + plan.len);
  }
  return std::move(r.code);
}

absl::StatusOr<JumpPatch> BuildJumpPatch(const JumpPlan& plan, RemoteAddr trampoline) {
  const RemoteAddr next = plan.addr + kJumpPatchBytes;
  if (!x86::Rel32Reaches(next, trampoline)) {
    return absl::OutOfRangeError(
        absl::StrFormat("a trampoline at 0x%x is beyond a jmp rel32 from the probe at 0x%x",
                        trampoline.value, plan.addr.value));
  }
  JumpPatch p;
  p.addr = plan.addr;
  p.len = plan.len;
  p.original = plan.original;
  p.patched.assign(plan.len, 0xcc);
  p.patched[0] = 0xe9;
  const auto rel = static_cast<int32_t>(static_cast<int64_t>(trampoline.value - next.value));
  std::memcpy(p.patched.data() + 1, &rel, sizeof(rel));
  return p;
}

namespace {

std::vector<PatchStep> Steps(RemoteAddr addr, const std::vector<uint8_t>& to) {
  return {
      PatchStep{addr, {0xcc}},
      PatchStep{addr + 1, std::vector<uint8_t>(to.begin() + 1, to.end())},
      PatchStep{addr, {to[0]}},
  };
}

}  // namespace

std::vector<PatchStep> ArmSteps(const JumpPatch& patch) {
  return Steps(patch.addr, patch.patched);
}

std::vector<PatchStep> RemoveSteps(const JumpPatch& patch) {
  return Steps(patch.addr, patch.original);
}

void FillKwPatch(const JumpPatch& patch, uint32_t probe_index, agent::KwPatch& out) {
  out.len = patch.len;
  out.addr = patch.addr.value;
  std::fill(std::begin(out.original), std::end(out.original), 0);
  std::fill(std::begin(out.patched), std::end(out.patched), 0);
  std::copy(patch.original.begin(), patch.original.end(), std::begin(out.original));
  std::copy(patch.patched.begin(), patch.patched.end(), std::begin(out.patched));
  out.probe_index = probe_index;
  out.reserved = 0;
}

}  // namespace kwatch::core::probe
