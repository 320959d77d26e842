#pragma once

// `kwatch probe --stack`: the user stack of a hit, unwound with the process's CFI (libdw,
// core/symbols/unwind.h) either from the live thread, stopped at the hit (ptrace, --hw), or
// from a copy of its registers and stack taken at the hit (the agent's record, the uprobe
// sample): the thread has moved on by the time kwatch reads those.

#include <sys/types.h>
#include <sys/user.h>

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "core/base/remote_addr.h"
#include "core/symbols/symbols.h"
#include "core/symbols/unwind.h"

namespace kwatch::watch::probe {

// Where frame `i` of an unwound stack is looked up: frame 0 is where the thread stopped; the
// others are return addresses, looked up one byte back to name the call (it may be the
// caller's last instruction).
inline core::RemoteAddr FrameLookupAddress(const std::vector<core::RemoteAddr>& frames, size_t i) {
  return i == 0 ? frames[i] : core::RemoteAddr{frames[i].value - 1};
}

// Not thread-safe.
class HitStacks {
 public:
  // `live` reads the process's memory (null: only copies are unwound).
  static absl::StatusOr<std::unique_ptr<HitStacks>> ForProcess(pid_t pid,
                                                               core::symbols::MemoryReader live);

  // The stack of `tid`, stopped at the hit with `regs`: at most `frames` code addresses,
  // innermost first (frame 0: regs.rip; the others are return addresses). Empty when not even
  // frame 0 unwinds (counted in errors()).
  std::vector<core::RemoteAddr> Unwind(pid_t tid, const user_regs_struct& regs, size_t frames);
  // The same from `stack`, the bytes from regs.rsp up copied at the hit: frames whose stack
  // lies beyond the copy end the trace.
  std::vector<core::RemoteAddr> UnwindCopy(pid_t tid, const user_regs_struct& regs,
                                           std::span<const uint8_t> stack, size_t frames);

  // After the target mapped code (dlopen): the modules are reported again.
  void Refresh() { (void)unwinder_->Refresh(); }
  uint64_t errors() const { return errors_; }

 private:
  HitStacks() = default;

  std::unique_ptr<core::symbols::Unwinder> unwinder_;
  core::symbols::MemoryReader live_;
  // The copy UnwindCopy reads from (empty: the live reader).
  uint64_t copy_base_ = 0;
  std::span<const uint8_t> copy_;
  bool from_copy_ = false;
  uint64_t errors_ = 0;
  uint64_t last_refresh_ns_ = 0;
};

}  // namespace kwatch::watch::probe
