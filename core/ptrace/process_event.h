#pragma once

#include <sys/types.h>

#include <cstdint>

namespace kwatch::core::ptrace {

// How a target process ended.
struct ExitInfo {
  bool signaled = false;
  int code = 0;    // exit status when !signaled
  int signal = 0;  // terminating signal when signaled
  bool core_dumped = false;

  // Shell convention: the status, or 128 + signal.
  int ShellStatus() const { return signaled ? 128 + signal : code; }
};

// A lifecycle change observed while polling a traced process.
struct ProcessEvent {
  enum class Kind : uint8_t {
    kThreadStarted,  // tid is the new thread
    kThreadExited,   // tid is gone
    kExec,           // the process replaced its image; tid (== pid) is stopped until Resume()
    kExited,         // the whole process ended; see exit_info()
    kSignal,         // a signal was delivered to tid (already passed on to the target)
    kGroupStop,      // job-control stop (SIGSTOP/SIGTSTP...): the target stays stopped
    kForked,         // tid forked a child: cleaned up and let go, or followed (`child`)
  };
  Kind kind = Kind::kThreadStarted;
  pid_t tid = 0;
  int signal = 0;
  // kForked in a ProcessGroup following forks: the child's pid, stopped until its owner
  // takes it (ProcessGroup::TakeChild) and resumes it; 0 when the child was let go.
  pid_t child = 0;
};

}  // namespace kwatch::core::ptrace
