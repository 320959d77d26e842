#pragma once

// Code run inside a stopped thread of a traced process, restored afterwards: system calls
// (Process::RemoteSyscall, and the typed mmap/munmap/mprotect below); calls of the target's
// own functions are remote_call.h's RemoteCall.
//
// Every function here takes a thread kwatch has stopped (StopAll, or a stop it handles),
// runs only that thread, and leaves it stopped where it was, with its registers as before.
// The other threads stay as they are: stop them first (StopAll) when they must not run the
// bytes patched meanwhile, or when the code run may take locks they hold. Not thread-safe:
// from the tracer thread only, like Process.

#include <sys/types.h>

#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "core/base/remote_addr.h"
#include "core/ptrace/process.h"

namespace kwatch::core::ptrace {

// mmap(2)'s arguments for a mapping kwatch makes in the target (always anonymous).
struct RemoteMapping {
  uint64_t addr = 0;  // a hint, or the address itself with MAP_FIXED / MAP_FIXED_NOREPLACE
  uint64_t length = 0;
  int prot = 0;   // PROT_*
  int flags = 0;  // MAP_PRIVATE | MAP_ANONYMOUS are added
};

// mmap(2) in thread `tid`: the new mapping's address. The kernel's error comes back as
// SyscallError(errno, what) (EEXIST: AlreadyExists, ENOMEM: ResourceExhausted...); `what`
// names the call in it ("" for "mmap(ADDR, LENGTH, rwx) in pid PID").
absl::StatusOr<RemoteAddr> RemoteMmap(Process& proc, pid_t tid, const RemoteMapping& mapping,
                                      absl::string_view what = "");
// munmap(2) and mprotect(2) in thread `tid`, errors as for RemoteMmap ("" for
// "munmap(ADDR, LENGTH) in pid PID", "mprotect(ADDR, LENGTH, rwx) in pid PID").
absl::Status RemoteMunmap(Process& proc, pid_t tid, RemoteAddr addr, uint64_t length,
                          absl::string_view what = "");
absl::Status RemoteMprotect(Process& proc, pid_t tid, RemoteAddr addr, uint64_t length, int prot,
                            absl::string_view what = "");

}  // namespace kwatch::core::ptrace
