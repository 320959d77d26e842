#pragma once

// The jump optimizer: whether a probe may replace the whole instructions covering 5 bytes from
// its address with `jmp rel32` to a trampoline (docs/agent.md "Jump probe"), as the kernel's
// kprobe optimizer decides (arch/x86/kernel/kprobes/opt.c, can_optimize): decode the whole
// function from its symbol bounds and refuse what could reach the overwritten bytes other than
// through their first one, or what cannot run elsewhere. A refused probe takes the INT3 path;
// the refusal says why, naming the instruction and its address. Pure functions over bytes and
// addresses (absolute, as in the target); nothing here touches a process. Thread-safe.

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/base/remote_addr.h"
#include "core/x86/relocator.h"

namespace kwatch::core::probe {

inline constexpr uint32_t kJumpPatchBytes = 5;  // jmp rel32
// The most bytes a jump probe displaces (agent::KwPatch holds 16).
inline constexpr uint32_t kMaxDisplacedBytes = 16;

// A function's code as the program has it: the ELF file's bytes (or the target's memory with
// kwatch's own INT3 bytes put back: any other 0xCC makes the optimizer refuse).
struct FunctionCode {
  std::string name;                // for messages ("" when unknown)
  RemoteAddr start;                // absolute address of bytes[0]
  std::span<const uint8_t> bytes;  // the symbol's size
};

struct JumpOptions {
  x86::CallMode call_mode = x86::CallMode::kPushReturn;
  // Other code that may branch into the function, decoded for branches into the range as the
  // function is: its cold part (FUNC.cold), other functions of the file kwatch can see.
  std::vector<FunctionCode> other_code;
  // Addresses control reaches without a branch in any code given: exception landing pads
  // (.gcc_except_table), setjmp returns, code pointers in data.
  std::vector<RemoteAddr> entries;
  // kwatch's other probes (INT3 or jump): none may lie inside the range.
  std::vector<RemoteAddr> other_probes;
  // Reads the image's bytes at an absolute address (the ELF file's: Symbols::ReadCode), to
  // prove where an indirect jmp may go (ProveJumpTable). Without it, any indirect jmp in the
  // function refuses the probe.
  std::function<absl::Status(RemoteAddr, std::span<uint8_t>)> read_image;
};

// Why a probe may not take a jump, in the order PlanJumpProbe checks.
enum class JumpRefusal : uint8_t {
  kNone,
  kOutsideFunction,  // the address is not in the function's bytes
  kUndecodable,      // the function does not decode linearly (data in code)
  kBreakpoint,       // an int3 in the function hides the bytes under it
  kNotOnBoundary,    // the address is inside an instruction
  kTooShort,         // fewer than 5 bytes of whole instructions before the function's end
  kTooLong,          // the whole instructions covering 5 bytes take more than 16
  kBranchIntoRange,  // a jmp/jcc/call/loop somewhere targets a byte after the first
  kAddressTaken,     // a RIP-relative operand points there (computed goto, code pointer)
  kEntryInside,      // a landing pad or other entry of JumpOptions::entries is there
  kProbeInside,      // another probe of kwatch's is there
  kCallInside,       // a call that is not the range's last instruction (returns into it)
  kFlowEndsInside,   // jmp/ret before the range's end: the bytes after it have other entries
  kUnrelocatable,    // an instruction of the range cannot run elsewhere
  kIndirectJump,     // a jmp * in the function whose targets cannot be proven
  kThreadInside,     // CheckThreadsOutside: a thread stopped in the range
};

// "branch_into_range", ... (for JSON and tests).
std::string_view JumpRefusalName(JumpRefusal refusal);

// An accepted jump probe: the bytes its jmp overwrites, whole instructions.
struct JumpPlan {
  RemoteAddr addr;                     // the probed instruction: the patch starts here
  uint32_t len = 0;                    // displaced bytes, kJumpPatchBytes..kMaxDisplacedBytes
  std::vector<uint8_t> original;       // the `len` bytes at addr
  std::vector<std::string> insn_text;  // the displaced instructions, AT&T
  x86::CallMode call_mode = x86::CallMode::kPushReturn;
  std::string function;  // the function's name (messages)
  RemoteAddr function_start;
};

struct JumpDecision {
  std::optional<JumpPlan> plan;  // set when the probe may take a jump
  JumpRefusal refusal = JumpRefusal::kNone;
  RemoteAddr culprit;  // the instruction or address the refusal names (0 when none)
  std::string reason;  // for the summary: what was refused, naming instruction and address
};

// Where the indirect jmp at `jmp` (an instruction of fn) may go, proven from the code before it
// and the table it reads, for the two forms compilers emit for a switch:
//   cmp $N,%rI (or %eI with mov %eI,%eI after); ja/jae default; [mov %eI,%eI]
//   lea T(%rip),%rB; movslq (%rB,%rI,4),%rX; add %rB,%rX; jmp *%rX    (PIC: T + int32 entries)
//   cmp $N,...; ja/jae default; [mov %eI,%eI]; jmp *T(,%rI,8)          (absolute entries)
// with no branch landing between the cmp and the jmp. The bound gives the entry count; every
// entry must be an instruction of fn or of options.other_code. InvalidArgument saying what
// does not match (the probe then refuses on the indirect jmp).
absl::StatusOr<std::vector<RemoteAddr>> ProveJumpTable(const FunctionCode& fn, RemoteAddr jmp,
                                                       const JumpOptions& options);

// Decides for a probe at `probe` in `fn`. Never fails: a refusal is a decision (INT3 path).
JumpDecision PlanJumpProbe(const FunctionCode& fn, RemoteAddr probe,
                           const JumpOptions& options = {});

// Where a stopped thread is (its rip, absolute).
struct ThreadRip {
  pid_t tid = 0;
  RemoteAddr rip;
};

// The optimizer's last check, with every thread of the target stopped, just before patching:
// OK when no thread's rip lies inside (addr, addr + len) (at addr itself it will run the jmp);
// FailedPrecondition naming the thread and its rip otherwise (the probe takes the INT3 path).
absl::Status CheckThreadsOutside(const JumpPlan& plan, std::span<const ThreadRip> threads);

}  // namespace kwatch::core::probe
