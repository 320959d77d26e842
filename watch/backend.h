#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "core/event.h"

namespace kwatch::watch {

struct KernelAccessStats;  // watch/summary.h

// How the watches of a session are made real.
enum class BackendKind : uint8_t {
  kAuto,  // hardware breakpoints if this machine delivers their traps, else pages
  kPerf,  // perf_event_open hardware breakpoints, sampled into ring buffers (stream mode)
  kPage,  // page protection: mprotect + fault + single-step under ptrace, exact values
  kStop,  // stop mode: breakpoints as perf events with sigtrap, a ptrace stop per access, exact
};

absl::string_view BackendName(BackendKind kind);

// One way of observing accesses to the watches of a session. Owned by the session; used from
// the thread that owns the target's Process.
class WatchBackend {
 public:
  virtual ~WatchBackend() = default;

  virtual BackendKind kind() const = 0;
  // Installs the watches in the target (all or nothing).
  virtual absl::Status Arm() = 0;
  // Removes them; the target keeps running unchanged. Safe to call twice.
  virtual void Disarm() = 0;
  // The target replaced its image (exec): what was armed is gone with the old address
  // space. Drops it without touching the target.
  virtual void Forget() = 0;
  // Descriptors that become readable when events wait (for epoll); may be empty.
  virtual std::vector<int> Fds() const { return {}; }
  // Appends the events observed since the last call. Fields set: everything but `value`
  // for backends that cannot read values at the access (the session reads them).
  virtual void Collect(std::vector<core::AccessEvent>& out) = 0;
  // Events the backend knows it dropped.
  virtual uint64_t lost() const { return 0; }
  // Faults or traps that touched no watched byte (page mode: other data on the page).
  virtual uint64_t unrelated() const { return 0; }
  // Page mode: what the kernel did with protected pages in system calls; nullptr otherwise.
  virtual const KernelAccessStats* kernel_access() const { return nullptr; }

  // --stack: called while thread `tid` is stopped at an access the backend reports (exact
  // backends only); returns the id of the backtrace it took (AccessEvent::stack_id, 0: none).
  using StackHook = std::function<uint32_t(pid_t tid)>;
  void SetStackHook(StackHook hook) { stack_hook_ = std::move(hook); }

 protected:
  // Copied and moved only as part of an implementation (no slicing through the interface).
  WatchBackend() = default;
  WatchBackend(const WatchBackend&) = default;
  WatchBackend& operator=(const WatchBackend&) = default;
  WatchBackend(WatchBackend&&) = default;
  WatchBackend& operator=(WatchBackend&&) = default;

  uint32_t CaptureStack(pid_t tid) const { return stack_hook_ ? stack_hook_(tid) : 0; }

 private:
  StackHook stack_hook_;
};

}  // namespace kwatch::watch
