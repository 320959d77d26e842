#pragma once

#include <functional>

#include "absl/status/status.h"
#include "core/event.h"
#include "core/store/round_order.h"
#include "core/store/trace_writer.h"
#include "watch/access_sink.h"
#include "watch/recording.h"
#include "watch/session.h"
#include "watch/summary.h"

namespace kwatch::watch {

// -o of a process watch session: records each event (with its site, once) and hands it to the
// next sink to show. Events reach the writer in time order (core/store/round_order.h: each
// drain, OnDrained, is a round; an event waits one drain at most), so that the recording's
// batches do not overlap in time and its profile snapshot serves `kwatch report` and the
// viewer whatever the number of rings. The recording is flushed after each drain; the summary
// hands it every event still held and ends it
// (FinishRecording) and hands the outcome to `on_end` before the next sink gets the summary.
// The first failure ends the session ("recording failed: ...") and stops the recording; the
// next sink still gets every event. The writer and the next sink outlive it; not thread-safe.
class AccessRecordingSink final : public AccessSink {
 public:
  using EndFn = std::function<void(const RecordingOutcome&)>;
  AccessRecordingSink(core::store::TraceWriter& writer, AccessSink& next, EndFn on_end)
      : writer_(writer), next_(next), on_end_(std::move(on_end)) {}

  // Whether -o was not honoured: a failure while recording, or at its end.
  bool failed() const { return failed_; }

  absl::Status OnEvent(WatchSession& session, Summary& summary, const core::AccessEvent& ev,
                       const core::AccessEvent& as_counted) override;
  void BeforeWait() override { next_.BeforeWait(); }
  absl::Status OnDrained() override;
  void OnNote(const AccessNote& note) override { next_.OnNote(note); }
  void OnSummary(const AccessSummary& summary) override;

 private:
  core::store::TraceWriter& writer_;
  AccessSink& next_;
  EndFn on_end_;
  core::store::RoundOrder<core::AccessEvent> order_;
  absl::Status error_;  // the first failure while recording
  bool failed_ = false;
};

// The stop reason of a session whose recording failed with `error`: "recording failed: ..."
// with the error's code; OK for OK.
absl::Status RecordingFailed(const absl::Status& error);

}  // namespace kwatch::watch
