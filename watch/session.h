#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/event.h"
#include "core/process.h"
#include "core/symbolizer.h"
#include "core/symbols.h"
#include "drmgr/debug_regs.h"
#include "watch/backend.h"

namespace kwatch::watch {

// What the user asked to watch.
struct WatchRequest {
  std::string expr;  // as typed: "g_stats.hits", "&jiffies", "0x601040:4"
  drmgr::DrKind kind = drmgr::DrKind::kWrite;
  bool reads_only = false;         // --read: read-write in hardware, writes filtered out
  std::optional<uint64_t> length;  // --len: overrides the length of the expression's type
};

// A resolved, armed watch.
struct Watch {
  uint32_t id = 0;
  WatchRequest request;
  core::ResolvedExpr target;
};

struct SessionOptions {
  BackendKind backend = BackendKind::kAuto;
  size_t ring_pages = 256;      // per event, power of two
  uint32_t wakeup_events = 64;  // samples per wakeup; a periodic drain picks up the rest
};

// Watches of one target process. Resolves expressions against the target's symbols and
// runs them through one backend (perf stream mode, or page protection). Owns the backend and
// the symbols. Not thread-safe; use it from the thread that owns the Process.
class WatchSession {
 public:
  // Resolves every expression against the target's symbols (read from the process now),
  // checks that each fits the backend, and picks the backend (kAuto: hardware breakpoints
  // when this machine delivers their traps, else page protection, with a note saying why).
  // Nothing is armed yet.
  static absl::StatusOr<std::unique_ptr<WatchSession>> Create(core::Process& proc,
                                                              std::vector<WatchRequest> requests,
                                                              const SessionOptions& opts = {});
  ~WatchSession();

  // Installs the watches (all or nothing).
  absl::Status Arm();
  // Removes them; the target keeps running. Drain() first: perf samples still in the rings
  // are dropped.
  void Disarm();
  bool armed() const { return armed_; }
  // After the target's exec: the watches ended with the old image (nothing is restored).
  void Forget();

  // Collects what the backend observed, sorted by time, fills in values where the backend
  // could not (perf: read once per watch per batch, at drain time), filters writes out of
  // --read watches, and passes each event to `sink`. Returns the number delivered.
  size_t Drain(absl::FunctionRef<void(const core::AccessEvent&)> sink);

  std::vector<int> Fds() const { return backend_->Fds(); }
  uint64_t lost() const { return backend_->lost(); }
  uint64_t unrelated() const { return backend_->unrelated(); }
  // Page mode: what the kernel did with the protected pages in system calls; null otherwise.
  const KernelAccessStats* kernel_access() const { return backend_->kernel_access(); }
  uint64_t filtered() const { return filtered_; }
  BackendKind backend() const { return backend_->kind(); }
  // A line for the user about the backend ("note: ..." why auto chose it, "warning: ..."
  // when a forced backend cannot work here), "" when there is nothing to say.
  const std::string& backend_note() const { return backend_note_; }

  const std::vector<Watch>& watches() const { return watches_; }
  core::Symbolizer& symbolizer() { return *symbolizer_; }
  const core::Symbols& symbols() const { return *symbols_; }

 private:
  WatchSession(core::Process& proc, std::unique_ptr<core::Symbols> symbols,
               std::vector<Watch> watches);

  core::Process& proc_;
  std::unique_ptr<core::Symbols> symbols_;
  std::unique_ptr<core::Symbolizer> symbolizer_;
  std::vector<Watch> watches_;
  std::unique_ptr<WatchBackend> backend_;
  std::string backend_note_;
  bool armed_ = false;
  std::vector<core::AccessEvent> batch_;
  uint64_t filtered_ = 0;
};

}  // namespace kwatch::watch
