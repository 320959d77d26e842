#pragma once

#include "cli/watch_options.h"

namespace kwatch::cli {

// `kwatch EXPR...` with no -p and no command: kernel variables, one breakpoint per CPU.
// Returns kwatch's exit status: 2 when the expression resolves nowhere and nothing more was
// given (a missing target or symbol file), 1 for other errors.
int KernelMain(const WatchOptions& opts);

// `kwatch --kernel-accesses EXPR... -p PID | -- CMD`: the kernel's accesses to a process's
// memory (exclude_user). Returns kwatch's exit status.
int KernelAccessesMain(const WatchOptions& opts);

}  // namespace kwatch::cli
