#include "core/trap_origin.h"

#include <signal.h>

#include <cstring>

namespace kwatch::core {
namespace {

constexpr uint8_t kIcebpOpcode = 0xF1;
// DR6: B0-B3 (a slot matched), BD (debug-register access), BS (single step), BT (task switch).
constexpr uint64_t kDr6CauseBits = 0xFULL | (1ULL << 13) | (1ULL << 14) | (1ULL << 15);

}  // namespace

uint64_t SiPerfData(const siginfo_t& si) {
  static_assert(kSiPerfDataOffset + sizeof(uint64_t) <= sizeof(siginfo_t));
  uint64_t data = 0;
  std::memcpy(&data, reinterpret_cast<const char*>(&si) + kSiPerfDataOffset, sizeof(data));
  return data;
}

TrapOrigin ClassifySigtrap(const TrapEvidence& e) {
  if (e.si_code <= 0) {
    return TrapOrigin::kSentByProcess;
  }
  switch (e.si_code) {
    case SI_KERNEL:
      return TrapOrigin::kInt3;
    case TRAP_TRACE:
      return TrapOrigin::kSingleStep;
    case TRAP_HWBKPT:
      return TrapOrigin::kHardwareBreakpoint;
    case kTrapPerf:
      return IsKwatchSigData(e.perf_data) ? TrapOrigin::kKwatchBreakpoint
                                          : TrapOrigin::kPerfSigtrap;
    case TRAP_BRKPT:
      if (e.byte_before_ip == kIcebpOpcode) {
        return TrapOrigin::kIcebp;
      }
      if ((e.dr6 & kDr6CauseBits) != 0) {
        return TrapOrigin::kHardwareBreakpoint;
      }
      // Unreadable code is not evidence of an icebp: nothing explains the trap.
      return TrapOrigin::kSpurious;
    default:
      return TrapOrigin::kOther;
  }
}

absl::string_view TrapOriginName(TrapOrigin o) {
  switch (o) {
    case TrapOrigin::kSentByProcess:
      return "sent by a process";
    case TrapOrigin::kInt3:
      return "int3 executed by the program";
    case TrapOrigin::kIcebp:
      return "icebp executed by the program";
    case TrapOrigin::kSingleStep:
      return "single step set by the program";
    case TrapOrigin::kHardwareBreakpoint:
      return "hardware breakpoint";
    case TrapOrigin::kPerfSigtrap:
      return "perf event sigtrap";
    case TrapOrigin::kKwatchBreakpoint:
      return "late trap of a kwatch breakpoint";
    case TrapOrigin::kSpurious:
      return "spurious debug exception";
    case TrapOrigin::kOther:
      return "other kernel trap";
  }
  return "?";
}

}  // namespace kwatch::core
