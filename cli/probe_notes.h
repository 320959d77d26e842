#pragma once

// How `kwatch probe` words a session's notes (watch/probe/probe_note.h): one sentence each,
// without a prefix. Both printers use it: live notes go to stderr ("kwatch: ..."), the
// summary's are "note: ..." lines in text and strings of "notes" in JSON.

#include <string>

#include "watch/probe/probe_note.h"

namespace kwatch::cli {

// A note said while the session runs.
std::string ProbeNoteText(const watch::probe::ProbeNote& note);

// A note of the summary. The same sentence as ProbeNoteText, except for the hw backend's
// placements ("hw: probe ...") and the registers held outside kwatch ("hw: 2 debug registers
// were held outside kwatch").
std::string SummaryNoteText(const watch::probe::ProbeNote& note);

}  // namespace kwatch::cli
