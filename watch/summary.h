#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "core/base/remote_addr.h"
#include "core/event.h"
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
  // The watches counted against (the first image's, the first object's with --follow).
  const std::vector<Watch>& watches() const { return watches_; }
  uint64_t events() const { return events_; }

 private:
  const std::vector<Watch>& watches_;
  std::vector<std::vector<std::string>> range_names_;  // per watch: for its whole range
  // per watch: (offset << 32 | size) -> field names
  std::vector<absl::flat_hash_map<uint64_t, std::vector<std::string>>> access_names_;
  std::vector<WatchCounts> counts_;
  uint64_t events_ = 0;
};

// Page mode: what the kernel did with protected pages inside the target's system calls.
struct KernelAccessStats {
  struct Syscall {         // per system call name
    uint64_t calls = 0;    // calls that could touch a protected page
    uint64_t bounced = 0;  // ... run on a scratch copy of their buffer
    uint64_t opened = 0;   // ... run with the page(s) opened, the other threads stopped
    uint64_t retried = 0;  // ... that failed with EFAULT there and were run again
    uint64_t events = 0;   // exact kernel accesses to watched bytes, delivered as events
    uint64_t unknown = 0;  // calls given a pointer into watched bytes, accesses not known
  };
  std::map<std::string, Syscall> syscalls;
  // Pages left unprotected while other threads ran (a call slept with the page open):
  // accesses by other threads then were not seen. By (page, syscall name).
  struct Unprotected {
    uint64_t times = 0;
    uint64_t ns = 0;
  };
  std::map<std::pair<uint64_t, std::string>, Unprotected> unprotected;
  uint64_t syscall_stops = 0;  // system-call stops taken while watching (their cost)

  bool empty() const { return syscalls.empty() && unprotected.empty(); }
};

// Summary lines for `stats`, one per syscall and per unprotected page, e.g.
//   "kernel: futex: 12 calls on watched pages (12 run with the page opened, other threads
//    stopped)"
//   "kernel: page 0x5555... unprotected for 3.2 ms during futex() (2 times); accesses by other
//    threads then were not seen"
// Empty when nothing happened.
std::vector<std::string> KernelAccessLines(const KernelAccessStats& stats);

// The same as one JSON object:
//   {"syscall_stops":N,"syscalls":[{"name":"futex","calls":..,"bounced":..,"opened":..,
//    "retried":..,"events":..,"unknown":..}],"unprotected":[{"page":"0x...",
//    "syscall":"readv","times":..,"ms":..}]}
std::string KernelAccessJson(const KernelAccessStats& stats);

// The fields of `layout` accesses count on (core::symbols::CountedFields: leaves, a union as
// one) overlapping [offset, offset+size), by their effective bytes (a bitfield covers only the
// bytes of its bits), as display + path.
std::vector<std::string> FieldsOverlapping(const std::string& display,
                                           const core::symbols::TypeLayout& layout, uint64_t offset,
                                           uint64_t size);

// The display name of the field covered by `w`'s hardware range (see Summary::FieldName).
std::string WatchFieldName(const Watch& w);

}  // namespace kwatch::watch
