// WatchSession and a debugger that shares its debug registers (`kwatch gdbserver`): registers
// lent, displaced watches moved to page protection or multiplexed, and given back.
#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"
#include "drmgr/applier.h"
#include "watch/page_backend.h"
#include "watch/session.h"
#include "watch/session_policy.h"

namespace kwatch::watch {

namespace {

constexpr uint64_t kPage = 4096;

bool SharesAPage(const Watch& w, const std::vector<std::pair<uint64_t, uint64_t>>& ranges) {
  const uint64_t first = w.target.addr.value / kPage;
  const uint64_t last = (w.target.addr.value + w.target.length - 1) / kPage;
  return std::any_of(ranges.begin(), ranges.end(), [&](const std::pair<uint64_t, uint64_t>& r) {
    const uint64_t rf = r.first / kPage;
    const uint64_t rl = (r.first + std::max<uint64_t>(r.second, 1) - 1) / kPage;
    return rf <= last && first <= rl;
  });
}

}  // namespace

absl::StatusOr<std::vector<std::string>> WatchSession::LendSlots(
    int n, const std::vector<std::pair<uint64_t, uint64_t>>& debugger_data) {
  if (alloc_ == nullptr || hw_ == nullptr || !armed_) {
    return absl::FailedPreconditionError("kwatch's watches hold no debug register to lend");
  }
  alloc_->AdvanceClock(absl::Now());
  std::vector<drmgr::RequestChange> moved;
  // A watch whose pages hold a range the debugger watches cannot go to pages: page protection
  // would run those accesses where the debugger's registers do not see them. Its request is
  // made again with the policy that fits now (which puts it last among equals).
  for (auto& [watch_id, policy] : policy_of_) {
    const Watch& w = watches_[watch_id];
    drmgr::ShortagePolicy want =
        session_internal::PolicyFor(w.request, opts_.overcommit, opts_.debugger_shares);
    if (want == drmgr::ShortagePolicy::kFallbackPages && SharesAPage(w, debugger_data)) {
      want = drmgr::ShortagePolicy::kMultiplex;
    }
    auto it = request_of_.find(watch_id);
    if (want == policy || it == request_of_.end()) {
      continue;
    }
    KW_ASSIGN_OR_RETURN(drmgr::Changes released, alloc_->Release(it->second));
    KW_RETURN_IF_ERROR(drmgr::ApplyWithRetry(*alloc_, *hw_, std::move(released)));
    KW_ASSIGN_OR_RETURN(drmgr::Grant g, alloc_->Request(client_, session_internal::SlotRequestFor(
                                                                     w, proc_.pid(), want)));
    hw_->AddOwner(g.id, watch_id);
    it->second = g.id;
    policy = want;
    KW_RETURN_IF_ERROR(drmgr::ApplyWithRetry(*alloc_, *hw_, std::move(g.changes)));
  }
  KW_ASSIGN_OR_RETURN(drmgr::Changes changes,
                      alloc_->MarkExternallyHeld(drmgr::Scope::Process(proc_.pid()), n));
  moved.insert(moved.end(), changes.requests.begin(), changes.requests.end());
  KW_RETURN_IF_ERROR(drmgr::ApplyWithRetry(*alloc_, *hw_, std::move(changes)));
  KW_RETURN_IF_ERROR(SyncPages());
  std::vector<std::string> lines;
  multiplexing_ = false;
  std::set<uint32_t> said;
  for (const auto& [watch_id, request] : request_of_) {
    absl::StatusOr<drmgr::RequestView> v = alloc_->Describe(request);
    if (!v.ok()) {
      continue;
    }
    multiplexing_ |= v->state == drmgr::RequestState::kMultiplexed;
    for (const drmgr::RequestChange& c : moved) {
      if (c.id != request || (c.from == c.to && c.was_armed == c.armed) ||
          !said.insert(watch_id).second) {
        continue;
      }
      const Watch& w = watches_[watch_id];
      std::string now;
      switch (v->state) {
        case drmgr::RequestState::kHardware:
          now = "back in a debug register";
          break;
        case drmgr::RequestState::kMultiplexed:
          now = "taking turns for the debug registers left (multiplexed)";
          if (SharesAPage(w, debugger_data)) {
            absl::StrAppend(&now,
                            "; not page protection, which would hide the accesses the "
                            "debugger watches on its page");
          }
          break;
        case drmgr::RequestState::kFallbackPages:
          now = "moved to page protection (exact counts go on, at a fault per access to its page)";
          break;
        case drmgr::RequestState::kPreempted:
        case drmgr::RequestState::kFailed:
          now = "waiting for a debug register, counting nothing meanwhile";
          break;
      }
      lines.push_back(absl::StrCat("watch #", w.id + 1, " ", w.target.display, ": ", now,
                                   " (the debugger holds ", n, " debug register", n == 1 ? "" : "s",
                                   ")"));
    }
  }
  return lines;
}

absl::Status WatchSession::SyncPages() {
  std::vector<Watch> paged;
  std::vector<Watch> in_registers;
  for (const Watch& w : watches_) {
    if (w.id < removed_.size() && removed_[w.id]) {
      continue;
    }
    auto it = request_of_.find(w.id);
    if (it == request_of_.end()) {
      if (w.target.length > drmgr::kMaxRequestLen) {
        paged.push_back(w);  // too long for registers: pages from the start
      }
      continue;
    }
    KW_ASSIGN_OR_RETURN(const drmgr::RequestView v, alloc_->Describe(it->second));
    if (v.state == drmgr::RequestState::kFallbackPages) {
      paged.push_back(w);
    } else if (v.state == drmgr::RequestState::kHardware) {
      in_registers.push_back(w);
    }
  }
  auto ids = [](const std::vector<Watch>& ws) {
    std::vector<uint32_t> out;
    out.reserve(ws.size());
    for (const Watch& w : ws) {
      out.push_back(w.id);
    }
    return out;
  };
  register_watches_ = std::move(in_registers);
  if (ids(paged) == ids(page_watches_) && (page_ != nullptr) == !paged.empty()) {
    return absl::OkStatus();
  }
  // The target is stopped: nothing runs between the old pages and the new ones.
  if (page_ != nullptr) {
    page_->Collect(carried_);
    handler_restores_carried_ += page_backend_->handler_restores();
    handler_resets_kept_carried_ += page_backend_->handler_resets_kept();
    page_->Disarm();
    page_.reset();
    page_backend_ = nullptr;
  }
  page_watches_ = std::move(paged);
  if (page_watches_.empty()) {
    return absl::OkStatus();
  }
  return ArmPages(&register_watches_);
}

}  // namespace kwatch::watch
