#pragma once

#include <sys/types.h>

#include <array>
#include <csignal>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "core/base/remote_addr.h"
#include "core/base/unique_fd.h"
#include "drmgr/debug_regs.h"

namespace kwatch::watch {

// What one debug register of one thread holds.
struct TrapSlot {
  core::RemoteAddr addr;
  uint32_t len = 1;  // 1, 2, 4 or 8, aligned; an execute breakpoint: 1 (the instruction start)
  drmgr::DrKind kind = drmgr::DrKind::kWrite;
  bool operator==(const TrapSlot&) const = default;
};

// The perf data (sig_data) of kwatch's breakpoint in debug register `reg` (0-3) of a thread:
// kwatch's magic (core/trap_origin.h) in the upper 32 bits, then `serial` (30 bits, unique
// per breakpoint opened) and `reg`.
uint64_t TrapSigData(int reg, uint32_t serial);
// The register a sig_data of TrapSigData names, or -1 when the data is not kwatch's.
int TrapSigDataRegister(uint64_t sig_data);
// Whether `si` is the stop of a kwatch trap breakpoint: SIGTRAP, TRAP_PERF, kwatch's magic.
bool IsTrapBreakpointSignal(const siginfo_t& si);

// kwatch's hardware breakpoints in the threads of a traced process, made so that they never
// outlive kwatch: for each (thread, debug register) one perf_event_open(PERF_TYPE_BREAKPOINT)
// event with sigtrap=1 on that thread (no inherit, user accesses only, sample_period 1,
// remove_on_exec, O_CLOEXEC). A hit makes the kernel send the thread a synchronous SIGTRAP
// (si_code TRAP_PERF, si_addr the breakpoint's address, si_perf_data the event's TrapSigData);
// under ptrace the thread then stops in signal-delivery-stop: after the access for a data
// breakpoint, before the instruction for an execute breakpoint (EFLAGS.RF set by the kernel
// so that it runs once when resumed). Two registers hit by one access send one SIGTRAP, with
// the data of one of them.
//
// The events are file descriptors of kwatch: when kwatch exits, even by SIGKILL, they close
// before the kernel detaches its tracees (do_exit closes files before exit_notify), so no
// breakpoint is left in a thread that nobody traces. (Debug registers written with
// PTRACE_POKEUSER stay armed after the tracer dies, Linux 6.18.) A thread's exec removes them;
// a forked child never gets them. The kernel counts each event against the thread's four
// registers while it is open: ENOSPC when another tool holds the rest.
//
// Not thread-safe; owned by one backend (watch/stop_backend.h).
class TrapBreakpoints {
 public:
  TrapBreakpoints() = default;
  TrapBreakpoints(const TrapBreakpoints&) = delete;
  TrapBreakpoints& operator=(const TrapBreakpoints&) = delete;
  ~TrapBreakpoints() = default;

  // Makes register `reg` of thread `tid` hold `slot`, closing what it held first (so that the
  // thread never counts more registers than the layout uses). On error the register holds
  // nothing: ResourceExhausted (ENOSPC) when every register of the thread is held, NotFound
  // (ESRCH) when the thread exited, InvalidArgument for a range the hardware cannot watch,
  // PermissionDenied with perf_event_paranoid advice; each names perf_event_open and errno.
  absl::Status Set(pid_t tid, int reg, const TrapSlot& slot);
  // Register `reg` of `tid` holds nothing (its event closed).
  void Clear(pid_t tid, int reg);
  // Closes every event of `tid` (an exited thread), or of every thread.
  void Drop(pid_t tid);
  void DropAll();

  // The register of `tid` whose breakpoint sent a trap with `sig_data`, or -1 when no open
  // breakpoint of `tid` did (a late trap of a breakpoint closed or replaced since).
  int Fired(pid_t tid, uint64_t sig_data) const;
  // What register `reg` of `tid` holds, if anything.
  std::optional<TrapSlot> SlotOf(pid_t tid, int reg) const;

  // One open breakpoint (for tests and diagnostics).
  struct Event {
    pid_t tid = 0;
    int reg = 0;
    TrapSlot slot;
    uint64_t sig_data = 0;
    int fd = -1;
  };
  std::vector<Event> Events() const;
  size_t open_events() const { return open_; }

 private:
  struct Armed {
    TrapSlot slot;
    uint64_t sig_data = 0;
    core::UniqueFd fd;
  };
  using Registers = std::array<std::optional<Armed>, drmgr::kNumDebugRegisters>;

  absl::flat_hash_map<pid_t, Registers> threads_;
  size_t open_ = 0;
  uint32_t next_serial_ = 1;
};

}  // namespace kwatch::watch
