#pragma once

#include <cstdint>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "core/base/remote_addr.h"
#include "core/event.h"
#include "core/symbols/symbolizer.h"
#include "core/x86/access_regs.h"
#include "watch/perf_ring.h"

namespace kwatch::watch {

// What a data-breakpoint sample says about its access.
struct SampledAccess {
  core::RemoteAddr ip;    // the accessing instruction (the trap address when not found)
  bool exact_ip = false;  // the instruction ending at the trap address was found
  bool writes = false;    // it writes memory (how read-write slots tell writes from reads)
  // Exact address, size and value of the access, as far as the instruction and the sampled
  // registers tell (core/access_regs.h).
  core::x86::RegisterAccess access;
};

// The event of a breakpoint sample: its time, process, thread, CPU and trap address.
core::AccessEvent SampleEvent(const PerfSample& s);

// The bytes of a watched range [lo, hi) that a sampled access touched, and their value, as far
// as the decoded instruction and the sampled registers tell (else the whole range, no value).
struct TouchedBytes {
  uint64_t lo = 0;
  uint64_t hi = 0;
  bool op_known = false;          // the access's own address and size are known
  uint64_t op_addr = 0;           // ... its address
  std::optional<uint64_t> value;  // of the bytes the access touched, from op_addr
};
TouchedBytes Touched(const SampledAccess& a, uint64_t lo, uint64_t hi);

// Sets the address, length and value of `e` to the watched part [from, to) of access `t`.
void SetWatchedPart(core::AccessEvent& e, const TouchedBytes& t, uint64_t from, uint64_t to);

// How samples resolved, for people and benchmarks.
struct TrapDecodeStats {
  uint64_t samples = 0;          // Resolve calls
  uint64_t decodes = 0;          // ... that decoded a new trap address (cache misses)
  uint64_t exact_addresses = 0;  // ... with the access's address known
  uint64_t exact_values = 0;     // ... with its value known
};

// Resolves data-breakpoint samples (the CPU reports the instruction *after* the access): finds
// the accessing instruction through the symbolizer (code read from the ELF files, so it works
// after the target exited), plans once per trap address how its address and value follow
// from the registers after it, and evaluates that plan with each sample's user registers.
// Holds a reference to `symbolizer`, which must outlive it. Not thread-safe.
class TrapDecoder {
 public:
  // `regs_mask`: the sample_regs_user mask of the samples' user registers (0: none).
  TrapDecoder(core::symbols::Symbolizer& symbolizer, uint64_t regs_mask)
      : symbolizer_(symbolizer), regs_mask_(regs_mask) {}

  SampledAccess Resolve(const PerfSample& sample);

  const TrapDecodeStats& stats() const { return stats_; }

 private:
  struct Entry {
    core::RemoteAddr ip;
    bool exact_ip = false;
    bool writes = false;
    bool needs_regs = false;  // the plan reads registers
    core::x86::AccessPlan plan;
  };
  const Entry& EntryFor(core::RemoteAddr trap_ip);

  core::symbols::Symbolizer& symbolizer_;
  uint64_t regs_mask_;
  absl::flat_hash_map<uint64_t, Entry> cache_;  // by trap address
  TrapDecodeStats stats_;
};

}  // namespace kwatch::watch
