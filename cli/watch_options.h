#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/ptrace/process.h"

namespace kwatch::cli {

// The options of a `kwatch` watch session (process or kernel), as parsed from the command line.
// One per run, its fields in the order of the options: the padding between them costs nothing.
struct WatchOptions {  // NOLINT(clang-analyzer-optin.performance.Padding)
  bool write = false;
  bool rw = false;
  bool read = false;
  bool exec = false;
  std::optional<uint64_t> len;
  std::vector<std::string> exprs;
  std::optional<pid_t> pid;
  std::vector<std::string> command;
  uint64_t count = 0;
  double duration = 0;
  bool json = false;
  bool quiet = false;
  bool kill_on_exit = false;
  bool follow_forks = false;  // -f: watch the children the target forks too (as strace -f)
  std::string user;           // -u: run the command as this user
  std::optional<core::ptrace::RunAs> run_as;  // resolved from `user`
  std::string backend = "auto";
  bool stop = false;         // --stop: --backend stop
  std::string condition;     // --if EXPR
  bool stack = false;        // --stack
  size_t stack_depth = 16;   // --stack-depth
  std::string overcommit;    // beyond 4 debug registers: "" = pages (processes), fail (kernel)
  int mux_interval_ms = 10;  // --overcommit=multiplex rotation
  std::string output;        // -o: recording file
  std::string command_line;  // as typed, for the recording
  // Kernel watches (no -p and no command):
  std::string system_map;         // --system-map
  std::string vmlinux;            // --vmlinux
  std::string kernel_type;        // --type: the C type of the watched kernel symbol
  std::string via;                // --via FUNC[+OFF]: a kernel variable's accessor function
  bool values_at_drain = false;   // --values-at-drain: no BPF program on kernel breakpoints
  std::string kcore;              // --kcore: kernel memory for drain-time values ("": /proc/kcore)
  bool kernel_accesses = false;   // --kernel-accesses: the kernel's accesses to a process
  std::string arm_at;             // --arm-at SPEC: arm when a thread first runs this point
  std::string in;                 // --in FUNC: the expressions are watched per call of FUNC
  std::string at;                 // --at SPEC: where in FUNC each call's objects are looked up
  std::string until;              // --until SPEC: where in FUNC each call's watches end
  std::string calls_by = "auto";  // --calls-by: auto, agent or ptrace (who arms each call)
  bool follow = false;            // --follow: expressions follow their pointers (gdb's watch)
};

}  // namespace kwatch::cli
