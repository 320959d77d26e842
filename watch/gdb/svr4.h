#pragma once

// What gdb asks about a Linux process's image beyond memory and registers: its auxiliary
// vector, its executable's path and the dynamic linker's list of loaded objects.

#include <sys/types.h>

#include <string>

#include "absl/status/statusor.h"
#include "core/ptrace/process.h"

namespace kwatch::watch::gdb {

// /proc/PID/auxv as the kernel gives it (qXfer:auxv:read).
absl::StatusOr<std::string> ReadAuxv(pid_t pid);
// /proc/PID/exe's target (qXfer:exec-file:read).
absl::StatusOr<std::string> ExecutablePath(pid_t pid);
// The <library-list-svr4> document of the dynamic linker's link map (r_debug, found through
// the executable's DT_DEBUG), for qXfer:libraries-svr4:read: one <library> per loaded object
// but the main program, whose entry is `main-lm`. A static program, or one whose linker has
// not run yet, gets an empty list.
absl::StatusOr<std::string> LibraryListSvr4(const core::ptrace::Process& proc);

}  // namespace kwatch::watch::gdb
