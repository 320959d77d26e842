#pragma once

// Where a SIGTRAP that reached a traced thread came from, so that kwatch delivers the
// target's own traps and absorbs only the debug exceptions nothing explains.
//
// On the project's machines about one hardware-breakpoint hit in a few million raises a
// debug exception (#DB) with no cause bits in DR6. The kernel then sends the thread SIGTRAP
// with si_code TRAP_BRKPT, exactly as for an `icebp` (int1) instruction the program executed,
// and a target without a SIGTRAP handler dies of it. The two differ only in the byte before
// the interrupted instruction pointer: 0xF1 for icebp.
//
// Hosts differ in how they report an icebp (HostIcebpKind): on most, the trap comes after
// the instruction (the 0xF1 byte is just before the instruction pointer); some hypervisors
// report it as a fault, with the instruction pointer on the icebp itself, so that returning
// from a handler runs it again; some drop it. The evidence is read the host's way.

#include <csignal>
#include <cstddef>
#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kwatch::core::ptrace {

enum class TrapOrigin {
  kSentByProcess,       // kill, tgkill, raise, sigqueue (si_code <= 0)
  kInt3,                // an int3 the program executed itself (SI_KERNEL)
  kIcebp,               // an icebp/int1 the program executed itself
  kSingleStep,          // the program set the trap flag itself (TRAP_TRACE)
  kHardwareBreakpoint,  // a debug register hit the kernel attributes (TRAP_HWBKPT or DR6 bits)
  kPerfSigtrap,         // a perf event the program opened with sigtrap=1 (TRAP_PERF)
  kKwatchBreakpoint,    // a late trap of kwatch's own breakpoint (TRAP_PERF with kwatch's data)
  kSpurious,            // a debug exception with no cause at all
  kOther,               // any other kernel code (branch trace, unknown): delivered
};

// What kwatch can read about one SIGTRAP signal-delivery stop.
struct TrapEvidence {
  int si_code = 0;
  // The byte just before the thread's instruction pointer, when readable.
  std::optional<uint8_t> byte_before_ip;
  // The byte at the thread's instruction pointer, when readable (read on fault hosts only).
  std::optional<uint8_t> byte_at_ip;
  // The thread's DR6 as ptrace shows it (the kernel's virtual DR6).
  uint64_t dr6 = 0;
  // TRAP_PERF: the event's perf_event_attr.sig_data (SiPerfData).
  uint64_t perf_data = 0;
};

// TRAP_PERF (Linux 5.13): the si_code of the SIGTRAP a perf event opened with sigtrap=1 sends
// the thread it fired in, and where siginfo_t carries that event's sig_data
// (_sigfault._perf._data: after si_addr and the 8 bytes of its union on x86-64). glibc 2.36
// names neither; everything in kwatch uses these.
inline constexpr int kTrapPerf = 6;
inline constexpr size_t kSiPerfDataOffset = 24;

// The sig_data of a TRAP_PERF siginfo (meaningless for other codes).
uint64_t SiPerfData(const siginfo_t& si);

// kwatch's own sigtrap breakpoints (watch/trap_breakpoints.h) carry this magic in the upper
// 32 bits of their sig_data ("kwat"); the lower 32 bits name the breakpoint.
inline constexpr uint64_t kKwatchSigDataMagic = uint64_t{0x6b776174} << 32;
inline constexpr bool IsKwatchSigData(uint64_t data) {
  return (data >> 32) == (kKwatchSigDataMagic >> 32);
}

// How this host reports an icebp (int1, 0xF1) the program executes.
enum class IcebpKind {
  kTrap,     // SIGTRAP TRAP_BRKPT with the instruction pointer after the icebp (bare metal)
  kFault,    // SIGTRAP TRAP_BRKPT with the instruction pointer on the icebp (some hypervisors)
  kDropped,  // no signal at all: the hypervisor swallows the debug exception
};

absl::string_view IcebpKindName(IcebpKind k);

// Finds out, once per process (cached, thread-safe), how this host reports an icebp: a forked
// child executes one under a SIGTRAP handler that steps over it, with a 2 s time limit. The
// child is waited for by pid, so callers must not be racing a waitpid(-1) in another thread.
// An error (fork failed, the child died) names what went wrong; callers then assume kTrap.
absl::StatusOr<IcebpKind> HostIcebpKind();

// Classifies with the icebp evidence read as `icebp` says: the byte before the instruction
// pointer on trap hosts, the byte at it on fault hosts; on hosts that drop icebp, a
// TRAP_BRKPT without cause bits is never an icebp.
TrapOrigin ClassifySigtrap(const TrapEvidence& e, IcebpKind icebp = IcebpKind::kTrap);

// Whether a trap of this origin is the target's own business (delivered unchanged). A late
// trap of kwatch's own breakpoint (raised before kwatch closed it, arriving after the
// backend that armed it let go) is not: it would kill a target without a SIGTRAP handler.
inline bool DeliverTrap(TrapOrigin o) {
  return o != TrapOrigin::kSpurious && o != TrapOrigin::kKwatchBreakpoint;
}

absl::string_view TrapOriginName(TrapOrigin o);

}  // namespace kwatch::core::ptrace
