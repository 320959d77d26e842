#pragma once

#include <cstdint>
#include <map>
#include <optional>

#include "absl/status/status.h"
#include "drmgr/allocator_types.h"
#include "drmgr/applier.h"
#include "drmgr/scope.h"
#include "watch/backend.h"

namespace kwatch::watch {

// A backend that makes drmgr's slot decisions real in the debug registers of one process:
// the perf applier (PERF_TYPE_BREAKPOINT events, stream mode) and the stop applier (one perf
// breakpoint with sigtrap per thread and register, stop mode). The session owns the
// drmgr::SlotAllocator, asks it for one request per watch, and hands each change list here
// through drmgr::ApplyWithRetry (drmgr/applier.h holds the Apply contract).
//
// Lifecycle: Arm() prepares (nothing is in the registers yet), then Apply() with the
// allocator's changes, as often as the decision changes (multiplex rotation, preemption);
// Disarm() removes every slot.
class SlotBackend : public WatchBackend, public drmgr::Applier {
 public:
  // `owners`: which watch (Watch::id) each allocator request belongs to. Holders of a slot
  // whose request is not in the map receive nothing.
  explicit SlotBackend(std::map<drmgr::RequestId, uint32_t> owners) : owners_(std::move(owners)) {}

  // drmgr::Applier: Apply (all or nothing; ResourceExhausted on ENOSPC) stays with each
  // backend; the refused scope is the one its last Apply recorded.
  std::optional<drmgr::Scope> refused_scope() const override { return refused_scope_; }

  // Request `id` belongs to watch `watch_id` (before the changes that arm it are applied);
  // for a per-call watch, to its call `call` (AccessEvent::call of its events).
  void AddOwner(drmgr::RequestId id, uint32_t watch_id, uint32_t call = 0) {
    owners_[id] = watch_id;
    if (call != 0) {
      calls_[id] = call;
    }
  }

  // Forgets a released request (its slots were closed: their events are collected already).
  void RemoveOwner(drmgr::RequestId id) {
    owners_.erase(id);
    calls_.erase(id);
  }

  // The call a request belongs to (0: not a per-call watch's).
  uint32_t CallOf(drmgr::RequestId id) const {
    auto it = calls_.find(id);
    return it == calls_.end() ? 0 : it->second;
  }

  // The watch a request belongs to, if any.
  std::optional<uint32_t> OwnerOf(drmgr::RequestId id) const {
    auto it = owners_.find(id);
    if (it == owners_.end()) {
      return std::nullopt;
    }
    return it->second;
  }

 protected:
  std::optional<drmgr::Scope> refused_scope_;

 private:
  std::map<drmgr::RequestId, uint32_t> owners_;
  std::map<drmgr::RequestId, uint32_t> calls_;
};

}  // namespace kwatch::watch
