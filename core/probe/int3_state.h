#pragma once

// Bookkeeping of the INT3 probe engine (core/probe/int3_engine.h); internal to it.

#include <sys/types.h>

#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "core/base/remote_addr.h"
#include "core/probe/insn_fixup.h"
#include "core/probe/int3_probe.h"

namespace kwatch::core::probe::int3_internal {

inline constexpr uint32_t kNoJournal = std::numeric_limits<uint32_t>::max();

struct Probe {
  RemoteAddr addr;  // the breakpoint it uses (a function's entry for return probes)
  ProbeHandlers handlers;
  bool is_return = false;
  bool enabled = true;
  bool registered = true;
  uint64_t maxhits = 0;
  uint64_t taken = 0;  // return probes: calls tracked so far (what maxhits counts)
  uint32_t maxactive = 0;
  uint32_t active = 0;  // return probes: live instances
  ProbeStats stats;
};

// An out-of-line slot (core/probe/xol.h): copies of the instruction at `probed`.
struct Slot {
  RemoteAddr addr;
  RemoteAddr probed;
  uint8_t length = 0;                  // of the instruction
  std::array<uint8_t, 15> original{};  // its bytes when the copy was made
};

struct Breakpoint {
  RemoteAddr addr;
  ProbedInsn insn;
  bool emulate = false;         // else out of line
  const Slot* slot = nullptr;   // when the instruction can run out of line
  std::vector<ProbeId> probes;  // registration order
  uint32_t journal = kNoJournal;
};

// A tracked call of a return probe's function.
struct Instance {
  uint64_t slot = 0;         // stack address of the return address (rsp at the entry)
  uint64_t real_return = 0;  // what the trampoline replaced
  RemoteAddr function;
  std::vector<ProbeId> probes;
  uint32_t journal = kNoJournal;
};

// Post handlers owed to a thread sent to a copy followed by an INT3.
struct PendingPost {
  RemoteAddr addr;
  std::vector<ProbeId> probes;
};

struct ThreadState {
  std::vector<Instance> instances;  // innermost last
  std::vector<PendingPost> posts;   // innermost last (a signal handler may nest one)
  uint32_t stale_traps = 0;         // SIGTRAPs still to come for traps RestoreAll undid
  // ParkCurrentThread left the thread at this probe's address with the hit's handlers run: its
  // next trap there is the same hit going on (handlers not run again); any trap clears it.
  std::optional<RemoteAddr> parked_at;
};

}  // namespace kwatch::core::probe::int3_internal
