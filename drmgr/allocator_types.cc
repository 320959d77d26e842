#include "drmgr/allocator_types.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace kwatch::drmgr {
namespace {

std::string Ids(const std::vector<RequestId>& ids) {
  return absl::StrJoin(ids, ", ",
                       [](std::string* out, RequestId id) { absl::StrAppend(out, id.value); });
}

std::string ChunkText(const Chunk& c, DrKind kind) {
  return absl::StrFormat("%d bytes at 0x%x %s", c.len, c.addr.value, DrKindName(kind));
}

}  // namespace

absl::string_view ClientKindName(ClientKind kind) {
  switch (kind) {
    case ClientKind::kDebugger:
      return "debugger";
    case ClientKind::kExecProbe:
      return "execute probe";
    case ClientKind::kWatchpoint:
      return "watchpoint";
  }
  return "?";
}

int DefaultPriority(ClientKind kind) {
  switch (kind) {
    case ClientKind::kDebugger:
      return 100;
    case ClientKind::kExecProbe:
      return 50;
    case ClientKind::kWatchpoint:
      return 10;
  }
  return 0;
}

absl::string_view ShortagePolicyName(ShortagePolicy policy) {
  switch (policy) {
    case ShortagePolicy::kFail:
      return "fail";
    case ShortagePolicy::kPreemptLower:
      return "preempt-lower";
    case ShortagePolicy::kMultiplex:
      return "multiplex";
    case ShortagePolicy::kFallbackPages:
      return "pages";
  }
  return "?";
}

absl::string_view RequestStateName(RequestState state) {
  switch (state) {
    case RequestState::kHardware:
      return "hardware";
    case RequestState::kMultiplexed:
      return "multiplexed";
    case RequestState::kPreempted:
      return "preempted";
    case RequestState::kFallbackPages:
      return "pages";
    case RequestState::kFailed:
      return "failed";
  }
  return "?";
}

absl::string_view SlotStateName(SlotState state) {
  switch (state) {
    case SlotState::kFree:
      return "free";
    case SlotState::kArmed:
      return "armed";
    case SlotState::kMultiplexed:
      return "multiplexed";
    case SlotState::kPreempted:
      return "preempted";
    case SlotState::kExternal:
      return "external";
  }
  return "?";
}

double RequestView::coverage() const {
  if (time_enabled <= absl::ZeroDuration()) {
    return armed ? 1.0 : 0.0;
  }
  return absl::FDivDuration(time_armed, time_enabled);
}

std::string SlotChange::ToString() const {
  switch (op) {
    case Op::kDisarm:
      return absl::StrFormat("disarm %s slot %d: %s", scope.ToString(), slot,
                             ChunkText(chunk, kind));
    case Op::kUpdateHolders:
    case Op::kArm: {
      std::vector<RequestId> ids;
      for (const SlotHolder& h : holders) {
        ids.push_back(h.id);
      }
      return absl::StrFormat("%s %s slot %d: %s (requests %s)", op == Op::kArm ? "arm" : "update",
                             scope.ToString(), slot, ChunkText(chunk, kind), Ids(ids));
    }
  }
  return "?";
}

std::string AllocatorSnapshot::ToString() const {
  std::string out;
  for (const ScopeView& s : scopes) {
    absl::StrAppendFormat(&out, "%s: %d free, %d held outside kwatch\n", s.scope.ToString(), s.free,
                          s.external);
    for (int i = 0; i < kNumDebugRegisters; ++i) {
      const SlotView& v = s.slots[i];
      absl::StrAppendFormat(&out, "  DR%d %-11s", i, SlotStateName(v.state));
      if (!v.holders.empty()) {
        absl::StrAppendFormat(&out, " %s, requests %s", ChunkText(v.chunk, v.kind), Ids(v.holders));
      }
      if (v.state == SlotState::kMultiplexed) {
        absl::StrAppendFormat(&out, ", coverage %.0f%%", 100 * v.coverage);
      }
      if (!v.displaced.empty()) {
        absl::StrAppend(&out, ", waiting: ", Ids(v.displaced));
      }
      absl::StrAppend(&out, "\n");
    }
  }
  for (const RequestView& r : requests) {
    absl::StrAppendFormat(&out, "request %d [%s, priority %d, %s] %s%s: %s\n", r.id.value,
                          ClientKindName(r.client_kind), r.request.priority,
                          ShortagePolicyName(r.request.policy), RequestStateName(r.state),
                          r.armed ? " armed" : "", r.reason);
  }
  return out;
}

}  // namespace kwatch::drmgr
