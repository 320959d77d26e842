#pragma once

#include <sys/types.h>

#include <string>

#include "absl/strings/string_view.h"

namespace kwatch::core {

// The value of NAME in the text of a /proc/PID/status file ("NAME:\tvalue"), without the
// surrounding whitespace; "" when absent.
absl::string_view StatusFieldOf(absl::string_view status, absl::string_view name);

// Reads NAME from /proc/PID/status ("TracerPid", "NSpid", "CapEff"...); "" when the field is
// absent or the process is gone.
std::string ProcStatusFieldOf(pid_t pid, absl::string_view name);

}  // namespace kwatch::core
