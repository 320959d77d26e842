#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "core/event.h"
#include "core/remote_addr.h"
#include "watch/session.h"

namespace kwatch::watch {

struct KindCounts {
  uint64_t reads = 0;
  uint64_t writes = 0;
  uint64_t execs = 0;
  uint64_t total() const { return reads + writes + execs; }
  void Add(core::AccessKind k) {
    switch (k) {
      case core::AccessKind::kRead:
        ++reads;
        break;
      case core::AccessKind::kWrite:
        ++writes;
        break;
      case core::AccessKind::kExec:
        ++execs;
        break;
    }
  }
};

// Counts of one watch, per field, per thread and per accessing instruction.
struct WatchCounts {
  KindCounts total;
  absl::flat_hash_map<std::string, KindCounts> fields;
  absl::flat_hash_map<pid_t, KindCounts> threads;
  absl::flat_hash_map<core::RemoteAddr, KindCounts> sites;  // by accessing instruction
};

// Aggregates events of a session into per-watch counts: O(1) amortized per event (field
// lookups are cached per accessed offset and size), memory bounded by fields, threads and
// sites. Not thread-safe.
class Summary {
 public:
  explicit Summary(const std::vector<Watch>& watches);

  void Add(const core::AccessEvent& ev);

  // The fields an event touched: the leaf fields of the watched object that overlap the
  // accessed bytes when the backend knows them (page mode), else the one leaf field the
  // watched range covers, else the watched object's display name. Never empty.
  const std::vector<std::string>& FieldNames(const core::AccessEvent& ev);
  // The same joined with "," for one-line output.
  std::string FieldLabel(const core::AccessEvent& ev);

  const WatchCounts& counts(uint32_t watch_id) const { return counts_[watch_id]; }
  uint64_t events() const { return events_; }

 private:
  const std::vector<Watch>& watches_;
  std::vector<std::vector<std::string>> range_names_;  // per watch: for its whole range
  // per watch: (offset << 32 | size) -> field names
  std::vector<absl::flat_hash_map<uint64_t, std::vector<std::string>>> access_names_;
  std::vector<WatchCounts> counts_;
  uint64_t events_ = 0;
};

// The leaf fields of `layout` overlapping [offset, offset+size), by their effective bytes
// (a bitfield covers only the bytes of its bits), as display + path.
std::vector<std::string> FieldsOverlapping(const std::string& display,
                                           const core::TypeLayout& layout, uint64_t offset,
                                           uint64_t size);

// The display name of the field covered by `w`'s hardware range (see Summary::FieldName).
std::string WatchFieldName(const Watch& w);

}  // namespace kwatch::watch
