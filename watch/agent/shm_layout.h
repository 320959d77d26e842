#pragma once

// The shared memory of one agent session (agent/abi.h): how big each table is, where it
// lives, and the control block kwatch writes before the agent's init.
//
//   KwControl | KwProbe[probe_capacity] | KwProbeSlot[hash_capacity] | KwFetchOp[code_capacity]
//   | KwPatch[patch_capacity] | KwProcess[process_capacity] | KwThread[thread_capacity]
//   | KwRing[thread_capacity] | the aggregations' area (aggs_bytes) | KwCallWatch[...]
//
// every part 64-byte aligned, each ring sizeof(KwRing) + ring_bytes. Pure arithmetic.

#include <sys/types.h>

#include <cstdint>
#include <span>

#include "absl/status/statusor.h"

namespace kwatch::watch::agent {

// Capacities kwatch chooses for a target (0: the default said).
struct ShmConfig {
  uint32_t probe_capacity = 256;
  uint32_t hash_capacity = 0;        // power of two; 0: >= 2 x probe_capacity, >= 16
  uint32_t code_capacity = 8192;     // fetch ops in the pool
  uint32_t patch_capacity = 0;       // 0: probe_capacity
  uint32_t thread_capacity = 64;     // KwThread slots, one ring each
  uint32_t ring_bytes = 256 * 1024;  // per thread: a power of two, >= 4096
  uint32_t process_capacity = 1024;  // fork children followed at once (kKwFollowForks)
  uint32_t flags = 0;                // KwControlFlags
  // --agg in the target: KwAggregate headers and rows (pages are allocated as rows are used).
  uint64_t aggs_bytes = 0;
  // Per-call watches (KwCallWatch entries; 0: none) and their breakpoints' rings.
  uint32_t call_watch_capacity = 0;
  uint32_t call_ring_pages = 16;  // data pages per breakpoint ring, a power of two
  uint64_t call_sample_type = 0;  // perf_event_attr.sample_type of their samples
  uint64_t call_sample_regs = 0;  // ... and sample_regs_user
};

struct ShmLayout {
  uint32_t probe_capacity = 0;
  uint32_t hash_capacity = 0;
  uint32_t code_capacity = 0;
  uint32_t patch_capacity = 0;
  uint32_t thread_capacity = 0;
  uint32_t ring_bytes = 0;
  uint32_t process_capacity = 0;
  uint64_t probes_offset = 0;
  uint64_t hash_offset = 0;
  uint64_t code_offset = 0;
  uint64_t patches_offset = 0;
  uint64_t processes_offset = 0;
  uint64_t threads_offset = 0;
  uint64_t rings_offset = 0;
  uint64_t aggs_offset = 0;
  uint64_t aggs_bytes = 0;
  uint64_t call_watches_offset = 0;
  uint32_t call_watch_capacity = 0;
  uint32_t call_ring_pages = 0;
  uint64_t call_sample_type = 0;
  uint64_t call_sample_regs = 0;
  uint64_t total_size = 0;  // a multiple of the page size

  // Bytes from one ring's header to the next one's.
  uint64_t ring_stride() const;
};

// The layout for `config`. InvalidArgument naming the value that is out of range (a ring
// size that is not a power of two, a capacity of 0, a total above 4 GiB).
absl::StatusOr<ShmLayout> ComputeLayout(const ShmConfig& config);

// Writes the control block of a new session into `shm` (layout.total_size bytes, zeroed):
// magic, ABI version, sizes, offsets, capacities, flags, both pids, state Init, generation 0.
// The agent fills its own fields at init.
void InitControl(std::span<uint8_t> shm, const ShmLayout& layout, uint32_t flags,
                 pid_t controller_pid, pid_t target_pid);

}  // namespace kwatch::watch::agent
