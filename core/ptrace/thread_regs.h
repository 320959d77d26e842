#pragma once

// The registers of one stopped tracee thread, through ptrace on its tid: general registers,
// the extended state (x87, SSE, AVX... as XSAVE lays it out) and the debug registers. Plain
// accessors that keep no state (the sharing and bookkeeping live with their users, as gdb
// keeps x86-dregs' low-level writers apart from its sharing logic). Call them from the
// tracer thread while `tid` is in a ptrace stop; errors name the request and the thread.

#include <sys/types.h>
#include <sys/user.h>

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kwatch::core::ptrace {

// PTRACE_GETREGS / PTRACE_SETREGS.
absl::StatusOr<user_regs_struct> ReadGeneralRegs(pid_t tid);
absl::Status WriteGeneralRegs(pid_t tid, const user_regs_struct& regs);

// Everything a function call may change beyond the general registers: the XSAVE area
// (NT_X86_XSTATE: x87, SSE, AVX and later state in the standard format), or the 512-byte
// FXSAVE area (NT_PRFPREG) where the kernel offers no XSAVE regset.
struct ExtendedRegs {
  unsigned int note = 0;       // the regset it was read as: NT_X86_XSTATE or NT_PRFPREG
  std::vector<uint8_t> bytes;  // as the kernel gave them; written back unchanged
};
absl::StatusOr<ExtendedRegs> ReadExtendedRegs(pid_t tid);
absl::Status WriteExtendedRegs(pid_t tid, const ExtendedRegs& regs);

// Debug register `index` (0-3: addresses, 6: status, 7: control) of the thread as ptrace
// shows it (PTRACE_PEEKUSER; DR6 is the thread's virtual copy). InvalidArgument for another
// index. (kwatch arms breakpoints through perf events, never through these registers.)
absl::StatusOr<uint64_t> ReadDebugReg(pid_t tid, int index);

}  // namespace kwatch::core::ptrace
