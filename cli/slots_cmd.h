#pragma once

#include <string>
#include <vector>

namespace kwatch::cli {

// `kwatch slots [-p PID] [--json]`: per thread of a process, who holds each of DR0-DR3
// (kwatch sessions, from what they published through drmgr/slot_registry.h), how many slots
// are held outside kwatch (counted through the kernel, watch/slots_view.h) and how many are
// free; and the watches of kwatch sessions that are not in hardware. Without -p: every
// process a running kwatch session watches. `args` are the arguments after "slots".
// Returns the exit status (0, 1 error, 2 usage).
int SlotsMain(const std::vector<std::string>& args);

}  // namespace kwatch::cli
