// WatchSession and its per-call watches (watch/call_watches.h): declared with the session,
// armed in one thread's debug registers for one call, and ended at its return.
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"
#include "drmgr/applier.h"
#include "watch/call_watches.h"
#include "watch/session.h"
#include "watch/session_policy.h"

namespace kwatch::watch {

absl::StatusOr<uint32_t> WatchSession::DeclareCallWatch(WatchRequest request,
                                                        core::symbols::ResolvedExpr shape) {
  if (kind_ == BackendKind::kPage || kind_ == BackendKind::kAuto) {
    return absl::FailedPreconditionError(absl::StrCat(
        "'", request.expr,
        "': a watch per call needs the debug registers of the calling thread, and this session "
        "watches with page protection",
        backend_note_.empty() ? "" : absl::StrCat(" (", backend_note_, ")"),
        "; use --backend perf or --stop"));
  }
  if (request.kind == drmgr::DrKind::kExec) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", request.expr, "': --in watches data (--write, --rw, --read), not execution"));
  }
  if (armed_) {
    return absl::FailedPreconditionError("per-call watches are declared before the session arms");
  }
  if (request.length.has_value()) {
    shape.length = *request.length;
  }
  if (shape.length == 0 || shape.length > drmgr::kMaxRequestLen) {
    return absl::InvalidArgumentError(
        absl::StrFormat("'%s': %d bytes; a watch per call takes debug registers only (at most "
                        "%d bytes, 32 in one thread's four registers): watch a field of it",
                        shape.display, shape.length, drmgr::kMaxRequestLen));
  }
  Watch w;
  w.id = static_cast<uint32_t>(watches_.size());
  w.request = std::move(request);
  w.target = std::move(shape);
  w.target.addr = core::RemoteAddr{0};
  watches_.push_back(std::move(w));
  per_call_.resize(watches_.size(), false);
  per_call_.back() = true;
  removed_.resize(watches_.size(), false);
  return watches_.back().id;
}

absl::StatusOr<std::string> WatchSession::ArmCall(uint32_t id, uint32_t call, pid_t tid,
                                                  core::RemoteAddr addr) {
  if (!per_call(id) || alloc_ == nullptr || hw_ == nullptr || !armed_) {
    return absl::FailedPreconditionError(
        absl::StrCat("watch #", id + 1, " is not a per-call watch of an armed hardware session"));
  }
  const Watch& w = watches_[id];
  drmgr::SlotRequest r =
      session_internal::SlotRequestFor(w, proc_.pid(), drmgr::ShortagePolicy::kFail);
  r.addr = addr;
  r.scope = drmgr::Scope::Thread(proc_.pid(), tid);
  r.priority = kCallWatchPriority;
  r.label = absl::StrCat(w.target.display, " (call ", call, ")");
  absl::StatusOr<drmgr::Grant> g = alloc_->Request(client_, std::move(r));
  if (!g.ok()) {
    return std::string{g.status().message()};
  }
  const auto give_back = [this](drmgr::RequestId rid) {
    if (absl::StatusOr<drmgr::Changes> c = alloc_->Release(rid); c.ok()) {
      (void)drmgr::ApplyWithRetry(*alloc_, *hw_, *std::move(c));
    }
    hw_->RemoveOwner(rid);
  };
  if (g->state != drmgr::RequestState::kHardware) {
    give_back(g->id);
    return PeopleReason(g->reason);
  }
  hw_->AddOwner(g->id, id, call);
  if (absl::Status s = drmgr::ApplyWithRetry(*alloc_, *hw_, std::move(g->changes)); !s.ok()) {
    give_back(g->id);
    return std::string{s.message()};
  }
  // The kernel may have said that a register of this thread is taken (ENOSPC): drmgr then
  // re-decided, and the request may have lost its place.
  KW_ASSIGN_OR_RETURN(const drmgr::RequestView v, alloc_->Describe(g->id));
  if (v.state != drmgr::RequestState::kHardware) {
    give_back(g->id);
    return PeopleReason(v.reason);
  }
  call_request_[{id, call}] = g->id;
  return std::string();
}

absl::Status WatchSession::EndCall(uint32_t id, uint32_t call) {
  auto it = call_request_.find({id, call});
  if (it == call_request_.end()) {
    return absl::OkStatus();
  }
  const drmgr::RequestId rid = it->second;
  call_request_.erase(it);
  // Closing the call's slots drains their rings first (the backends keep those events).
  absl::Status s;
  absl::StatusOr<drmgr::Changes> c = alloc_->Release(rid);
  if (c.ok()) {
    s = drmgr::ApplyWithRetry(*alloc_, *hw_, *std::move(c));
  } else {
    s = c.status();
  }
  hw_->RemoveOwner(rid);
  return s;
}

void WatchSession::SetCalls(std::unique_ptr<CallWatches> calls) {
  calls_ = std::move(calls);
}

}  // namespace kwatch::watch
