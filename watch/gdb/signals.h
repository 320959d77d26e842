#pragma once

// GDB's own signal numbers (gdb/signals.def: the remote protocol's), which differ from
// Linux's past the first few: SIGBUS is 7 on Linux and 10 for gdb, SIGUSR1 10 and 30.

namespace kwatch::watch::gdb {

// gdb's number of Linux signal `sig`; 143 (GDB_SIGNAL_UNKNOWN) when gdb has none.
int ToGdbSignal(int sig);
// Linux's number of gdb signal `gdb_sig`; 0 when Linux has none.
int FromGdbSignal(int gdb_sig);

}  // namespace kwatch::watch::gdb
