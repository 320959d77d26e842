#pragma once

// Out-of-line (XOL) areas: anonymous read+execute mappings kwatch makes in a target to hold
// the copies of probed instructions and the return-probe trampoline.
//
// Layout of an area (kXolAreaSize bytes, filled with INT3 when created):
//   [0, kXolSlotSize)           the trampoline: an INT3 at offset 0 (return probes)
//   then slots of kXolSlotSize  one per probed address: at +0 the copy of the instruction and
//                               a jump back, at +kXolTrapOffset the copy and an INT3 (used
//                               when post handlers must run after it)
// Slots are never reused and areas are never unmapped while the image lives: a thread may
// still be inside a copy (blocked in a system call run out of line, say) long after its probe
// went, and the copy stays correct (it jumps back to the original code). A forked child keeps
// the areas too (fork copies them), which is what a child that forked from inside a copy needs.

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "core/base/remote_addr.h"
#include "core/ptrace/maps.h"

namespace kwatch::core::ptrace {
class Process;
}  // namespace kwatch::core::ptrace

namespace kwatch::core::probe {

inline constexpr uint64_t kXolAreaSize = uint64_t{64} * 1024;
inline constexpr uint64_t kXolSlotSize = 64;
inline constexpr uint64_t kXolTrapOffset = 32;
// Areas go within this distance of the probed code, so that RIP-relative operands of the code
// (which reach +-2 GiB) still reach their targets from a copy.
inline constexpr uint64_t kXolMaxDistance = 1ULL << 30;

// Where to map an area of `size` bytes (page multiple) as close as possible to `near` and
// within `max_distance` of it, from the target's current mappings: the top of a free gap
// (just below a mapping, never just below [stack], which grows down) or its bottom (never
// just above [heap], which grows up), a guard page away from neighbours. nullopt if none.
std::optional<RemoteAddr> FindXolGap(const std::vector<ptrace::MapEntry>& maps, RemoteAddr near,
                                     uint64_t size, uint64_t max_distance);

// The XOL areas of one target image. Not thread-safe; mapping needs the world stopped.
class XolAreas {
 public:
  struct Area {
    RemoteAddr start;
    uint64_t used = 0;  // bytes handed out, the trampoline included
  };

  // A free slot (kXolSlotSize bytes) for which `fits(slot)` holds, from an existing area or a
  // new one mapped near `near` by running mmap in stopped thread `tid` of `proc` (every other
  // thread stopped too). OutOfRange when even a new area's slot does not fit; errors of the
  // remote mmap name it.
  absl::StatusOr<RemoteAddr> AllocateSlot(ptrace::Process& proc, pid_t tid, RemoteAddr near,
                                          const std::function<bool(RemoteAddr)>& fits);

  // The trampoline of the first area, mapping one near `near` if there is none yet.
  absl::StatusOr<RemoteAddr> Trampoline(ptrace::Process& proc, pid_t tid, RemoteAddr near);

  // Whether `addr` lies in an area.
  bool Contains(RemoteAddr addr) const;
  // Whether `addr` is a trampoline.
  bool IsTrampoline(RemoteAddr addr) const;
  const std::vector<Area>& areas() const { return areas_; }
  // The target exec'd: its areas are gone.
  void Clear() { areas_.clear(); }

 private:
  absl::StatusOr<Area*> MapArea(ptrace::Process& proc, pid_t tid, RemoteAddr near);

  std::vector<Area> areas_;
};

}  // namespace kwatch::core::probe
