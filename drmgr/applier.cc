#include "drmgr/applier.h"

#include <utility>

#include "absl/status/statusor.h"
#include "drmgr/debug_regs.h"
#include "drmgr/slot_allocator.h"

namespace kwatch::drmgr {

absl::Status ApplyWithRetry(SlotAllocator& alloc, Applier& applier, Changes changes) {
  for (int tries = 0;; ++tries) {
    absl::Status s = applier.Apply(changes);
    const std::optional<Scope> refused = applier.refused_scope();
    if (s.ok() || !absl::IsResourceExhausted(s) || !refused.has_value() ||
        tries > kNumDebugRegisters) {
      return s;
    }
    // The kernel counts a register kwatch does not hold (a debugger, another tool).
    absl::StatusOr<Changes> next = alloc.ReportNoSpace(*refused);
    if (!next.ok()) {
      return s;
    }
    changes = *std::move(next);
  }
}

}  // namespace kwatch::drmgr
