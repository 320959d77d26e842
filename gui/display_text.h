#pragma once

#include <string>

#include <QString>

namespace kwatch::gui {

// A string of a recording (a name of a field, type, function, file, the end reason...) as the
// viewer shows it: control characters, ESC and what is not UTF-8 escaped as core::Printable
// shows them, so a shared recording cannot put invisible or misleading text in a label.
QString DisplayText(const std::string& s);

// Plain text made safe for the places where Qt reads rich text (tooltips, chart labels):
// HTML-escaped inside <p style='white-space:pre'> (kept as laid out), so that "<b>" or
// "<img src=...>" in a name shows as written and is never rendered or fetched.
QString RichTextSafe(const QString& plain);

}  // namespace kwatch::gui
