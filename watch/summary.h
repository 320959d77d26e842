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

// Aggregates events of a session into per-watch counts: O(1) per event, memory bounded by
// fields, threads and sites. Not thread-safe.
class Summary {
 public:
  explicit Summary(const std::vector<Watch>& watches);

  void Add(const core::AccessEvent& ev);

  // The field an event touched: the watched object's display name plus the path of the one
  // leaf field its range covers, or the display name when it covers several.
  const std::string& FieldName(const core::AccessEvent& ev) const { return field_names_[ev.watch_id]; }

  const WatchCounts& counts(uint32_t watch_id) const { return counts_[watch_id]; }
  uint64_t events() const { return events_; }

 private:
  std::vector<std::string> field_names_;
  std::vector<WatchCounts> counts_;
  uint64_t events_ = 0;
};

// The display name of the field covered by `w`'s hardware range (see Summary::FieldName).
std::string WatchFieldName(const Watch& w);

}  // namespace kwatch::watch
