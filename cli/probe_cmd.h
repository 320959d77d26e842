#pragma once

#include <string>
#include <vector>

namespace kwatch::cli {

// `kwatch probe [OPTIONS] SPEC... (-p PID | -- CMD ARGS...)`: dynamic probes in perf-probe
// syntax on a user program (docs/probe.md). `args` are the arguments after "probe". Returns
// the exit status: the launched command's status when it ended during the session, 0 after
// a clean stop or a listing, 1 on an error, 2 on a usage error.
int ProbeMain(const std::vector<std::string>& argv);

}  // namespace kwatch::cli
