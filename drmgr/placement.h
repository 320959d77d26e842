#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "drmgr/allocator_types.h"
#include "drmgr/range_cover.h"
#include "drmgr/scope.h"

// The allocator's decision function: which requests hold which (unnumbered) slots, given the
// live requests in rank order and the slots held outside kwatch. Pure and deterministic; the
// SlotAllocator numbers the slots, keeps time and computes change lists around it.
namespace kwatch::drmgr {

// Slots in use per scope (kwatch's own plus external ones) and what a scope can still take,
// counted as the kernel counts breakpoint slots: a thread carries its own slots, its
// process's, and those of every CPU scope; a CPU carries its own, all-CPU ones and the
// busiest task's.
class SlotLoad {
 public:
  // Counts only grow (n >= 0), so the maxima below are kept up to date as they go.
  void Add(const Scope& scope, int n);
  int Own(const Scope& scope) const;
  // Slots a new chunk of `scope` could still get (0 when over-full).
  int Free(const Scope& scope) const;

 private:
  int MaxThreadOf(pid_t pid) const;

  std::map<Scope, int> own_;
  std::map<pid_t, int> max_thread_;  // per process: its busiest thread's own slots
  int max_cpu_ = 0;                  // the busiest CPU scope's own slots
  int max_task_ = 0;                 // the busiest thread's slots, process ones included
};

struct PlacedSlot {
  Scope scope;
  Chunk chunk;
  DrKind kind = DrKind::kWrite;  // read-write as soon as one holder wants reads
  std::vector<RequestId> holders;
};

struct Placement {
  RequestState state = RequestState::kPreempted;
  bool armed = false;
  CoverChoice cover;          // when armed
  std::vector<size_t> slots;  // into Decision::slots, one per cover chunk
  bool shared = false;
  bool filter_reads = false;
  std::string reason;
  int component = -1;     // kMultiplex: rotation component
  bool rotating = false;  // kMultiplex: gets hardware when first in its component
};

struct Decision {
  std::vector<PlacedSlot> slots;
  std::map<RequestId, Placement> requests;
  SlotLoad load;
  // Per rotation component: whether some member waits for its turn (Rotate has work).
  std::vector<bool> contended;
  // Per rotation component: its rotating members in rank order.
  std::vector<std::vector<RequestId>> members;
};

struct RankedRequest {
  RequestId id;
  const SlotRequest* request = nullptr;
  const std::string* who = nullptr;                    // "request 3 (debugger 'gdb', priority 100)"
  const std::optional<std::string>* failed = nullptr;  // refused at admission: the reason
};

// Requests must come in rank order: priority descending; at equal priority, requests that
// do not multiplex before those that do; then by rotation sequence (arrival, bumped by
// Rotate). `external` gives slots held outside kwatch per scope.
Decision Decide(const std::vector<RankedRequest>& ranked, const std::map<Scope, int>& external);

}  // namespace kwatch::drmgr
