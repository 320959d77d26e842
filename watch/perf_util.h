#pragma once

#include <string>
#include <vector>

namespace kwatch::watch {

// The first KiB of a small /proc or /sys file, without surrounding whitespace; empty when
// it cannot be read.
std::string ReadSmallFile(const char* path);

// The current kernel.perf_event_paranoid, or "unknown".
std::string ParanoidLevel();

// Advice for EACCES/EPERM from perf_event_open: which capability or sysctl would help.
std::string PerfPermissionAdvice();

// CPUs online now, from /sys/devices/system/cpu/online ("0-3,5"); falls back to
// 0..nprocs-1.
std::vector<int> OnlineCpus();

}  // namespace kwatch::watch
