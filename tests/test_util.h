#pragma once

#include <sys/prctl.h>
#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/base/unique_fd.h"

namespace kwatch::testing {

// Path of a fixture program built from tests/targets/NAME.c.
std::string TargetPath(const std::string& name);

// Path of the kwatch binary under test.
std::string KwatchPath();

// Output of a finished child process.
struct RunResult {
  int exit_code = -1;  // exit status, or 128+signal when killed
  std::string out;     // stdout
  std::string err;     // stderr
};

// Runs argv to completion (no shell), capturing stdout and stderr. Fails the test's
// expectations only through the returned status: spawn failures become errors.
absl::StatusOr<RunResult> Run(const std::vector<std::string>& argv, int timeout_s = 60);

// A child process whose stdout and stderr are read while it runs (for attach tests and
// signals sent mid-session). Killed (SIGKILL) and reaped on destruction if still running.
class Spawned {
 public:
  static absl::StatusOr<std::unique_ptr<Spawned>> Start(const std::vector<std::string>& argv);
  ~Spawned();
  Spawned(const Spawned&) = delete;
  Spawned& operator=(const Spawned&) = delete;

  pid_t pid() const { return pid_; }
  // Reads until `needle` appears in stdout (or stderr) or the timeout passes.
  absl::Status WaitForStdout(const std::string& needle, int timeout_s = 30);
  absl::Status WaitForStderr(const std::string& needle, int timeout_s = 30);
  // Reads everything until the process closes its output, then reaps it.
  absl::StatusOr<RunResult> Finish(int timeout_s = 60);
  const std::string& out() const { return result_.out; }
  const std::string& err() const { return result_.err; }

 private:
  Spawned() = default;
  // Reads what is available, waiting up to timeout_ms; false when both pipes closed.
  bool Pump(int timeout_ms);

  pid_t pid_ = -1;
  int out_fd_ = -1;
  int err_fd_ = -1;
  bool reaped_ = false;
  RunResult result_;
};

// Runs `kwatch probe ARGS...` to completion (Run); a spawn failure is a test failure and an
// empty result.
RunResult KwatchProbe(const std::vector<std::string>& args);

// Makes this process the reaper of orphans while alive (PR_SET_CHILD_SUBREAPER), so that a
// target kwatch detached from, or whose kwatch died, can still be waited for.
class SubreaperScope {
 public:
  SubreaperScope() { prctl(PR_SET_CHILD_SUBREAPER, 1); }
  ~SubreaperScope() { prctl(PR_SET_CHILD_SUBREAPER, 0); }
  SubreaperScope(const SubreaperScope&) = delete;
  SubreaperScope& operator=(const SubreaperScope&) = delete;
};

// Whether kernel-feature tests may skip instead of failing (KWATCH_ALLOW_SKIP=1, never in CI).
bool AllowSkip();

// Holds one debug register of thread `tid` as another tool would (a debugger's hardware
// watchpoint is such an event inside the kernel): a disabled, not inherited perf breakpoint
// on 8 bytes at `addr`, user space only. Adds a test failure (naming errno) when the kernel
// refuses; the descriptor is then invalid.
core::UniqueFd HoldBreakpointSlot(pid_t tid, uint64_t addr);

// Free debug registers of thread `tid` as the kernel counts them (as `kwatch slots` does):
// disabled breakpoints on `addr` opened until ENOSPC, then closed. Adds a test failure when
// the kernel refuses with anything but ENOSPC.
int FreeDebugRegisters(pid_t tid, uint64_t addr);

}  // namespace kwatch::testing

// Fails (or skips, only when KWATCH_ALLOW_SKIP=1) with `why` when `cond` is false.
#define KW_REQUIRE_FEATURE(cond, why)                            \
  do {                                                           \
    if (!(cond)) {                                               \
      if (::kwatch::testing::AllowSkip())                        \
        GTEST_SKIP() << (why);                                   \
      FAIL() << "kernel feature missing: " << (why)              \
             << " (set KWATCH_ALLOW_SKIP=1 to skip outside CI)"; \
    }                                                            \
  } while (false)
