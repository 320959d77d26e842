// WatchSession's --follow part: the pointers of followed watches in debug registers (stop mode),
// and the move of a watch when one of them is written, made while every thread is stopped.
#include <algorithm>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "core/base/clock.h"
#include "core/base/status_macros.h"
#include "core/symbols/expr.h"
#include "drmgr/applier.h"
#include "watch/session.h"
#include "watch/session_policy.h"
#include "watch/stop_backend.h"

namespace kwatch::watch {

namespace {

// Owner ids of pointer requests in the slot backend: above any watch id.
constexpr uint32_t kPointerOwnerBase = 0x40000000;

}  // namespace

absl::Status WatchSession::CheckFollow(const core::symbols::Symbols& symbols,
                                       std::vector<WatchRequest>& requests,
                                       std::map<size_t, FollowedWatch>& shapes,
                                       std::vector<std::string>& notes) {
  for (size_t i = 0; i < requests.size(); ++i) {
    WatchRequest& req = requests[i];
    if (!req.follow) {
      continue;
    }
    if (req.kind == drmgr::DrKind::kExec) {
      return absl::InvalidArgumentError(
          absl::StrCat("--follow: '", req.expr, "' is code (--exec), which has no pointers"));
    }
    FollowedWatch fw;
    KW_ASSIGN_OR_RETURN(fw.expr, core::symbols::ParseExpr(req.expr));
    absl::StatusOr<core::symbols::ResolvedExpr> shape = symbols.Resolve(fw.expr, AnywhereReader());
    if (!shape.ok()) {
      return {shape.status().code(), absl::StrCat("'", req.expr, "': ", shape.status().message())};
    }
    if (shape->pointers.empty()) {
      // gdb's `watch g_x` and `watch -l g_x` are the same watch: nothing to refuse.
      req.follow = false;
      notes.push_back(absl::StrCat("--follow: '", shape->display,
                                   "' goes through no pointer: nothing to follow, it is watched "
                                   "where it is (as without --follow)"));
      continue;
    }
    fw.shape = *std::move(shape);
    shapes[i] = std::move(fw);
  }
  return absl::OkStatus();
}

absl::Status WatchSession::RequestPointers(uint32_t id, size_t first) {
  FollowedWatch& fw = followed_.at(id);
  for (size_t i = first; i < fw.pointers.size(); ++i) {
    const core::symbols::PointerLoad& p = fw.pointers[i];
    KW_ASSIGN_OR_RETURN(drmgr::Grant g,
                        alloc_->Request(follow_client_, session_internal::PointerRequestFor(
                                                            p, watches_[id], proc_.pid())));
    const uint32_t owner = kPointerOwnerBase + next_pointer_owner_++;
    hw_->AddOwner(g.id, owner);
    pointer_owner_[owner] = {id, i};
    fw.requests.resize(i + 1);
    fw.owners.resize(i + 1);
    fw.requests[i] = g.id;
    fw.owners[i] = owner;
    if (g.state == drmgr::RequestState::kFailed) {
      return absl::ResourceExhaustedError(
          absl::StrCat("--follow: no debug register is left for pointer '", p.display, "' of '",
                       watches_[id].target.display, "': ", PeopleReason(g.reason),
                       "; a followed watch needs one for its object and one for each pointer "
                       "it goes through (",
                       FollowPointersText(fw), ")"));
    }
    if (absl::Status s = drmgr::ApplyWithRetry(*alloc_, *hw_, std::move(g.changes)); !s.ok()) {
      return {s.code(), absl::StrCat("arming pointer '", p.display, "' of '",
                                     watches_[id].target.display, "': ", s.message())};
    }
    KW_ASSIGN_OR_RETURN(const drmgr::RequestView v, alloc_->Describe(g.id));
    if (v.state != drmgr::RequestState::kHardware) {
      return absl::ResourceExhaustedError(
          absl::StrCat("--follow: pointer '", p.display, "' of '", watches_[id].target.display,
                       "' has no debug register: ", PeopleReason(v.reason)));
    }
  }
  return absl::OkStatus();
}

absl::Status WatchSession::ArmFollow() {
  if (followed_.empty()) {
    return absl::OkStatus();
  }
  if (kind_ != BackendKind::kStop || hw_ == nullptr) {
    return absl::FailedPreconditionError("--follow needs stop mode");  // Create made sure
  }
  auto* stop = static_cast<StopBackend*>(hw_.get());  // Arm makes a StopBackend in stop mode
  follow_client_ = alloc_->AddClient(drmgr::ClientKind::kWatchpoint, "kwatch --follow");
  pointer_owner_.clear();
  for (auto& [id, fw] : followed_) {
    fw.requests.clear();
    fw.owners.clear();
    KW_RETURN_IF_ERROR(RequestPointers(id, 0));
  }
  stop->SetSyncHook([this](uint32_t owner) { return pointer_owner_.contains(owner); },
                    [this](const core::AccessEvent& ev) { return OnPointerWrite(ev); });
  return absl::OkStatus();
}

absl::Status WatchSession::OnPointerWrite(const core::AccessEvent& ev) {
  auto it = pointer_owner_.find(ev.watch_id);
  if (it == pointer_owner_.end()) {
    return absl::OkStatus();
  }
  const auto [written_id, index] = it->second;
  const std::string pointer = followed_.at(written_id).pointers.at(index).display;
  // Every thread is stopped (the trap is handled in Handle): the registers change under a hold,
  // and the threads run on when the trap's handling ends.
  proc_.HoldStopped();
  absl::Cleanup drop = [this] { proc_.DropHold(); };
  alloc_->AdvanceClock(absl::Now());
  for (auto& [id, fw] : followed_) {
    KW_RETURN_IF_ERROR(Refollow(id, ev, pointer));
  }
  return absl::OkStatus();
}

absl::Status WatchSession::Refollow(uint32_t id, const core::AccessEvent& cause,
                                    const std::string& pointer) {
  FollowedWatch& fw = followed_.at(id);
  Watch& w = watches_[id];
  const core::symbols::MemoryReader reader = [this](core::RemoteAddr addr, std::span<uint8_t> out) {
    return proc_.ReadMemory(addr, out);
  };
  FollowResolution now = ResolveFollowed(*symbols_, fw.expr, reader, fw.shape);
  // The pointers: those that stayed where they were keep their registers.
  size_t same = 0;
  while (same < fw.pointers.size() && same < now.pointers.size() &&
         fw.pointers[same].addr == now.pointers[same].addr &&
         fw.pointers[same].size == now.pointers[same].size) {
    fw.pointers[same].value = now.pointers[same].value;
    ++same;
  }
  for (size_t i = fw.requests.size(); i-- > same;) {
    pointer_owner_.erase(fw.owners[i]);
    KW_ASSIGN_OR_RETURN(drmgr::Changes c, alloc_->Release(fw.requests[i]));
    KW_RETURN_IF_ERROR(drmgr::ApplyWithRetry(*alloc_, *hw_, std::move(c)));
  }
  fw.requests.resize(std::min(fw.requests.size(), same));
  fw.owners.resize(fw.requests.size());
  fw.pointers = std::move(now.pointers);
  std::string why = now.why;
  if (absl::Status s = RequestPointers(id, same); !s.ok()) {
    if (!absl::IsResourceExhausted(s)) {
      return s;
    }
    // Not enough registers for the new chain: parked until the pointers change again.
    why = std::string{s.message()};
    now.target.reset();
  }
  // The object.
  const std::optional<core::RemoteAddr> from =
      fw.parked ? std::nullopt : std::optional(w.target.addr);
  std::optional<core::RemoteAddr> to;
  if (now.target.has_value()) {
    to = now.target->addr;
  }
  if (from == to) {
    return absl::OkStatus();  // written, leading to the same object
  }
  if (auto r = request_of_.find(id); r != request_of_.end()) {
    KW_ASSIGN_OR_RETURN(drmgr::Changes c, alloc_->Release(r->second));
    request_of_.erase(r);
    KW_RETURN_IF_ERROR(drmgr::ApplyWithRetry(*alloc_, *hw_, std::move(c)));
  }
  std::erase_if(register_watches_, [id](const Watch& x) { return x.id == id; });
  w.target.addr = to.value_or(core::RemoteAddr{0});
  if (to.has_value()) {
    KW_ASSIGN_OR_RETURN(
        drmgr::Grant g,
        alloc_->Request(client_, session_internal::SlotRequestFor(w, proc_.pid(),
                                                                  drmgr::ShortagePolicy::kFail)));
    hw_->AddOwner(g.id, id);
    request_of_[id] = g.id;
    KW_RETURN_IF_ERROR(drmgr::ApplyWithRetry(*alloc_, *hw_, std::move(g.changes)));
    KW_ASSIGN_OR_RETURN(const drmgr::RequestView v, alloc_->Describe(g.id));
    if (v.state == drmgr::RequestState::kHardware) {
      register_watches_.push_back(w);
    } else {
      why = absl::StrCat("no debug register for its object at 0x", absl::Hex(to->value), ": ",
                         PeopleReason(v.reason));
      KW_ASSIGN_OR_RETURN(drmgr::Changes c, alloc_->Release(g.id));
      request_of_.erase(id);
      KW_RETURN_IF_ERROR(drmgr::ApplyWithRetry(*alloc_, *hw_, std::move(c)));
      to.reset();
      w.target.addr = core::RemoteAddr{0};
    }
  }
  fw.parked = !to.has_value();
  fw.why = fw.parked ? why : "";
  ++fw.moves;
  FollowMove m;
  m.watch_id = id;
  m.time_ns = core::MonotonicNs();
  m.from = from;
  m.to = to;
  m.why = fw.why;
  m.pointer = pointer;
  m.tid = cause.tid;
  m.ip = cause.ip;
  moves_.push_back(std::move(m));
  return absl::OkStatus();
}

}  // namespace kwatch::watch
