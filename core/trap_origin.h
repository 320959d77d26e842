// Where a SIGTRAP that reached a traced thread came from, so that kwatch delivers the
// target's own traps and absorbs only the debug exceptions nothing explains.
//
// On the project's machines about one hardware-breakpoint hit in a few million raises a
// debug exception (#DB) with no cause bits in DR6. The kernel then sends the thread SIGTRAP
// with si_code TRAP_BRKPT, exactly as for an `icebp` (int1) instruction the program executed,
// and a target without a SIGTRAP handler dies of it. The two differ only in the byte before
// the interrupted instruction pointer: 0xF1 for icebp.
#ifndef KWATCH_CORE_TRAP_ORIGIN_H_
#define KWATCH_CORE_TRAP_ORIGIN_H_

#include <cstdint>
#include <optional>

#include "absl/strings/string_view.h"

namespace kwatch::core {

enum class TrapOrigin {
  kSentByProcess,       // kill, tgkill, raise, sigqueue (si_code <= 0)
  kInt3,                // an int3 the program executed itself (SI_KERNEL)
  kIcebp,               // an icebp/int1 the program executed itself
  kSingleStep,          // the program set the trap flag itself (TRAP_TRACE)
  kHardwareBreakpoint,  // a debug register hit the kernel attributes (TRAP_HWBKPT or DR6 bits)
  kPerfSigtrap,         // a perf event the program opened with sigtrap=1 (TRAP_PERF)
  kSpurious,            // a debug exception with no cause at all
  kOther,               // any other kernel code (branch trace, unknown): delivered
};

// What kwatch can read about one SIGTRAP signal-delivery stop.
struct TrapEvidence {
  int si_code = 0;
  // The byte just before the thread's instruction pointer, when readable.
  std::optional<uint8_t> byte_before_ip;
  // The thread's DR6 as ptrace shows it (the kernel's virtual DR6).
  uint64_t dr6 = 0;
};

TrapOrigin ClassifySigtrap(const TrapEvidence& e);

// Whether a trap of this origin is the target's own business (delivered unchanged).
inline bool DeliverTrap(TrapOrigin o) { return o != TrapOrigin::kSpurious; }

absl::string_view TrapOriginName(TrapOrigin o);

}  // namespace kwatch::core

#endif  // KWATCH_CORE_TRAP_ORIGIN_H_
