#pragma once

#include <sys/types.h>

#include <compare>
#include <cstdint>
#include <string>

namespace kwatch::drmgr {

// Where a debug-register slot applies. Every thread has its own DR0-DR3; a slot of a process
// scope is present in all its threads, including those created later; a CPU scope applies
// to whatever runs on that CPU (kernel addresses, perf CPU-wide events); kAllCpus to all.
struct Scope {
  enum class Kind : uint8_t { kThread, kProcess, kCpu, kAllCpus };

  Kind kind = Kind::kThread;
  pid_t pid = 0;  // kThread, kProcess
  pid_t tid = 0;  // kThread
  int cpu = 0;    // kCpu

  static constexpr Scope Thread(pid_t pid, pid_t tid) { return Scope{Kind::kThread, pid, tid, 0}; }
  static constexpr Scope Process(pid_t pid) { return Scope{Kind::kProcess, pid, 0, 0}; }
  static constexpr Scope Cpu(int cpu) { return Scope{Kind::kCpu, 0, 0, cpu}; }
  static constexpr Scope AllCpus() { return Scope{Kind::kAllCpus, 0, 0, 0}; }

  // Task scopes (thread, process) watch user memory of one process; CPU scopes watch
  // whatever runs there, the kernel included.
  constexpr bool is_task() const { return kind == Kind::kThread || kind == Kind::kProcess; }

  // NOLINTNEXTLINE(modernize-use-nullptr): clang-tidy 14 bug (llvm-project#53961)
  auto operator<=>(const Scope&) const = default;

  // "thread 42 of process 40", "process 40 (all threads)", "CPU 1", "all CPUs".
  std::string ToString() const;
};

// Whether some thread, running on some CPU, would carry slots of both scopes: such scopes
// compete for the same four debug registers. Not transitive: two threads of one process do
// not share slots, but both share them with the process scope. CPU scopes share with every
// task scope (the kernel counts CPU-bound breakpoints against every task, and the reverse).
bool Overlaps(const Scope& a, const Scope& b);

}  // namespace kwatch::drmgr
