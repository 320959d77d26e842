#pragma once

#include <array>
#include <compare>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "core/base/remote_addr.h"
#include "drmgr/debug_regs.h"
#include "drmgr/range_cover.h"
#include "drmgr/scope.h"

// The data the slot allocator takes and gives back: requests, decisions, change lists.
namespace kwatch::drmgr {

struct RequestId {
  uint64_t value = 0;
  // NOLINTNEXTLINE(modernize-use-nullptr): clang-tidy 14 bug (llvm-project#53961)
  auto operator<=>(const RequestId&) const = default;
};

struct ClientId {
  uint64_t value = 0;
  // NOLINTNEXTLINE(modernize-use-nullptr): clang-tidy 14 bug (llvm-project#53961)
  auto operator<=>(const ClientId&) const = default;
};

enum class ClientKind : uint8_t { kDebugger, kExecProbe, kWatchpoint };
absl::string_view ClientKindName(ClientKind kind);
// Debugger 100, execute probe 50, watchpoint 10: a debugger preempts the others.
int DefaultPriority(ClientKind kind);

// What a request does while the slots it needs are held by requests of equal or higher
// priority. Priority always decides who holds hardware: a request takes slots from strictly
// lower priorities whatever its policy (except kFail, which is refused instead, below).
enum class ShortagePolicy : uint8_t {
  kFail,           // refused (state kFailed) unless it gets hardware at once without taking
                   // anyone's slot; if a higher priority takes its slots later: kPreempted
  kPreemptLower,   // takes slots from lower priorities; if still short: kPreempted, waiting
  kMultiplex,      // takes turns with other kMultiplex requests of its priority (Rotate)
  kFallbackPages,  // page protection until a slot frees (task scopes only)
};
absl::string_view ShortagePolicyName(ShortagePolicy policy);

// Larger ranges are refused: hardware covers at most 32 bytes per scope, and splitting
// costs time and memory per byte. Use page protection for them directly.
inline constexpr uint64_t kMaxRequestLen = uint64_t{1} << 20;

struct SlotRequest {
  core::RemoteAddr addr;  // absolute address in the target (bias-corrected by the caller)
  uint64_t len = 0;       // bytes; 1 for kExec
  DrKind kind = DrKind::kWrite;
  Scope scope;
  int priority = 10;
  ShortagePolicy policy = ShortagePolicy::kFail;
  std::string label;  // for people: "g_stats.hits"

  bool operator==(const SlotRequest&) const = default;
};

enum class RequestState : uint8_t {
  kHardware,       // all chunks armed (maybe split, shared or widened; see RequestView)
  kMultiplexed,    // takes turns for slots; `armed` says whether it holds them right now
  kPreempted,      // holds no slot: taken by a higher priority, or waiting for a free one
  kFallbackPages,  // watch with page protection; back to hardware when a slot frees
  kFailed,         // refused (policy kFail, or the range can never fit in 4 slots)
};
absl::string_view RequestStateName(RequestState state);

struct RequestView {
  RequestId id;
  ClientId client;
  ClientKind client_kind = ClientKind::kWatchpoint;
  SlotRequest request;
  RequestState state = RequestState::kPreempted;
  bool armed = false;           // in hardware right now
  std::vector<Chunk> chunks;    // the hardware cover while armed, in address order
  std::vector<int> slots;       // slot index in request.scope of each chunk
  bool exact = true;            // chunks are exactly the range; else a wide cover
  uint64_t bytes_filtered = 0;  // bytes of a wide cover outside the range
  bool shared = false;          // some slot also serves another request
  bool filter_reads = false;    // write request on a read-write slot: drop reads in software
  absl::Duration time_enabled;  // since the request, as accounted by AdvanceClock
  absl::Duration time_armed;    // ... of which in hardware
  std::string reason;           // the cover choice, or why it is not in hardware

  // time_armed / time_enabled (1 or 0 by `armed` before any time passed). Counts seen in
  // hardware scale to the whole time as count / coverage(), as perf scales counters.
  double coverage() const;
  bool operator==(const RequestView&) const = default;
};

enum class SlotState : uint8_t {
  kFree,
  kArmed,
  kMultiplexed,  // armed for a multiplexed request (this turn)
  kPreempted,    // armed for a higher priority while `displaced` requests wait
  kExternal,     // held outside kwatch (learned from the kernel)
};
absl::string_view SlotStateName(SlotState state);

struct SlotView {
  SlotState state = SlotState::kFree;
  Chunk chunk;
  DrKind kind = DrKind::kWrite;
  std::vector<RequestId> holders;    // who receives its hits
  std::vector<RequestId> displaced;  // lower priorities of overlapping scopes left waiting
  double coverage = 1.0;             // kMultiplexed: lowest coverage among holders
  bool operator==(const SlotView&) const = default;
};

struct ScopeView {
  Scope scope;
  std::array<SlotView, kNumDebugRegisters> slots;
  int external = 0;  // slots held outside kwatch in this scope
  int free = 0;      // slots a new request could take here (shared scopes counted)
  bool operator==(const ScopeView&) const = default;
};

struct AllocatorSnapshot {
  std::vector<ScopeView> scopes;      // by Scope order
  std::vector<RequestView> requests;  // by id
  bool operator==(const AllocatorSnapshot&) const = default;
  std::string ToString() const;  // a table for people and test failures
};

// Who receives a slot's hits, and what they asked for (for software filtering).
struct SlotHolder {
  RequestId id;
  core::RemoteAddr addr;
  uint64_t len = 0;
  DrKind kind = DrKind::kWrite;
  bool operator==(const SlotHolder&) const = default;
};

// One step for an applier. Disarms come first in a change list, then updates and arms, so
// that an applier never needs more slots than the final state.
struct SlotChange {
  enum class Op : uint8_t { kDisarm, kUpdateHolders, kArm };
  Op op = Op::kArm;
  Scope scope;
  int slot = 0;  // 0..3 within the scope
  Chunk chunk;
  DrKind kind = DrKind::kWrite;
  std::vector<SlotHolder> holders;  // kArm, kUpdateHolders: the new holders
  bool operator==(const SlotChange&) const = default;
  std::string ToString() const;  // "arm CPU 1 slot 2: 8 bytes at 0x1000 write (requests 3, 4)"
};

// A request whose state or armed flag changed: how the evicted are told.
struct RequestChange {
  RequestId id;
  std::optional<RequestState> from;  // nullopt for a new request
  RequestState to = RequestState::kHardware;
  bool was_armed = false;
  bool armed = false;
  std::string reason;
  bool operator==(const RequestChange&) const = default;
};

struct Changes {
  std::vector<SlotChange> slots;
  std::vector<RequestChange> requests;
  bool empty() const { return slots.empty() && requests.empty(); }
};

struct Grant {
  RequestId id;
  RequestState state = RequestState::kHardware;
  std::string reason;
  Changes changes;
};

}  // namespace kwatch::drmgr
