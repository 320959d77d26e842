#pragma once

#include <sys/types.h>

#include "absl/status/statusor.h"

namespace kwatch::core::ptrace {

// Makes kwatch die in microseconds when it is killed, so that its tracees are detached (and
// its breakpoints closed, its guardians woken) before they can stop again.
//
// A SIGKILLed process frees its address space (exit_mm) before it closes its files and lets
// its tracees go (exit_files, then exit_notify). kwatch's address space (symbols, buffers,
// libraries: 40+ MB) takes it ~6 ms to free on this project's machines, and every ptrace stop
// a target takes in that time (an INT3, a page fault on a protected page, a breakpoint) is
// never collected: the kernel detaches the thread with the stop's signal still to deliver,
// and it kills the target (the README's "Known limits" has the rates).
//
// The anchor is a tiny process that shares kwatch's address space (clone(CLONE_VM), not a
// thread: a SIGKILL of kwatch does not reach it) and holds a reference to it. kwatch's own
// exit then only drops its reference and goes on to close its files and detach its tracees;
// the anchor waits on a pidfd for kwatch to be gone, and then frees the memory by exiting,
// at the lowest priority. It runs no library code (raw system calls on its own stack: it
// shares kwatch's memory and thread-local storage), blocks every signal, keeps no file but
// the pidfd, and is reparented away from kwatch at once (kwatch's waitpid(-1) never sees
// it). In `ps` it shows as "kwatch-anchor" with kwatch's memory (shared, not a copy).
//
// Started once per process (later calls return the same). Returns the anchor's pid. Best
// effort: kwatch works without it, only dies more slowly; the error says why it could not
// start (KWATCH_DEBUG prints it).
absl::StatusOr<pid_t> StartExitAnchor();

}  // namespace kwatch::core::ptrace
