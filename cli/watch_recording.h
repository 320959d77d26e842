#pragma once

#include <string>

#include "cli/watch_options.h"
#include "watch/recording.h"

namespace kwatch::cli {

// The recording -o asks for: its path, the command line and this kwatch's version.
watch::RecordingSpec RecordingSpecFor(const WatchOptions& opts);

// Says on stderr how a recording ended: "recorded N events to FILE" ("N probe hits" with
// `hits`; after Finish's warning, if any), or the error, where the events committed before it
// are, and that the recording the file replaced is untouched. Returns whether the recording is
// complete (else -o was not honoured: kwatch exits 1, docs/recording.md).
bool SayRecordingEnd(const watch::RecordingOutcome& outcome, bool hits = false);
// What SayRecordingEnd says, as text (for a joined kwatch, cli/join_server.h).
std::string RecordingEndText(const watch::RecordingOutcome& outcome, bool hits = false);

}  // namespace kwatch::cli
