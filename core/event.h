#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>

#include "absl/strings/string_view.h"
#include "core/base/remote_addr.h"

namespace kwatch::core {

// What an access did to the watched bytes. x86 reports no kind for read-write watchpoints;
// kwatch decodes the accessing instruction to tell reads from writes.
enum class AccessKind : uint8_t { kRead = 0, kWrite = 1, kExec = 2 };

inline absl::string_view AccessKindLetter(AccessKind k) {
  switch (k) {
    case AccessKind::kRead:
      return "r";
    case AccessKind::kWrite:
      return "w";
    case AccessKind::kExec:
      return "x";
  }
  return "?";
}

inline constexpr uint32_t kUnknownCpu = 0xffffffffU;

// One hardware-observed access, as a backend delivers it (plain data).
struct AccessEvent {
  uint64_t time_ns = 0;  // CLOCK_MONOTONIC, nanoseconds
  pid_t pid = 0;         // thread group of the accessing thread
  pid_t tid = 0;         // accessing thread
  uint32_t cpu = kUnknownCpu;
  uint32_t watch_id = 0;     // index of the watch in its session
  RemoteAddr trap_ip;        // where the CPU trapped: for data watchpoints, the next instruction
  RemoteAddr ip;             // the accessing instruction (trap_ip when it cannot be found)
  RemoteAddr addr;           // first watched byte of the hardware range that fired
  uint32_t len = 0;          // length of the hardware range that fired
  RemoteAddr access_addr;    // exact first byte the instruction touched (page mode), else addr
  uint32_t access_size = 0;  // bytes it touched; 0 when only the watched range is known
  AccessKind kind = AccessKind::kWrite;
  // Little-endian bytes after the access: of the accessed bytes when access_size is known
  // (at most 8), else of the watched range (at most 8).
  std::optional<uint64_t> value;
  std::optional<uint64_t> old_value;  // ... and before it (exact modes only)
  bool value_exact = false;           // true: read right at the access; false: at drain time
  uint32_t stack_id = 0;              // --stack: the session's backtrace of the access (0: none)
  // A per-call watch (--in FUNC): the call of FUNC whose object was accessed (from 1); 0 for
  // the others.
  uint32_t call = 0;
};

}  // namespace kwatch::core
