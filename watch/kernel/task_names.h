#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>

namespace kwatch::watch::kernel {

// The command names of the tasks kernel events come from, each read once (/proc/TID/comm) when
// first asked for: a task's name is the one it had then. Tid 0 is each CPU's idle task,
// "swapper/N". Not thread-safe.
class TaskNames {
 public:
  // The name of task `tid` (its event came on `cpu`); "?" when it cannot be read (the task has
  // exited). The reference stays valid while this object lives.
  const std::string& Get(pid_t tid, uint32_t cpu);

 private:
  std::map<int64_t, std::string> names_;  // by tid; idle tasks by -1 - cpu
};

}  // namespace kwatch::watch::kernel
