#pragma once

// What a user of the INT3 probe engine (core/probe/int3_engine.h) sees: handlers, the
// context they get, options and counters. Plain data.

#include <sys/types.h>
#include <sys/user.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "core/base/remote_addr.h"

namespace kwatch::core::ptrace {
class Process;
}  // namespace kwatch::core::ptrace

namespace kwatch::core::probe {

using ProbeId = uint32_t;

// Where and when a probe fired. Valid only during the handler call.
struct ProbeContext {
  pid_t tid = 0;         // the thread that hit the probe
  uint64_t time_ns = 0;  // CLOCK_MONOTONIC, when kwatch saw the hit
  RemoteAddr addr;       // the probed address (return probes: the function's entry)
  // The thread's registers: pre handlers, at the probe (rip == addr); post handlers, after
  // the probed instruction (rip: where the thread goes on); return handlers, right after the
  // return (rax: the return value, rip == return_address, rsp: the caller's).
  const user_regs_struct& regs;
  bool is_return = false;
  RemoteAddr return_address;       // return probes: where the function returned to
  RemoteAddr function;             // return probes: the function's entry
  const ptrace::Process& process;  // to read target memory (ReadMemory)
};

struct ProbeHandlers {
  // Probes: before the probed instruction runs. Return probes: at each tracked return.
  std::function<void(const ProbeContext&)> pre = nullptr;
  // Probes only: after the probed instruction ran (an emulated one costs nothing more; one
  // run out of line costs a second stop).
  std::function<void(const ProbeContext&)> post = nullptr;
  // Return probes only: at the entry of each call that gets an instance (kretprobes'
  // entry_handler); regs as a pre handler sees them.
  std::function<void(const ProbeContext&)> entry = nullptr;
  // Probes only: the displaced instruction, running out of line, raised `signal` (SIGSEGV,
  // SIGBUS, SIGFPE, SIGILL). ctx.regs are the thread's at the fault with rip == addr. true:
  // kwatch drops the signal and the thread runs the instruction again (the handler must have
  // removed the cause); false: the target gets the signal (its handler sees rip inside
  // kwatch's out-of-line area, and execution goes on correctly if it returns).
  std::function<bool(const ProbeContext&, int signal)> fault = nullptr;
};

// How the instruction under a probe runs once the handlers are done.
enum class ProbeExecution : uint8_t {
  kAuto,       // emulated when that needs no target memory access or nothing else works
  kEmulate,    // emulated (InvalidArgument if kwatch cannot)
  kOutOfLine,  // a copy in the XOL area (InvalidArgument for branches, calls, ret)
};

struct ProbeOptions {
  bool enabled = true;
  uint64_t maxhits = 0;  // > 0: the probe disables itself after this many hits
  // All probes of one address share its breakpoint: the first registration decides; a later
  // one asking for another execution is refused.
  ProbeExecution execution = ProbeExecution::kAuto;
  // When set, the address must start an instruction of the function [start, start + size)
  // (decoded linearly from its start).
  std::optional<RemoteAddr> function_start = std::nullopt;
  uint64_t function_size = 0;
};

struct ReturnProbeOptions {
  bool enabled = true;
  uint64_t maxhits = 0;    // > 0: disables itself after tracking this many calls
  uint32_t maxactive = 0;  // calls tracked at once, all threads together; 0: kDefaultMaxActive
};
inline constexpr uint32_t kDefaultMaxActive = 256;

struct ProbeStats {
  uint64_t hits = 0;       // handler runs (pre of a probe; return handler of a return probe)
  uint64_t misses = 0;     // reached while disabled or beyond maxhits: no handler ran
  uint64_t nmissed = 0;    // return probes: calls not tracked, maxactive instances being in use
  uint64_t abandoned = 0;  // return probes: tracked calls that never returned (longjmp, a C++
                           // exception, thread exit), dropped when noticed
  uint64_t faults = 0;     // signals raised by the displaced instruction out of line
  bool enabled = false;
  bool registered = false;  // false after Unregister, RestoreAll or an exec
};

// One change kwatch made to target memory, for a guardian that restores it if kwatch dies.
struct PatchRecord {
  enum class Kind : uint8_t {
    kBreakpoint,     // an INT3 over the first byte of an instruction
    kReturnAddress,  // a return address on a thread's stack replaced by the trampoline
  };
  Kind kind = Kind::kBreakpoint;
  RemoteAddr addr;
  std::vector<uint8_t> original;  // what to put back
  std::vector<uint8_t> patched;   // what is there now, if nothing else changed it
  pid_t tid = 0;                  // kReturnAddress: whose stack
};

}  // namespace kwatch::core::probe
