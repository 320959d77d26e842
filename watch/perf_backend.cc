#include "watch/perf_backend.h"

#include <algorithm>
#include <optional>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"

namespace kwatch::watch {

namespace {

constexpr size_t kThreadScopeRingPages = 64;

}  // namespace

absl::StatusOr<PerfBackend::Slot> PerfBackend::Open(const drmgr::SlotChange& change) {
  Slot slot;
  slot.chunk = change.chunk;
  slot.kind = change.kind;
  slot.holders = change.holders;
  std::vector<pid_t> tids;
  if (change.scope.kind == drmgr::Scope::Kind::kThread) {
    slot.thread = change.scope.tid;
    if (auto pool = parked_.find(slot.thread); pool != parked_.end() && !pool->second.empty()) {
      std::unique_ptr<PerfBreakpoint> bp = std::move(pool->second.back());
      pool->second.pop_back();
      if (bp->Retarget(change.chunk.addr, static_cast<uint32_t>(change.chunk.len), change.kind)
              .ok() &&
          bp->Enable().ok()) {
        slot.bps.push_back(std::move(bp));
        return slot;
      }
      // Else (the thread is gone, a kernel without MODIFY_ATTRIBUTES): a new event.
    }
    tids.push_back(change.scope.tid);
  } else {
    tids = proc_.TracedThreads();
  }
  for (const pid_t tid : tids) {
    BreakpointRequest req;
    req.addr = change.chunk.addr;
    req.len = static_cast<uint32_t>(change.chunk.len);
    req.kind = change.kind;
    req.tid = tid;
    req.inherit = change.scope.kind == drmgr::Scope::Kind::kProcess;
    // New threads inherit the breakpoint, a forked child never does: it is not watched, or
    // (-f) watched by a session of its own, armed before it runs.
    req.inherit_thread = true;
    // A thread scope's slot lives for one call of a per-call watch: a ring of its own sized
    // for a call's accesses between two drains (~1300 samples) costs a quarter of the time to
    // open and close that the session's rings do.
    req.ring_pages = change.scope.kind == drmgr::Scope::Kind::kThread
                         ? std::min<size_t>(opts_.ring_pages, kThreadScopeRingPages)
                         : opts_.ring_pages;
    req.wakeup_events = opts_.wakeup_events;
    // Data accesses: the registers after the access give its exact bytes and value. A sample
    // grows from 48 to 192 bytes: a 256-page ring still holds about 5400 of them.
    if (change.kind != drmgr::DrKind::kExec) {
      req.sample_regs_user = PerfUserRegsMaskGeneral();
    }
    KW_ASSIGN_OR_RETURN(std::unique_ptr<PerfBreakpoint> bp, PerfBreakpoint::Open(req));
    slot.bps.push_back(std::move(bp));
  }
  return slot;
}

void PerfBackend::Close(Slot& slot) {
  DrainSlot(slot, pending_);
  if (slot.thread != 0 && slot.bps.size() == 1 && slot.bps.front()->ring() != nullptr &&
      slot.bps.front()->ring()->lost() == 0) {
    std::vector<std::unique_ptr<PerfBreakpoint>>& pool = parked_[slot.thread];
    if (pool.size() < drmgr::kNumDebugRegisters && slot.bps.front()->Disable().ok()) {
      pool.push_back(std::move(slot.bps.front()));
      slot.bps.clear();
      // Threads that ended since keep nothing parked (each event holds its ring).
      if (const std::vector<pid_t> traced = proc_.TracedThreads(); parked_.size() > traced.size()) {
        std::erase_if(parked_, [&](const auto& e) {
          return std::find(traced.begin(), traced.end(), e.first) == traced.end();
        });
      }
      return;
    }
  }
  for (const auto& bp : slot.bps) {
    if (const PerfRing* ring = bp->ring()) {
      lost_closed_ += ring->lost();
    }
  }
  slot.bps.clear();
}

absl::Status PerfBackend::Apply(const drmgr::Changes& changes) {
  refused_scope_.reset();
  if (changes.slots.empty()) {
    return absl::OkStatus();
  }
  // No thread may be created between listing the threads and opening their events. Changes
  // of thread scopes alone (a per-call watch's) list no thread: nothing stops.
  const bool stop =
      proc_.alive() &&
      std::any_of(changes.slots.begin(), changes.slots.end(), [](const drmgr::SlotChange& c) {
        return c.scope.kind != drmgr::Scope::Kind::kThread;
      });
  if (stop) {
    CloseParked();  // their registers go back before another scope counts on them
    KW_RETURN_IF_ERROR(proc_.StopAll());
  }
  absl::Cleanup resume = [this, stop] {
    if (stop) {
      (void)proc_.ResumeAll();
    }
  };
  // What this list did, to undo it on failure.
  std::vector<drmgr::SlotChange> closed;
  std::vector<std::pair<SlotKey, std::vector<drmgr::SlotHolder>>> relabelled;
  std::vector<SlotKey> opened;
  auto undo = [&] {
    for (const SlotKey& key : opened) {
      Close(slots_[key]);
      slots_.erase(key);
    }
    for (auto& [key, holders] : relabelled) {
      slots_[key].holders = std::move(holders);
    }
    for (const drmgr::SlotChange& c : closed) {
      // The slot was ours a moment ago: it is free again.
      if (auto s = Open(c); s.ok()) {
        slots_[{c.scope, c.slot}] = *std::move(s);
      }
    }
  };
  for (const drmgr::SlotChange& c : changes.slots) {
    const SlotKey key{c.scope, c.slot};
    switch (c.op) {
      case drmgr::SlotChange::Op::kDisarm: {
        auto it = slots_.find(key);
        if (it == slots_.end()) {
          break;
        }
        drmgr::SlotChange was = c;
        was.op = drmgr::SlotChange::Op::kArm;
        was.chunk = it->second.chunk;
        was.kind = it->second.kind;
        was.holders = it->second.holders;
        closed.push_back(std::move(was));
        Close(it->second);
        slots_.erase(it);
        break;
      }
      case drmgr::SlotChange::Op::kUpdateHolders: {
        auto it = slots_.find(key);
        if (it == slots_.end()) {
          undo();
          return absl::InternalError(absl::StrCat("drmgr: ", c.ToString(), ": no such slot"));
        }
        relabelled.emplace_back(key, it->second.holders);
        it->second.holders = c.holders;
        break;
      }
      case drmgr::SlotChange::Op::kArm: {
        absl::StatusOr<Slot> s = Open(c);
        if (!s.ok()) {
          undo();
          if (absl::IsResourceExhausted(s.status())) {
            refused_scope_ = c.scope;
          }
          return s.status();
        }
        slots_[key] = *std::move(s);
        opened.push_back(key);
        break;
      }
    }
  }
  return absl::OkStatus();
}

void PerfBackend::Disarm() {
  for (auto& [key, slot] : slots_) {
    for (const auto& bp : slot.bps) {
      if (const PerfRing* ring = bp->ring()) {
        lost_closed_ += ring->lost();
      }
    }
  }
  slots_.clear();
  pending_.clear();
  CloseParked();
}

std::vector<int> PerfBackend::Fds() const {
  std::vector<int> fds;
  for (const auto& [key, slot] : slots_) {
    for (const auto& bp : slot.bps) {
      for (int fd : bp->fds()) {
        fds.push_back(fd);
      }
    }
  }
  return fds;
}

uint64_t PerfBackend::lost() const {
  uint64_t total = lost_closed_;
  for (const auto& [key, slot] : slots_) {
    for (const auto& bp : slot.bps) {
      if (const PerfRing* ring = bp->ring()) {
        total += ring->lost();
      }
    }
  }
  return total;
}

void PerfBackend::DrainSlot(Slot& slot, std::vector<core::AccessEvent>& out) {
  for (const auto& bp : slot.bps) {
    PerfRing* ring = bp->ring();
    if (ring == nullptr) {
      continue;
    }
    ring->Drain([&](const PerfSample& s) {
      if (static_cast<pid_t>(s.pid) != proc_.pid()) {
        return;  // not this process's (inherit_thread: a forked child never inherits these)
      }
      core::AccessEvent ev = SampleEvent(s);
      // The bytes the access touched, when the instruction and the registers after it say
      // so; else the whole chunk.
      TouchedBytes touched;
      touched.lo = slot.chunk.addr.value;
      touched.hi = slot.chunk.end().value;
      if (slot.kind == drmgr::DrKind::kExec) {
        ev.ip = ev.trap_ip;
        ev.kind = core::AccessKind::kExec;
      } else {
        const SampledAccess a = decoder_.Resolve(s);
        ev.ip = a.ip;
        if (slot.kind == drmgr::DrKind::kWrite) {
          ev.kind = core::AccessKind::kWrite;
        } else {
          ev.kind = a.writes ? core::AccessKind::kWrite : core::AccessKind::kRead;
        }
        touched = Touched(a, touched.lo, touched.hi);
      }
      const uint64_t lo = touched.lo;
      const uint64_t hi = touched.hi;
      bool seen = false;
      for (const drmgr::SlotHolder& h : slot.holders) {
        const std::optional<uint32_t> owner = OwnerOf(h.id);
        if (!owner.has_value()) {
          continue;
        }
        if (h.kind == drmgr::DrKind::kWrite && ev.kind == core::AccessKind::kRead) {
          continue;  // a write watch sharing a read-write slot
        }
        const uint64_t from = std::max(lo, h.addr.value);
        const uint64_t to = std::min(hi, h.addr.value + h.len);
        if (from >= to && slot.kind != drmgr::DrKind::kExec) {
          continue;  // the access touched bytes of a wide cover outside this watch
        }
        const Watch& w = watches_[*owner];
        core::AccessEvent e = ev;
        e.watch_id = w.id;
        e.call = CallOf(h.id);
        if (slot.kind == drmgr::DrKind::kExec) {
          e.addr = w.target.addr;
          e.len = 1;
        } else {
          SetWatchedPart(e, touched, from, to);
        }
        out.push_back(e);
        seen = true;
      }
      if (!seen) {
        ++unrelated_;
      }
    });
  }
}

void PerfBackend::Collect(std::vector<core::AccessEvent>& out) {
  if (!pending_.empty()) {
    out.insert(out.end(), pending_.begin(), pending_.end());
    pending_.clear();
  }
  for (auto& [key, slot] : slots_) {
    DrainSlot(slot, out);
  }
}

}  // namespace kwatch::watch
