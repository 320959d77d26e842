#pragma once

// Loading libkwatch-agent.so into a traced target (docs/agent.md "Life of a session", step 3):
// in one stopped thread, by remote system calls and calls (core/ptrace/remote_call.h):
//   memfd_create + ftruncate + mmap(MAP_SHARED) in the target, kwatch maps /proc/PID/fd/N too
//   and writes the control block, the target closes N;
//   the lifeline: pipe2(O_CLOEXEC) in the target, kwatch takes the write end (pidfd_getfd),
//   the target closes its copy and moves the read end to fd >= 1000 (F_DUPFD_CLOEXEC);
//   dlopen(path, RTLD_NOW) (glibc >= 2.34; older glibc: __libc_dlopen_mode), then
//   kwatch_agent_init(shm, size), found in the library's ELF symbols plus its load address.
// A failure at any step undoes, in reverse, everything done in the target (dlclose, fds
// closed, mappings unmapped) and says which step failed; the target is left as it was but for
// what dlopen itself may have kept (a libc allocation or two).
//
// Launched targets load in the main thread at the entry point (Process::Start/RunToEntry: no
// lock is held there). Attached targets load in a thread picked as docs/agent.md "Attach
// safely" says (PickLoadThread), with the other threads resumed during dlopen and init.

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/base/remote_addr.h"
#include "core/base/unique_fd.h"
#include "core/base/unique_mmap.h"
#include "core/ptrace/maps.h"
#include "watch/agent/shm_layout.h"

namespace kwatch::core::ptrace {
class Process;
}  // namespace kwatch::core::ptrace

namespace kwatch::core {}

namespace kwatch::watch::agent {

inline constexpr const char* kAgentLibraryName = "libkwatch-agent.so";

// Where libkwatch-agent.so is: $KWATCH_AGENT when set (it must exist), else next to kwatch's
// binary (`self_exe`, default /proc/self/exe: the build tree), then ../lib/kwatch/ from the
// binary's folder (the install layout), then the build tree's path CMake configured.
// NotFound lists every place looked at.
absl::StatusOr<std::string> FindAgentLibrary(const std::string& self_exe = "/proc/self/exe");

// The dynamic loader entry kwatch calls in a target.
struct DlopenSite {
  std::string libc{};             // the libc file mapped in the target
  core::RemoteAddr dlopen{};      // dlopen, or __libc_dlopen_mode (libc_dlopen_mode)
  core::RemoteAddr dlerror{};     // 0 when libc has none (glibc < 2.34)
  core::RemoteAddr dlclose{};     // dlclose, or __libc_dlclose
  bool libc_dlopen_mode = false;  // glibc < 2.34: mode needs __RTLD_DLOPEN
};

// Finds dlopen (absolute) in the glibc mapped in `proc` (from `maps`). FailedPrecondition
// naming why there is none: a statically linked program (no dynamic loader), musl or another
// libc, a glibc exporting neither dlopen nor __libc_dlopen_mode.
absl::StatusOr<DlopenSite> FindDlopen(const core::ptrace::Process& proc,
                                      const std::vector<core::ptrace::MapEntry>& maps);

// The load bias of the ELF file mapped at `path` in the target (run-time address = link-time
// address + bias), from the mapping of its first page and its program headers read in the
// target. NotFound when `path` is not mapped.
absl::StatusOr<uint64_t> LoadBias(const core::ptrace::Process& proc,
                                  const std::vector<core::ptrace::MapEntry>& maps,
                                  const std::string& path);

// The threads of `pid` that block `sig` now (SigBlk), in tid order: a thread blocking SIGTRAP
// when it meets an in-process INT3 would die of it (the kernel forces the signal and resets
// the handler), so kwatch gives the INT3 probes of such a process to ptrace (docs/agent.md).
absl::StatusOr<std::vector<pid_t>> ThreadsBlocking(pid_t pid, int sig);

// A thread of an attached target in which a remote dlopen is safe: no frame of its stack in
// ld.so or in libc's allocator, SIGTRAP not blocked; threads blocked in a system call first.
// Every thread must be stopped. FailedPrecondition says why each thread was refused.
absl::StatusOr<pid_t> PickLoadThread(core::ptrace::Process& proc);

struct LoadOptions {
  std::string agent_path{};  // "" : FindAgentLibrary()
  ShmConfig shm{};
  // The other threads run during dlopen and init (they may hold a lock dlopen needs:
  // docs/agent.md "Attach safely") unless this is set. A launched target at its entry point
  // has no other thread.
  bool keep_others_stopped = false;
  absl::Duration timeout = absl::Seconds(5);  // for each remote call
  // The thread to load in (0: the main thread when launched, else PickLoadThread).
  pid_t thread = 0;
};

// Time spent in each part of a load (for the numbers in docs and benches).
struct LoadTimings {
  absl::Duration pick;    // choosing the thread (attach)
  absl::Duration setup;   // memfd, mappings, lifeline (remote system calls)
  absl::Duration dlopen;  // the remote dlopen call
  absl::Duration init;    // kwatch_agent_init
  absl::Duration total;
};

// What a load leaves to the controller.
struct LoadedAgent {
  std::string path;      // the library loaded
  bool copied = false;   // loaded from a memfd copy: the target's filesystem lacks `path`
  pid_t thread = 0;      // the thread the load ran in
  core::UniqueMmap shm;  // kwatch's mapping of the shared memory
  ShmLayout layout;
  core::RemoteAddr remote_shm;  // the target's mapping of it
  core::UniqueFd lifeline;      // the only write end of the lifeline pipe
  int remote_lifeline = -1;     // the target's read end (KwControl::lifeline_fd)
  uint64_t handle = 0;          // dlopen's handle in the target
  core::RemoteAddr agent_base;  // where the library is mapped
  LoadTimings timings;
};

// Loads the agent into `proc` (alive; every thread stopped by kwatch, nothing armed). On
// success the threads are stopped as before and the control block says Init, with the
// agent's fields filled. Errors name the step ("dlopen(PATH) in pid N: <dlerror>",
// "kwatch_agent_init returned -EPROTO: ...") after undoing what was done.
absl::StatusOr<LoadedAgent> LoadAgent(core::ptrace::Process& proc, const LoadOptions& options);

}  // namespace kwatch::watch::agent
