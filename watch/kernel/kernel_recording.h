#pragma once

#include <sys/types.h>

#include <memory>
#include <span>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/event.h"
#include "core/kernel/kernel_symbols.h"
#include "core/store/round_order.h"
#include "core/store/trace_writer.h"
#include "watch/kernel/kernel_event.h"
#include "watch/kernel/kernel_session.h"
#include "watch/kernel/task_names.h"
#include "watch/recording.h"

namespace kwatch::watch::kernel {

// Creates the recording of a kernel session at spec.path (backend "perf"; mode "kernel" for
// kernel watches, `pid` 0, or "kernel-accesses" for the process `pid`), with one write watch
// row per watch, its coverage the CPUs it holds registers on (kernel watches). Errors: the
// writer's.
absl::StatusOr<std::unique_ptr<core::store::TraceWriter>> CreateKernelRecording(
    const RecordingSpec& spec, pid_t pid, std::span<const KernelWatch> watches);

// The recording's event for one event of watch `w` (event.watch), after adding its site to
// `writer` (once per IP: function, offset and file:line as `symbols` locates them) and its
// task's name (`names`). The event's ip is the trap IP: x86 reports data breakpoints after the
// access, and kwatch does not read kernel code to find the instruction before it. It is a
// write of the watched range (recordings take kernel --write watches only) with the value read
// at drain time, when there is one (not exact).
absl::StatusOr<core::AccessEvent> KernelEventForRecording(
    core::store::TraceWriter& writer, core::kernel::KernelSymbolResolver& symbols, TaskNames& names,
    const KernelWatch& w, const KernelEvent& ev);

// -o of a kernel session: records each event and hands it to the next sink to show; events
// reach the writer in time order (core/store/round_order.h, each step a round: the CPUs'
// rings interleave), and the recording is flushed after each step. The first failure ends the
// session ("recording failed: ...") and stops the recording; the next sink still gets every event.
// Finish ends the recording after the session's end. The writer, resolver, names and next sink
// outlive it; not thread-safe.
class KernelRecordingSink final : public KernelEventSink {
 public:
  KernelRecordingSink(core::store::TraceWriter& writer, core::kernel::KernelSymbolResolver& symbols,
                      TaskNames& names, KernelEventSink& next)
      : writer_(writer), symbols_(symbols), names_(names), next_(next) {}

  absl::Status OnEvent(const KernelEvent& ev, const KernelWatch& w) override;
  void OnDrained() override { next_.OnDrained(); }
  absl::Status OnStepEnd() override;
  void OnNote(const KernelNote& note) override { next_.OnNote(note); }
  void OnSummary(const KernelSummary& summary, std::span<const KernelWatch> watches) override {
    next_.OnSummary(summary, watches);
  }

  // Ends the recording (FinishRecording) with how the session ended.
  RecordingOutcome Finish(const KernelSessionEnd& end);

 private:
  core::store::TraceWriter& writer_;
  core::kernel::KernelSymbolResolver& symbols_;
  TaskNames& names_;
  KernelEventSink& next_;
  core::store::RoundOrder<core::AccessEvent> order_;
  absl::Status error_;  // the first failure
};

}  // namespace kwatch::watch::kernel
