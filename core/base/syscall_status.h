#pragma once

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace kwatch::core {

// Turns a failed call's errno into a Status carrying the call's name and the errno text,
// e.g. "ptrace(PTRACE_SEIZE, 42): Operation not permitted". Save errno on the line right
// after the failing call and pass it here.
absl::Status SyscallError(int err, absl::string_view call);

// Same, with advice for the user appended ("; <advice>").
absl::Status SyscallError(int err, absl::string_view call, absl::string_view advice);

// The errno text for `err`, thread-safe (strerror is not).
std::string ErrnoText(int err);

}  // namespace kwatch::core
