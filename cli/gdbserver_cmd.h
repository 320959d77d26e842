#pragma once

#include <string>
#include <vector>

namespace kwatch::cli {

// `kwatch gdbserver (--listen HOST:PORT | --stdio) [WATCH OPTIONS] [EXPR...] (-p PID | -- CMD)`:
// a gdb remote-protocol server over the target, with kwatch's own watches in the same session
// (watch/gdb/run.h). `args` are the arguments after "gdbserver". Returns the exit status (the
// launched program's when it ran to its end, 0, 1 on an error, 2 on a usage error).
int GdbServerMain(const std::vector<std::string>& args);

}  // namespace kwatch::cli
