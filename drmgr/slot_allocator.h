#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "drmgr/allocator_types.h"
#include "drmgr/placement.h"
#include "drmgr/scope.h"

namespace kwatch::drmgr {

// Shares the four x86 debug-register slots of every thread and CPU between clients
// (debuggers, execute probes, watchpoints). Pure logic: no syscalls. Every mutation returns
// the slot changes an applier must make (drmgr/simulator.h, the perf and ptrace appliers)
// and the requests whose state changed, which is how an evicted holder is told.
//
// Decisions. Live requests are ranked by priority (higher first), then, at equal priority,
// those that do not multiplex before those that do, then by arrival (multiplexed ones rotate).
// In rank order each request gets the exact cover of its range when its chunks fit in the
// free slots of its scope, else the widest-fitting aligned superset with the extra bytes
// filtered in software (range_cover.h), else nothing, and then waits, multiplexes or falls
// back to pages according to its ShortagePolicy. Equal chunks of one scope share one slot
// (write + read-write share a read-write slot; the write holder filters reads). Slots are
// counted as the kernel counts them (placement.h: SlotLoad), including slots held outside
// kwatch (MarkExternallyHeld). Who holds hardware is a pure function of the live requests,
// their rotation order and the external counts, so releasing a request restores exactly the
// state before it came; a slot keeps its index while its chunk stays armed, and a request
// that gets its slot back returns to the index it had.
//
// Time: AdvanceClock(now) credits the time since the previous call to every live request
// (time_enabled) and, when armed, to time_armed. Rotate(now) also moves the first member of
// every contended rotation component to the back, once per rotate_interval.
//
// Not thread-safe: one owner calls it (a watch session's control thread).
class SlotAllocator {
 public:
  struct Options {
    absl::Duration rotate_interval = absl::Milliseconds(10);
  };

  SlotAllocator() : SlotAllocator(Options{}) {}
  explicit SlotAllocator(Options options);

  ClientId AddClient(ClientKind kind, std::string name);
  // Releases every request of the client. NotFound for an unknown client.
  absl::StatusOr<Changes> RemoveClient(ClientId client);

  // Records a request and decides. InvalidArgument for a zero length, more than
  // kMaxRequestLen bytes, a range that reaches past the last address, an execute range of other
  // than 1 byte, a malformed scope, or page fallback for a CPU scope (pages cannot protect the
  // kernel). NotFound for an unknown client. A request refused by its policy (kFail), or that can
  // never fit in 4 slots and does not fall back to pages, is recorded as kFailed with the reason:
  // release it like any other. On error nothing changes.
  absl::StatusOr<Grant> Request(ClientId client, SlotRequest request);

  // NotFound for an unknown id. Requests waiting for slots may get them back.
  absl::StatusOr<Changes> Release(RequestId id);

  // `n` slots of `scope` are held outside kwatch (e.g. the kernel said ENOSPC, or a debugger
  // holds them); replaces the previous count. Lowest-ranked holders lose their slots.
  // InvalidArgument unless 0 <= n <= 4.
  absl::StatusOr<Changes> MarkExternallyHeld(const Scope& scope, int n);
  int ExternallyHeld(const Scope& scope) const;

  // The applier could not make the last change list real because the kernel refused a slot
  // of `scope` (ENOSPC) and rolled back: the slots are as before that list, and one more slot
  // of `scope` is held outside kwatch. Returns the changes from the state before that list
  // (call again if applying them fails the same way). FailedPrecondition when all 4 slots
  // of `scope` are already counted as external.
  absl::StatusOr<Changes> ReportNoSpace(const Scope& scope);

  void AdvanceClock(absl::Time now);
  // AdvanceClock(now), then one rotation step when rotate_interval has passed since the last.
  Changes Rotate(absl::Time now);
  absl::Duration rotate_interval() const { return options_.rotate_interval; }

  AllocatorSnapshot Snapshot() const;
  // NotFound for an unknown id.
  absl::StatusOr<RequestView> Describe(RequestId id) const;

 private:
  struct ClientRec {
    ClientKind kind = ClientKind::kWatchpoint;
    std::string name;
  };
  // A slot's identity within its scope; the index and holders may change around it.
  struct SlotKey {
    Scope scope;
    Chunk chunk;
    bool exec = false;
    // The 0 and the bool the synthesized comparisons use are no code of ours: clang-tidy 14
    // bug (llvm-project#53961).
    // NOLINTNEXTLINE(modernize-use-nullptr, readability-implicit-bool-conversion)
    auto operator<=>(const SlotKey&) const = default;
  };
  struct RequestRec {
    ClientId client;
    SlotRequest request;
    uint64_t seq = 0;                   // rank among equals; Rotate bumps it
    std::optional<std::string> failed;  // refused at admission
    std::string who;                    // "request 3 (debugger 'gdb', priority 100)"
    absl::Duration enabled;
    absl::Duration armed;
    std::set<SlotKey> covers;  // slots of every cover it held: where it returns to
  };
  struct NumberedSlot {
    int index = 0;
    DrKind kind = DrKind::kWrite;
    std::vector<SlotHolder> holders;
  };

  std::string Who(RequestId id) const;
  Decision DecideNow() const;
  // Numbers the slots of `next`, makes it current and returns the way there.
  Changes Commit(Decision next);
  RequestView View(RequestId id, const RequestRec& rec) const;

  Options options_;
  std::map<ClientId, ClientRec> clients_;
  std::map<RequestId, RequestRec> requests_;
  std::map<Scope, int> external_;
  uint64_t next_client_ = 1;
  uint64_t next_request_ = 1;
  uint64_t next_seq_ = 1;

  Decision decision_;                         // current
  std::map<SlotKey, NumberedSlot> numbered_;  // current slots with their indices
  std::map<SlotKey, NumberedSlot> previous_;  // ... before the last change list
  std::map<SlotKey, int> home_;               // last index of each wanted slot
  absl::Time clock_ = absl::InfinitePast();
  absl::Time last_rotation_ = absl::InfinitePast();
};

}  // namespace kwatch::drmgr
