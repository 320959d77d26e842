#pragma once

#include <array>
#include <cstdint>

#include "absl/status/statusor.h"
#include "drmgr/debug_regs.h"

namespace kwatch::drmgr {

// Typed views of the x86 debug control (DR7) and status (DR6) registers, with their exact
// bit layout (Intel SDM vol. 3, "Debug Registers": DR7 and DR6):
//
//   DR7 bit 2i   Li   local enable of slot i        DR6 bit i    Bi  slot i condition met
//       bit 2i+1 Gi   global enable of slot i            bit 13   BD  debug-register access
//       bit 8/9  LE/GE exact-breakpoint hints            bit 14   BS  single step
//       bit 10   reserved, reads as 1                   bit 15   BT  task switch
//       bit 11   RTM                                    bit 16   RTM (0 = inside RTM)
//       bit 13   GD   general detect                   bits 4-11, 17-31 read as 1
//       bits 16+4i..17+4i  R/Wi (00 exec, 01 write, 10 I/O, 11 read-write)
//       bits 18+4i..19+4i  LENi (00 1 byte, 01 2, 10 8, 11 4)
//
// Pure encoding; no register is read or written here.

inline constexpr uint64_t kDr7ReservedOne = uint64_t{1} << 10;
inline constexpr uint64_t kDr6ReservedOnes = 0xFFFF0FF0;  // DR6 after a reset (RTM bit set)

// One DR7 slot. A slot is enabled when `local` or `global` is set.
struct Dr7Slot {
  bool local = false;
  bool global = false;
  DrKind kind = DrKind::kExec;
  DrLen len = DrLen::k1;

  bool enabled() const { return local || global; }
  bool operator==(const Dr7Slot&) const = default;
};

struct Dr7 {
  std::array<Dr7Slot, kNumDebugRegisters> slots;
  bool local_exact = false;     // LE
  bool global_exact = false;    // GE
  bool rtm = false;             // RTM: debug exceptions inside transactions
  bool general_detect = false;  // GD: trap on MOV to/from debug registers

  bool operator==(const Dr7&) const = default;
};

// A slot for a data or execute breakpoint of `len` bytes (1, 2, 4 or 8; 1 for kExec).
// Enabled locally, as Linux (ptrace and perf) does for user and kernel breakpoints.
Dr7Slot LocalSlot(DrKind kind, uint64_t len);

// The DR7 value, with the reserved bit 10 set. InvalidArgument when an execute slot has a
// length other than 1 byte (LEN must be 00 for instruction breakpoints); nothing else can be
// wrong in a typed Dr7.
absl::StatusOr<uint64_t> EncodeDr7(const Dr7& dr7);

// Decodes a DR7 value. InvalidArgument for an I/O breakpoint (R/W = 10, needs CR4.DE), an
// execute slot with LEN != 00, or a set bit that must be zero (12, 14, 15, 32-63). Bit 10
// may be clear (ptrace accepts and reports values without it).
absl::StatusOr<Dr7> DecodeDr7(uint64_t raw);

// Length in bytes of a DR7 LEN encoding.
uint64_t DrLenBytes(DrLen len);

struct Dr6 {
  std::array<bool, kNumDebugRegisters> hit{};  // B0..B3
  bool debug_register_access = false;          // BD
  bool single_step = false;                    // BS
  bool task_switch = false;                    // BT
  bool in_rtm = false;                         // RTM bit clear

  // No cause bit at all: a spurious debug exception (DESIGN.md: about one in a few million
  // breakpoint hits on the project's machines arrives so).
  bool Spurious() const;
  bool operator==(const Dr6&) const = default;
};

// Decodes DR6; reserved bits are ignored.
Dr6 DecodeDr6(uint64_t raw);

// DR6 as the processor reports it: the reserved-one bits (0xFFFF0FF0) plus the cause bits.
uint64_t EncodeDr6(const Dr6& dr6);

}  // namespace kwatch::drmgr
