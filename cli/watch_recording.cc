#include "cli/watch_recording.h"

#include <cstdio>
#include <string>

#include "absl/strings/str_format.h"
#include "version/version.h"

namespace kwatch::cli {

watch::RecordingSpec RecordingSpecFor(const WatchOptions& opts) {
  return watch::RecordingSpec{opts.output, opts.command_line, version::Full()};
}

std::string RecordingEndText(const watch::RecordingOutcome& outcome, bool hits) {
  const char* what = hits ? "probe hits" : "events";
  std::string out;
  if (!outcome.complete) {
    absl::StrAppendFormat(&out, "kwatch: error: %s\n", outcome.error.message());
    if (!outcome.kept_at.empty()) {
      absl::StrAppendFormat(&out,
                            "kwatch: the recording %s holds the %s committed before the failure; "
                            "`kwatch report %s` reads it\n",
                            outcome.kept_at, what, outcome.kept_at);
    }
    if (!outcome.previous.empty()) {
      absl::StrAppendFormat(&out,
                            "kwatch: %s, the recording that was there before, is left as it was\n",
                            outcome.previous);
    }
    return out;
  }
  if (!outcome.warning.empty()) {
    absl::StrAppendFormat(&out, "kwatch: warning: %s\n", outcome.warning);
  }
  absl::StrAppendFormat(&out, "kwatch: recorded %d %s to %s (kwatch report %s)\n",
                        hits ? outcome.hits : outcome.events, what, outcome.path, outcome.path);
  return out;
}

bool SayRecordingEnd(const watch::RecordingOutcome& outcome, bool hits) {
  std::fputs(RecordingEndText(outcome, hits).c_str(), stderr);
  return outcome.complete;
}

}  // namespace kwatch::cli
