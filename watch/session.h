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
#include "watch/perf_breakpoint.h"

namespace kwatch::watch {

// What the user asked to watch.
struct WatchRequest {
  std::string expr;                   // as typed: "g_stats.hits", "&jiffies", "0x601040:4"
  drmgr::DrKind kind = drmgr::DrKind::kWrite;
  bool reads_only = false;            // --read: read-write in hardware, writes filtered out
  std::optional<uint64_t> length;     // --len: overrides the length of the expression's type
};

// A resolved, armed watch.
struct Watch {
  uint32_t id = 0;
  WatchRequest request;
  core::ResolvedExpr target;
};

struct SessionOptions {
  size_t ring_pages = 256;  // per event, power of two
};

// Watches of one target process in stream mode: one perf breakpoint event per watch and
// traced thread (inherit=1 covers threads created later). Owns the events and the symbols
// of the target. Not thread-safe; use it from the thread that owns the Process.
class WatchSession {
 public:
  // Resolves every expression against the target's symbols (read from the process now) and
  // checks that each fits one debug register. Nothing is armed yet.
  static absl::StatusOr<std::unique_ptr<WatchSession>> Create(core::Process& proc,
                                                              std::vector<WatchRequest> requests,
                                                              const SessionOptions& opts = {});

  // Stops every thread, opens the events on each of them, and resumes. All or nothing: on
  // error no event stays open.
  absl::Status Arm();

  // Closes every event (the target keeps running). Samples still in the rings are lost, so
  // Drain() first.
  void Disarm();
  bool armed() const { return !events_.empty(); }

  // Drains every ring, turns samples into events sorted by time, reads the watched values
  // (once per watch per batch, marked as read at drain time) and passes them to `sink`.
  // Returns the number of events delivered.
  size_t Drain(absl::FunctionRef<void(const core::AccessEvent&)> sink);

  // Descriptors that become readable when samples wait (for epoll).
  std::vector<int> Fds() const;

  // Samples the kernel dropped, summed over all rings (including disarmed ones).
  uint64_t lost() const;
  // Writes filtered out of --read watches.
  uint64_t filtered() const { return filtered_; }

  const std::vector<Watch>& watches() const { return watches_; }
  core::Symbolizer& symbolizer() { return *symbolizer_; }
  const core::Symbols& symbols() const { return *symbols_; }

 private:
  WatchSession(core::Process& proc, std::unique_ptr<core::Symbols> symbols,
               std::vector<Watch> watches, const SessionOptions& opts);

  struct Event {
    uint32_t watch_id;
    std::unique_ptr<PerfBreakpoint> bp;
  };

  core::Process& proc_;
  std::unique_ptr<core::Symbols> symbols_;
  std::unique_ptr<core::Symbolizer> symbolizer_;
  std::vector<Watch> watches_;
  SessionOptions opts_;
  std::vector<Event> events_;
  std::vector<core::AccessEvent> batch_;
  uint64_t lost_closed_ = 0;
  uint64_t filtered_ = 0;
};

}  // namespace kwatch::watch
