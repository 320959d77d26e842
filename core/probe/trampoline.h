#pragma once

// A jump probe's code (docs/agent.md "The hit paths / Jump probe"): the trampoline its jmp
// reaches, the patch that puts the jmp in place, and the order of the writes (INT3 first, as
// the kernel's text_poke_bp). Pure functions over bytes and addresses (absolute, in the
// target); the controller writes the bytes, with every thread of the target stopped.
//
// A trampoline at T for probe index I of a JumpPlan at A (len bytes), agent entry E:
//
//   lea -128(%rsp),%rsp                 step over the red zone (the probed code may be a leaf)
//   pushfq; cld                         the agent runs with DF clear (popfq restores it)
//   push $0 x7                          gs, fs, es, ds, gs_base, fs_base, ss
//   push %rsp; addq $192,(%rsp)         rsp: its value at the probe
//   push 64(%rsp)                       eflags: pushfq's copy
//   push $0; push A(%rip); push $-1     cs, rip (the probe's address), orig_rax
//   push rdi..r15                       KwRegs ends at %rsp (the layout of user_regs_struct)
//   mov %rsp,%rsi; mov $I,%edi
//   mov %rsp,%rbx; and $-16,%rsp; call *E(%rip); mov %rbx,%rsp
//   pop r15..rdi                        the registers, as the agent may have changed them
//   lea 96(%rsp),%rsp; popfq; lea 128(%rsp),%rsp
//   <the displaced instructions, relocated>   (KwProbe::xol_addr: T + displaced_offset)
//   jmp A+len                           rel32, or jmp *0(%rip) and the address
//   int3 fill to 8 bytes; .quad A; .quad E
//
// Trampolines are never freed while the image lives: a thread may be inside one (in the agent,
// or blocked in a displaced call) long after its probe went, and it stays correct: it jumps
// back to the original code, which is whole again.

#include <array>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/abi.h"
#include "core/base/remote_addr.h"
#include "core/probe/jump_optimizer.h"
#include "core/x86/relocator.h"

namespace kwatch::core::probe {

// Bytes a trampoline takes at most (the controller's slot size).
inline constexpr uint32_t kMaxTrampolineBytes = 256;
// The x86-64 System V red zone under %rsp that a leaf function may use.
inline constexpr uint32_t kRedZoneBytes = 128;

struct Trampoline {
  RemoteAddr at;
  std::vector<uint8_t> code;       // to be written at `at`, executable
  uint32_t call_offset = 0;        // the `call *E(%rip)`
  uint32_t return_offset = 0;      // where the agent returns to (after the call)
  uint32_t displaced_offset = 0;   // the relocated instructions, then the jump back
  uint32_t jump_back_offset = 0;   // the jump back (== code end of the displaced part)
  uint32_t rip_slot_offset = 0;    // the 8-byte probe address
  uint32_t entry_slot_offset = 0;  // the 8-byte agent entry
  x86::Relocation displaced;

  RemoteAddr xol_addr() const { return at + displaced_offset; }
};

// Whether a trampoline at `at` can serve `plan`: the probe's jmp rel32 reaches it and every
// RIP-relative operand of the displaced instructions still reaches its target from it. For
// XolAreas::AllocateSlot's `fits`.
bool TrampolineFits(const JumpPlan& plan, RemoteAddr at);

// The trampoline at `at` for `plan`, KwProbe index `probe_index`, calling `agent_entry`
// (kwatch_agent_jump_hit, absolute, through a slot in the trampoline). OutOfRange when the
// probe's jmp cannot reach `at` or a RIP-relative operand's target is out of reach from it;
// InvalidArgument when the displaced instructions cannot move (the plan is stale).
absl::StatusOr<Trampoline> BuildTrampoline(const JumpPlan& plan, RemoteAddr at,
                                           uint32_t probe_index, RemoteAddr agent_entry);

// The displaced instructions alone, relocated to `at` and followed by the jump back to
// plan.addr + plan.len: what an INT3 hit runs while a jump probe is being removed, if the
// controller wants it elsewhere than in the trampoline (Trampoline::xol_addr() is one).
absl::StatusOr<std::vector<uint8_t>> BuildDisplacedCopy(const JumpPlan& plan, RemoteAddr at);

// The bytes of a jump probe at plan.addr: `jmp rel32` to the trampoline, then int3 up to
// plan.len (nothing may run there: no branch lands inside, no thread is stopped inside).
struct JumpPatch {
  RemoteAddr addr;
  uint32_t len = 0;
  std::vector<uint8_t> original;
  std::vector<uint8_t> patched;
};

// OutOfRange when `trampoline` is beyond a rel32 from plan.addr + 5.
absl::StatusOr<JumpPatch> BuildJumpPatch(const JumpPlan& plan, RemoteAddr trampoline);

// One write of a patch sequence; the controller serializes after each (with every thread
// stopped by ptrace, each write is; in-process, membarrier SYNC_CORE).
struct PatchStep {
  RemoteAddr addr;
  std::vector<uint8_t> bytes;
};

// text_poke_bp's order. Arm: 0xCC at addr; patched[1..len) ; patched[0] (0xE9).
// Remove: 0xCC at addr; original[1..len); original[0]. Between the steps a thread reaching
// addr traps (the agent sends it to the displaced copy; KwProbe kKwProbeRemoving).
std::vector<PatchStep> ArmSteps(const JumpPatch& patch);
std::vector<PatchStep> RemoveSteps(const JumpPatch& patch);

// The patch journal entry for `patch` (docs/agent.md "Arm"): every field but `state`, which
// the controller publishes (release) before it writes the code.
void FillKwPatch(const JumpPatch& patch, uint32_t probe_index, agent::KwPatch& out);

}  // namespace kwatch::core::probe
