#pragma once

#include <sys/types.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "core/base/remote_addr.h"
#include "watch/profile/site_table.h"

namespace kwatch::watch::profile {

inline constexpr uint64_t kCacheLineBytes = 64;

// What one thread wrote to one cache line.
struct LineWriter {
  uint32_t thread = 0;  // index into StorageProfile::threads()
  uint64_t writes = 0;  // write events touching the line
  uint64_t mask = 0;    // every byte of the line it wrote (bit i = byte i)
  // (CacheLine::fields position, writes) of the fields it wrote, by position.
  std::vector<std::pair<uint32_t, uint64_t>> field_writes;
  SiteTable sites;  // writing instructions (bounded, see SiteTable)
};

// One 64-byte cache line holding watched fields, and the writes to it. Passive data; the
// profile updates it through RecordLineWrite.
struct CacheLine {
  static constexpr uint32_t kNoThread = ~0U;

  core::RemoteAddr addr;            // absolute, 64-byte aligned
  std::vector<uint32_t> fields;     // global field indices (StorageProfile), by address
  std::vector<LineWriter> writers;  // in order of first write
  absl::flat_hash_map<uint32_t, uint32_t> writer_index;  // thread -> position in writers
  uint64_t writes = 0;
  // Writes by a thread other than the line's previous writer within the window: to bytes the
  // previous writer never wrote (false sharing: the threads work on different data of the
  // line), or to some bytes it wrote too (true sharing). Comparing with everything the
  // previous writer wrote, not only its last write, keeps threads that all write the same
  // fields in turn (hits, then misses) from counting as false sharing.
  uint64_t false_transfers = 0;
  uint64_t true_transfers = 0;
  uint64_t first_false_ns = 0;  // times of the first and last false-sharing transfer
  uint64_t last_false_ns = 0;
  // The previous write: its thread, the line's bytes it touched (bit i = byte i), its time.
  uint32_t last_thread = kNoThread;
  uint64_t last_mask = 0;
  uint64_t last_ns = 0;
};

// Records a write by `thread` at `t_ns` to the bytes `mask` of `line`, touching the fields at
// `positions` (indices into line.fields). A write by a thread other than the previous writer,
// at most `window_ns` after it (or before it: out-of-order events count as within), is a
// transfer: false sharing when its bytes are disjoint from the previous write's, else true
// sharing. O(1) expected plus O(fields the write touched + fields the thread wrote in the line);
// allocates only for a new writer or a field the writer had not written.
void RecordLineWrite(CacheLine& line, uint32_t thread, uint64_t mask, const uint32_t* positions,
                     uint32_t n_positions, core::RemoteAddr ip, uint64_t t_ns, uint64_t window_ns,
                     uint32_t site_capacity);

// Evidence that threads write disjoint fields of one line (what perf c2c users look for).
struct FalseSharingFinding {
  struct ThreadWrites {
    uint32_t thread = 0;  // index into StorageProfile::threads()
    pid_t tid = 0;
    uint64_t writes = 0;
    std::vector<std::pair<uint32_t, uint64_t>> fields;  // (global field, writes), by address
    std::vector<SiteCount> top_sites;                   // writing instructions, ranked
    RwCounts other_sites;                               // writes beyond the site table
  };

  uint32_t line = 0;  // index into StorageProfile::lines()
  core::RemoteAddr addr;
  std::vector<uint32_t> fields;         // all watched fields of the line, by address
  std::vector<uint32_t> shared_fields;  // fields written by more than one thread
  std::vector<ThreadWrites> threads;    // by writes, descending
  uint64_t false_transfers = 0;
  uint64_t true_transfers = 0;
  uint64_t first_ns = 0;  // first and last false-sharing transfer (CLOCK_MONOTONIC)
  uint64_t last_ns = 0;
};

// The lines that show false sharing: at least `min_transfers` false-sharing transfers, and
// no fewer false than true ones (the threads' written bytes are disjoint, or mostly so).
// Ranked by false transfers, descending (ties: lower address). Each thread keeps its
// `top_sites` most frequent sites. ThreadWrites::tid is left 0 (the profile fills it in).
std::vector<FalseSharingFinding> FindFalseSharing(const std::vector<CacheLine>& lines,
                                                  uint64_t min_transfers, size_t top_sites);

}  // namespace kwatch::watch::profile
