#pragma once

#include <cstdint>
#include <string>

#include <QString>

namespace kwatch::gui {

// A string of a recording (a name of a field, type, function, file, the end reason...) as the
// viewer shows it: control characters, ESC and what is not UTF-8 escaped as core::Printable
// shows them, so a shared recording cannot put invisible or misleading text in a label.
QString DisplayText(const std::string& s);

// An accessing instruction's function as the viewer shows it: "run+0x1a", and for an
// instruction of an inlined function "parse_len inlined in run+0x1a" (DisplayText'd).
QString SiteFunctionText(const std::string& function, uint64_t offset, const std::string& inlined);

// A site as the charts name it: "run (parse.c:42)", "parse_len inlined in run (parse.c:17)"
// (the line is the inlined function's), "run+0x1a" without a line (DisplayText'd).
QString SiteLabelText(const std::string& function, uint64_t offset, const std::string& inlined,
                      const std::string& file, int line);

// Plain text made safe for the places where Qt reads rich text (tooltips, chart labels):
// HTML-escaped inside <p style='white-space:pre'> (kept as laid out), so that "<b>" or
// "<img src=...>" in a name shows as written and is never rendered or fetched.
QString RichTextSafe(const QString& plain);

}  // namespace kwatch::gui
