#include "watch/probe/hit_stacks.h"

#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "core/base/clock.h"
#include "core/base/status_macros.h"

namespace kwatch::watch::probe {

absl::StatusOr<std::unique_ptr<HitStacks>> HitStacks::ForProcess(pid_t pid,
                                                                 core::symbols::MemoryReader live) {
  std::unique_ptr<HitStacks> s(new HitStacks());
  s->live_ = std::move(live);
  HitStacks* self = s.get();
  KW_ASSIGN_OR_RETURN(
      s->unwinder_,
      core::symbols::Unwinder::ForProcess(
          pid, [self](core::RemoteAddr a, std::span<uint8_t> out) -> absl::Status {
            if (!self->from_copy_) {
              return self->live_ ? self->live_(a, out) : absl::UnavailableError("no live memory");
            }
            if (a.value < self->copy_base_ ||
                a.value - self->copy_base_ + out.size() > self->copy_.size()) {
              return absl::OutOfRangeError("beyond the stack copied at the hit");
            }
            std::memcpy(out.data(), self->copy_.data() + (a.value - self->copy_base_), out.size());
            return absl::OkStatus();
          }));
  return s;
}

std::vector<core::RemoteAddr> HitStacks::Unwind(pid_t tid, const user_regs_struct& regs,
                                                size_t frames) {
  from_copy_ = false;
  absl::StatusOr<std::vector<core::RemoteAddr>> got = unwinder_->Unwind(tid, regs, frames);
  if (!got.ok()) {
    ++errors_;
    return {};
  }
  return *std::move(got);
}

std::vector<core::RemoteAddr> HitStacks::UnwindCopy(pid_t tid, const user_regs_struct& regs,
                                                    std::span<const uint8_t> stack, size_t frames) {
  from_copy_ = true;
  copy_base_ = regs.rsp;
  copy_ = stack;
  absl::StatusOr<std::vector<core::RemoteAddr>> got = unwinder_->Unwind(tid, regs, frames);
  // A trace that ends early may have reached code mapped since the modules were reported
  // (libraries loaded after a launch, dlopen): report them again, at most every 100 ms.
  if (got.ok() && got->size() < frames) {
    const uint64_t now = core::MonotonicNs();
    if (now - last_refresh_ns_ > 100'000'000) {
      last_refresh_ns_ = now;
      if (unwinder_->Refresh().ok()) {
        got = unwinder_->Unwind(tid, regs, frames);
      }
    }
  }
  from_copy_ = false;
  copy_ = {};
  if (!got.ok()) {
    ++errors_;
    return {};
  }
  return *std::move(got);
}

}  // namespace kwatch::watch::probe
