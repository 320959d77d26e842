#include "watch/recording_sink.h"

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"

namespace kwatch::watch {

absl::Status RecordingFailed(const absl::Status& error) {
  return error.ok()
             ? absl::OkStatus()
             : absl::Status(error.code(), absl::StrCat("recording failed: ", error.message()));
}

absl::Status AccessRecordingSink::OnEvent(WatchSession& session, Summary& summary,
                                          const core::AccessEvent& ev,
                                          const core::AccessEvent& as_counted) {
  absl::Status out;
  if (error_.ok()) {
    if (!writer_.HasSite(ev.ip)) {
      error_ = writer_.AddSite(SiteRecordFor(session.symbolizer(), ev.ip));
    }
    // A per-call watch's accesses are recorded at their offsets in the call's object, as the
    // recording's one address per watch (0) and its profile count them.
    order_.Add(ev.call != 0 ? as_counted : ev);
    out = RecordingFailed(error_);
  }
  (void)next_.OnEvent(session, summary, ev, as_counted);
  return out;
}

absl::Status AccessRecordingSink::OnDrained() {
  if (error_.ok()) {
    error_ = order_.EndRound([&](const core::AccessEvent& e) { return writer_.Append(e); });
  }
  if (error_.ok()) {
    error_ = writer_.Flush();
    KW_RETURN_IF_ERROR(RecordingFailed(error_));
  }
  return next_.OnDrained();
}

void AccessRecordingSink::OnSummary(const AccessSummary& summary) {
  const RunInfo& info = summary.info;
  core::store::SessionEnd end;
  if (info.exit.has_value()) {
    end.exit_status = info.exit->ShellStatus();
  }
  end.exit_reason = info.stop_reason;
  end.lost_count = info.lost;
  if (error_.ok()) {
    error_ = order_.TakeAll([&](const core::AccessEvent& e) { return writer_.Append(e); });
  }
  const RecordingOutcome outcome = FinishRecording(writer_, error_, end);
  failed_ = !outcome.complete;
  if (on_end_) {
    on_end_(outcome);
  }
  next_.OnSummary(summary);
}

}  // namespace kwatch::watch
