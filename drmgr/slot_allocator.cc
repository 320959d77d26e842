#include "drmgr/slot_allocator.h"

#include <algorithm>
#include <limits>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "core/base/status_macros.h"

namespace kwatch::drmgr {
namespace {

absl::Status Validate(const SlotRequest& r) {
  if (r.len == 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("zero-length range at 0x%x: nothing to watch", r.addr.value));
  }
  if (r.len > kMaxRequestLen) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%d bytes at 0x%x: more than the %d bytes kwatch splits into debug registers (4 "
        "slots hold at most 32 bytes); watch it with page protection",
        r.len, r.addr.value, kMaxRequestLen));
  }
  if (r.len > std::numeric_limits<uint64_t>::max() - r.addr.value) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%d bytes at 0x%x wrap around the end of the address space", r.len, r.addr.value));
  }
  if (r.kind == DrKind::kExec) {
    KW_RETURN_IF_ERROR(CheckHardwareRange(r.addr, r.len, r.kind));
  }
  switch (r.scope.kind) {
    case Scope::Kind::kThread:
      if (r.scope.pid <= 0 || r.scope.tid <= 0) {
        return absl::InvalidArgumentError(
            absl::StrFormat("a thread scope needs a process and a thread id (got pid %d, tid %d)",
                            r.scope.pid, r.scope.tid));
      }
      break;
    case Scope::Kind::kProcess:
      if (r.scope.pid <= 0) {
        return absl::InvalidArgumentError(
            absl::StrFormat("a process scope needs a process id (got %d)", r.scope.pid));
      }
      break;
    case Scope::Kind::kCpu:
      if (r.scope.cpu < 0) {
        return absl::InvalidArgumentError(
            absl::StrFormat("a CPU scope needs a CPU number (got %d)", r.scope.cpu));
      }
      break;
    case Scope::Kind::kAllCpus:
      break;
  }
  if (!r.scope.is_task() && r.policy == ShortagePolicy::kFallbackPages) {
    return absl::InvalidArgumentError(
        absl::StrCat("page protection cannot stand in for a debug register of ", r.scope.ToString(),
                     ": CPU scopes watch kernel memory; choose fail, preempt-lower or multiplex"));
  }
  return absl::OkStatus();
}

// Whether a request lost anything it had: a displacement that policy kFail refuses.
bool Worse(const Placement& before, const Placement& after) {
  return before.armed != after.armed || before.state != after.state ||
         before.cover.chunks != after.cover.chunks;
}

bool OrderBySlot(const SlotChange& a, const SlotChange& b) {
  return std::tie(a.scope, a.slot) < std::tie(b.scope, b.slot);
}

}  // namespace

SlotAllocator::SlotAllocator(Options options) : options_(options) {}

ClientId SlotAllocator::AddClient(ClientKind kind, std::string name) {
  const ClientId id{next_client_++};
  clients_[id] = ClientRec{kind, std::move(name)};
  return id;
}

absl::StatusOr<Changes> SlotAllocator::RemoveClient(ClientId client) {
  if (clients_.erase(client) == 0) {
    return absl::NotFoundError(absl::StrCat("no client ", client.value));
  }
  for (auto it = requests_.begin(); it != requests_.end();) {
    it = it->second.client == client ? requests_.erase(it) : std::next(it);
  }
  return Commit(DecideNow());
}

std::string SlotAllocator::Who(RequestId id) const {
  const RequestRec& rec = requests_.at(id);
  const ClientRec& client = clients_.at(rec.client);
  std::string out = absl::StrCat("request ", id.value, " (", ClientKindName(client.kind));
  if (!client.name.empty()) {
    absl::StrAppend(&out, " '", client.name, "'");
  }
  if (!rec.request.label.empty()) {
    absl::StrAppend(&out, ", ", rec.request.label);
  }
  absl::StrAppend(&out, ", priority ", rec.request.priority, ")");
  return out;
}

Decision SlotAllocator::DecideNow() const {
  std::vector<std::pair<std::tuple<int, bool, uint64_t>, RankedRequest>> keyed;
  keyed.reserve(requests_.size());
  for (const auto& [id, rec] : requests_) {
    const bool mux = rec.request.policy == ShortagePolicy::kMultiplex;
    keyed.emplace_back(std::make_tuple(-rec.request.priority, mux, rec.seq),
                       RankedRequest{id, &rec.request, &rec.who, &rec.failed});
  }
  std::sort(keyed.begin(), keyed.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<RankedRequest> ranked;
  ranked.reserve(keyed.size());
  for (auto& [key, r] : keyed) {
    ranked.push_back(r);
  }
  return Decide(ranked, external_);
}

absl::StatusOr<Grant> SlotAllocator::Request(ClientId client, SlotRequest request) {
  if (!clients_.contains(client)) {
    return absl::NotFoundError(absl::StrCat("no client ", client.value));
  }
  KW_RETURN_IF_ERROR(Validate(request));
  const RequestId id{next_request_++};
  RequestRec& rec = requests_[id];
  rec.client = client;
  rec.request = std::move(request);
  rec.seq = next_seq_++;
  rec.who = Who(id);
  const SlotRequest& req = rec.request;
  if (req.kind != DrKind::kExec && req.policy != ShortagePolicy::kFallbackPages) {
    const CoverChoice alone = ChooseCover(req.addr, req.len, kNumDebugRegisters);
    if (alone.kind == CoverChoice::Kind::kNone) {
      rec.failed =
          absl::StrCat(alone.explanation, "; a thread or CPU has only ", kNumDebugRegisters,
                       " debug registers: fall back to page protection for it");
    }
  }
  Decision next = DecideNow();
  if (!rec.failed && req.policy == ShortagePolicy::kFail) {
    const Placement& p = next.requests.at(id);
    if (!p.armed) {
      rec.failed =
          absl::StrCat("no free slot: ", absl::StripPrefix(p.reason, "waiting for a slot: "));
    } else {
      std::vector<std::string> victims;
      for (const auto& [other, before] : decision_.requests) {
        if (Worse(before, next.requests.at(other))) {
          victims.push_back(requests_.at(other).who);
        }
      }
      if (!victims.empty()) {
        rec.failed = absl::StrCat("would take slots from ", absl::StrJoin(victims, ", "),
                                  "; policy is fail (preempt-lower would take them)");
      }
    }
    if (rec.failed) {
      next = DecideNow();
    }
  }
  Grant grant;
  grant.id = id;
  grant.changes = Commit(std::move(next));
  const Placement& p = decision_.requests.at(id);
  grant.state = p.state;
  grant.reason = p.reason;
  return grant;
}

absl::StatusOr<Changes> SlotAllocator::Release(RequestId id) {
  if (requests_.erase(id) == 0) {
    return absl::NotFoundError(absl::StrCat("no request ", id.value, " (released already?)"));
  }
  return Commit(DecideNow());
}

absl::StatusOr<Changes> SlotAllocator::MarkExternallyHeld(const Scope& scope, int n) {
  if (n < 0 || n > kNumDebugRegisters) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%d slots held outside kwatch in %s: must be 0 to %d", n, scope.ToString(),
                        kNumDebugRegisters));
  }
  if (n == 0) {
    external_.erase(scope);
  } else {
    external_[scope] = n;
  }
  return Commit(DecideNow());
}

int SlotAllocator::ExternallyHeld(const Scope& scope) const {
  auto it = external_.find(scope);
  return it == external_.end() ? 0 : it->second;
}

absl::StatusOr<Changes> SlotAllocator::ReportNoSpace(const Scope& scope) {
  const int held = ExternallyHeld(scope);
  if (held >= kNumDebugRegisters) {
    return absl::FailedPreconditionError(
        absl::StrCat("the kernel refused a debug register of ", scope.ToString(), ", but all ",
                     kNumDebugRegisters, " are already counted as held outside kwatch"));
  }
  external_[scope] = held + 1;
  numbered_ = previous_;
  return Commit(DecideNow());
}

void SlotAllocator::AdvanceClock(absl::Time now) {
  if (clock_ == absl::InfinitePast()) {
    clock_ = now;
    return;
  }
  if (now <= clock_) {
    return;
  }
  const absl::Duration dt = now - clock_;
  clock_ = now;
  for (auto& [id, rec] : requests_) {
    if (rec.failed) {
      continue;
    }
    rec.enabled += dt;
    auto it = decision_.requests.find(id);
    if (it != decision_.requests.end() && it->second.armed) {
      rec.armed += dt;
    }
  }
}

Changes SlotAllocator::Rotate(absl::Time now) {
  AdvanceClock(now);
  if (last_rotation_ != absl::InfinitePast() && now - last_rotation_ < options_.rotate_interval) {
    return {};
  }
  last_rotation_ = now;
  bool rotated = false;
  for (size_t c = 0; c < decision_.contended.size(); ++c) {
    if (decision_.contended[c] && !decision_.members[c].empty()) {
      requests_.at(decision_.members[c].front()).seq = next_seq_++;
      rotated = true;
    }
  }
  return rotated ? Commit(DecideNow()) : Changes{};
}

Changes SlotAllocator::Commit(Decision next) {
  // Number the slots: a slot whose chunk stays armed keeps its index, a returning one gets its
  // old index back when free, others take the lowest free index of their scope.
  std::map<SlotKey, NumberedSlot> numbered;
  std::map<Scope, std::array<bool, kNumDebugRegisters>> used;
  std::vector<std::pair<SlotKey, NumberedSlot>> fresh;
  for (const PlacedSlot& s : next.slots) {
    const SlotKey key{s.scope, s.chunk, s.kind == DrKind::kExec};
    NumberedSlot n;
    n.kind = s.kind;
    for (RequestId h : s.holders) {
      const SlotRequest& r = requests_.at(h).request;
      n.holders.push_back(SlotHolder{h, r.addr, r.len, r.kind});
    }
    auto it = numbered_.find(key);
    if (it != numbered_.end()) {
      n.index = it->second.index;
      used[s.scope][n.index] = true;
      numbered.emplace(key, std::move(n));
    } else {
      fresh.emplace_back(key, std::move(n));
    }
  }
  for (auto& [key, n] : fresh) {
    auto& taken = used[key.scope];
    auto home = home_.find(key);
    n.index = -1;
    if (home != home_.end() && !taken[home->second]) {
      n.index = home->second;
    }
    for (int i = 0; n.index < 0 && i < kNumDebugRegisters; ++i) {
      if (!taken[i]) {
        n.index = i;
      }
    }
    KW_CHECK(n.index >= 0);  // Decide never gives a scope more than 4 slots
    taken[n.index] = true;
    numbered.emplace(key, std::move(n));
  }

  Changes ch;
  std::vector<SlotChange> disarms;
  std::vector<SlotChange> updates;
  std::vector<SlotChange> arms;
  for (const auto& [key, old] : numbered_) {
    auto it = numbered.find(key);
    if (it == numbered.end() || it->second.index != old.index || it->second.kind != old.kind) {
      disarms.push_back(
          SlotChange{SlotChange::Op::kDisarm, key.scope, old.index, key.chunk, old.kind, {}});
    }
  }
  for (const auto& [key, n] : numbered) {
    auto it = numbered_.find(key);
    if (it == numbered_.end() || it->second.index != n.index || it->second.kind != n.kind) {
      arms.push_back(
          SlotChange{SlotChange::Op::kArm, key.scope, n.index, key.chunk, n.kind, n.holders});
    } else if (it->second.holders != n.holders) {
      updates.push_back(SlotChange{SlotChange::Op::kUpdateHolders, key.scope, n.index, key.chunk,
                                   n.kind, n.holders});
    }
  }
  for (auto* list : {&disarms, &updates, &arms}) {
    std::sort(list->begin(), list->end(), OrderBySlot);
    ch.slots.insert(ch.slots.end(), list->begin(), list->end());
  }
  for (const auto& [id, p] : next.requests) {
    auto old = decision_.requests.find(id);
    RequestChange rc{id, std::nullopt, p.state, false, p.armed, p.reason};
    if (old != decision_.requests.end()) {
      rc.from = old->second.state;
      rc.was_armed = old->second.armed;
      if (old->second.state == p.state && old->second.armed == p.armed) {
        continue;
      }
    }
    ch.requests.push_back(std::move(rc));
  }

  // Remember where every live request's covers live, so that it returns there.
  for (const auto& [id, p] : next.requests) {
    if (!p.armed) {
      continue;
    }
    RequestRec& rec = requests_.at(id);
    for (const Chunk& c : p.cover.chunks) {
      rec.covers.insert(SlotKey{rec.request.scope, c, rec.request.kind == DrKind::kExec});
    }
  }
  for (const auto& [key, n] : numbered) {
    home_[key] = n.index;
  }
  std::set<SlotKey> wanted;
  for (const auto& [id, rec] : requests_) {
    wanted.insert(rec.covers.begin(), rec.covers.end());
  }
  for (auto it = home_.begin(); it != home_.end();) {
    it = numbered.contains(it->first) || wanted.contains(it->first) ? std::next(it)
                                                                    : home_.erase(it);
  }
  previous_ = std::move(numbered_);
  numbered_ = std::move(numbered);
  decision_ = std::move(next);
  return ch;
}

RequestView SlotAllocator::View(RequestId id, const RequestRec& rec) const {
  const Placement& p = decision_.requests.at(id);
  RequestView v;
  v.id = id;
  v.client = rec.client;
  v.client_kind = clients_.at(rec.client).kind;
  v.request = rec.request;
  v.state = p.state;
  v.armed = p.armed;
  if (p.armed) {
    v.chunks = p.cover.chunks;
    for (const Chunk& c : p.cover.chunks) {
      v.slots.push_back(
          numbered_.at(SlotKey{rec.request.scope, c, rec.request.kind == DrKind::kExec}).index);
    }
    v.exact = p.cover.kind == CoverChoice::Kind::kExact;
    v.bytes_filtered = p.cover.bytes_outside;
  }
  v.shared = p.shared;
  v.filter_reads = p.filter_reads;
  v.time_enabled = rec.enabled;
  v.time_armed = rec.armed;
  v.reason = p.reason;
  return v;
}

absl::StatusOr<RequestView> SlotAllocator::Describe(RequestId id) const {
  auto it = requests_.find(id);
  if (it == requests_.end()) {
    return absl::NotFoundError(absl::StrCat("no request ", id.value));
  }
  return View(id, it->second);
}

AllocatorSnapshot SlotAllocator::Snapshot() const {
  AllocatorSnapshot snap;
  std::map<RequestId, RequestView> views;
  for (const auto& [id, rec] : requests_) {
    views.emplace(id, View(id, rec));
  }
  std::map<Scope, ScopeView> scopes;
  const auto scope_view = [&](const Scope& s) -> ScopeView& {
    auto [it, inserted] = scopes.try_emplace(s);
    if (inserted) {
      it->second.scope = s;
      it->second.external = ExternallyHeld(s);
      it->second.free = decision_.load.Free(s);
    }
    return it->second;
  };
  for (const auto& [id, rec] : requests_) {
    scope_view(rec.request.scope);
  }
  for (const auto& [s, n] : external_) {
    scope_view(s);
  }
  for (const auto& [key, n] : numbered_) {
    SlotView& slot = scope_view(key.scope).slots[n.index];
    slot.state = SlotState::kArmed;
    slot.chunk = key.chunk;
    slot.kind = n.kind;
    int top_priority = std::numeric_limits<int>::min();
    for (const SlotHolder& h : n.holders) {
      const RequestView& hv = views.at(h.id);
      slot.holders.push_back(h.id);
      top_priority = std::max(top_priority, hv.request.priority);
      if (hv.state == RequestState::kMultiplexed) {
        slot.state = SlotState::kMultiplexed;
        slot.coverage = std::min(slot.coverage, hv.coverage());
      }
    }
    for (const auto& [id, v] : views) {
      if (!v.armed && v.state != RequestState::kFailed && v.request.priority < top_priority &&
          Overlaps(v.request.scope, key.scope)) {
        slot.displaced.push_back(id);
      }
    }
    if (slot.state == SlotState::kArmed && !slot.displaced.empty()) {
      slot.state = SlotState::kPreempted;
    }
  }
  for (auto& [s, view] : scopes) {
    int left = view.external;
    for (int i = kNumDebugRegisters - 1; i >= 0 && left > 0; --i) {
      if (view.slots[i].state == SlotState::kFree) {
        view.slots[i].state = SlotState::kExternal;
        --left;
      }
    }
    snap.scopes.push_back(std::move(view));
  }
  for (auto& [id, v] : views) {
    snap.requests.push_back(std::move(v));
  }
  return snap;
}

}  // namespace kwatch::drmgr
