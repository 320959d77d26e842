#pragma once

#include <memory>
#include <vector>

#include "core/process.h"
#include "core/symbolizer.h"
#include "watch/backend.h"
#include "watch/perf_breakpoint.h"
#include "watch/session.h"

namespace kwatch::watch {

// Stream mode: one perf hardware-breakpoint event per watch and traced thread, inherited by
// threads created later, sampled into mmap ring buffers. The accessing instruction and the
// access kind of read-write watches come from decoding the code before the trap address.
class PerfBackend : public WatchBackend {
 public:
  PerfBackend(core::Process& proc, const std::vector<Watch>& watches, core::Symbolizer& symbolizer,
              const SessionOptions& opts)
      : proc_(proc), watches_(watches), symbolizer_(symbolizer), opts_(opts) {}

  BackendKind kind() const override { return BackendKind::kPerf; }
  absl::Status Arm() override;
  void Disarm() override;
  void Forget() override { Disarm(); }  // closing perf events is all there is
  std::vector<int> Fds() const override;
  void Collect(std::vector<core::AccessEvent>& out) override;
  uint64_t lost() const override;

 private:
  struct Event {
    uint32_t watch_id;
    std::unique_ptr<PerfBreakpoint> bp;
  };

  core::Process& proc_;
  const std::vector<Watch>& watches_;
  core::Symbolizer& symbolizer_;
  SessionOptions opts_;
  std::vector<Event> events_;
  uint64_t lost_closed_ = 0;
};

}  // namespace kwatch::watch
