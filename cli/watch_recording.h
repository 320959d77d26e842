#pragma once

#include <sys/types.h>

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cli/watch_options.h"
#include "core/store/trace_writer.h"
#include "watch/access_sink.h"
#include "watch/session.h"

namespace kwatch::cli {

// Creates the recording of a process watch session (-o) at opts.output, with one watch row per
// watch of `session` (drmgr's placement as its coverage) on process `pid`.
absl::StatusOr<std::unique_ptr<core::TraceWriter>> CreateWatchRecording(
    const WatchOptions& opts, const watch::WatchSession& session, pid_t pid);

// -o: records each event (with its site, once) before the next sink shows it, flushes the
// recording after each drain, and at the summary ends the recording (the end record, or what
// was kept after a failure; said on stderr) before the next sink prints the summary. The first
// failure ends the session ("recording failed: ...") and stops the recording; the next sink
// still gets every event. The writer and the next sink outlive it.
class AccessRecordingSink final : public watch::AccessSink {
 public:
  AccessRecordingSink(core::TraceWriter& writer, watch::AccessSink& next)
      : writer_(writer), next_(next) {}

  // Whether -o was not honoured (kwatch then exits 1): a failure while recording, or at its end.
  bool failed() const { return failed_; }

  absl::Status OnEvent(watch::WatchSession& session, watch::Summary& summary,
                       const core::AccessEvent& ev, const core::AccessEvent& as_counted) override;
  void BeforeWait() override { next_.BeforeWait(); }
  absl::Status OnDrained() override;
  void OnNote(const watch::AccessNote& note) override { next_.OnNote(note); }
  void OnSummary(const watch::AccessSummary& summary) override;

 private:
  // The first failure as the session's stop reason; OK when none.
  absl::Status Failed() const;

  core::TraceWriter& writer_;
  watch::AccessSink& next_;
  absl::Status error_;  // the first failure while recording
  bool failed_ = false;
};

}  // namespace kwatch::cli
