#pragma once

#include <sys/types.h>

#include <string>

#include "absl/strings/string_view.h"

namespace kwatch::core {

// What in kwatch's own confinement refuses an operation that needs capability `cap`
// (CAP_SYS_PTRACE, CAP_PERFMON...; `cap_name` without the prefix: "SYS_PTRACE"), for the
// advice of a permission error when kwatch runs inside a container: root without the
// capability (a container runtime drops SYS_PTRACE and PERFMON by default), a seccomp filter
// (Docker's and podman's default profiles refuse perf_event_open, and ptrace on old kernels).
// "" when neither is seen. CAP_PERFMON is also satisfied by CAP_SYS_ADMIN.
std::string ConfinementAdvice(int cap, absl::string_view cap_name);

// The same from the text of /proc/self/status and an effective uid (for tests).
std::string ConfinementAdviceFor(absl::string_view status, uid_t euid, int cap,
                                 absl::string_view cap_name);

}  // namespace kwatch::core
