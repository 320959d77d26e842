#pragma once

#include <string>

#include "absl/strings/string_view.h"

namespace kwatch::core {

// Text from an untrusted source (a recording someone shared: names of fields, functions,
// files, tasks, the command line, probe specs and values) made safe to show on a terminal, in
// an aligned table, an image or a GUI label. Every C0 control character (tab and newline
// included), DEL and every byte that is not part of valid UTF-8 becomes `\xNN` (ESC shows as
// `\x1b`, as `cat -v` and git show what they will not print); C1 controls (U+0080..U+009F,
// which some terminals obey like ESC sequences), the Unicode bidirectional controls
// (U+061C, U+200E, U+200F, U+202A..U+202E, U+2066..U+2069: they reorder what is shown) and the
// line and paragraph separators U+2028, U+2029 become `\uXXXX`. Everything else is kept,
// backslashes included, so Printable(s) == s for every ordinary name.
std::string Printable(absl::string_view s);

// Whether Printable(s) == s (no allocation).
bool IsPrintable(absl::string_view s);

}  // namespace kwatch::core
