#include "cli/watch_recording.h"

#include <cstdio>

#include "absl/strings/str_format.h"
#include "version/version.h"

namespace kwatch::cli {

watch::RecordingSpec RecordingSpecFor(const WatchOptions& opts) {
  return watch::RecordingSpec{opts.output, opts.command_line, version::Full()};
}

bool SayRecordingEnd(const watch::RecordingOutcome& outcome, bool hits) {
  const char* what = hits ? "probe hits" : "events";
  if (!outcome.complete) {
    absl::FPrintF(stderr, "kwatch: error: %s\n", outcome.error.message());
    if (!outcome.kept_at.empty()) {
      absl::FPrintF(stderr,
                    "kwatch: the recording %s holds the %s committed before the failure; "
                    "`kwatch report %s` reads it\n",
                    outcome.kept_at, what, outcome.kept_at);
    }
    if (!outcome.previous.empty()) {
      absl::FPrintF(stderr, "kwatch: %s, the recording that was there before, is left as it was\n",
                    outcome.previous);
    }
    return false;
  }
  if (!outcome.warning.empty()) {
    absl::FPrintF(stderr, "kwatch: warning: %s\n", outcome.warning);
  }
  absl::FPrintF(stderr, "kwatch: recorded %d %s to %s (kwatch report %s)\n",
                hits ? outcome.hits : outcome.events, what, outcome.path, outcome.path);
  return true;
}

}  // namespace kwatch::cli
