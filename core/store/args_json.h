#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kwatch::core::store {

using ProbeArgs = std::vector<std::pair<std::string, std::string>>;

// Probe arguments as one flat JSON object of strings, in order: {"len":"42","name":"\"x\""}.
// '"', '\\' and control characters are escaped; other bytes (also invalid UTF-8) pass through
// unchanged, so DecodeArgsJson(EncodeArgsJson(a)) == a for any bytes.
std::string EncodeArgsJson(const ProbeArgs& args);

// Parses what EncodeArgsJson writes, and any flat JSON object whose values are strings
// (\uXXXX escapes and surrogate pairs become UTF-8). Anything else is InvalidArgument.
absl::StatusOr<ProbeArgs> DecodeArgsJson(absl::string_view json);

}  // namespace kwatch::core::store
