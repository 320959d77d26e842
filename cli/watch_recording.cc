#include "cli/watch_recording.h"

#include <cstdio>

#include "absl/strings/str_format.h"

#ifndef KWATCH_VERSION
#define KWATCH_VERSION "dev"
#endif

namespace kwatch::cli {

watch::RecordingSpec RecordingSpecFor(const WatchOptions& opts) {
  return watch::RecordingSpec{opts.output, opts.command_line, KWATCH_VERSION};
}

bool SayRecordingEnd(const watch::RecordingOutcome& outcome) {
  if (!outcome.complete) {
    absl::FPrintF(stderr, "kwatch: error: %s\n", outcome.error.message());
    if (!outcome.kept_at.empty()) {
      absl::FPrintF(stderr,
                    "kwatch: the recording %s holds the events committed before the failure; "
                    "`kwatch report %s` reads it\n",
                    outcome.kept_at, outcome.kept_at);
    }
    return false;
  }
  if (!outcome.warning.empty()) {
    absl::FPrintF(stderr, "kwatch: warning: %s\n", outcome.warning);
  }
  absl::FPrintF(stderr, "kwatch: recorded %d events to %s (kwatch report %s)\n", outcome.events,
                outcome.path, outcome.path);
  return true;
}

}  // namespace kwatch::cli
