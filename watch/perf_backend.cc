#include "watch/perf_backend.h"

#include <algorithm>
#include <cstring>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "core/x86_access.h"

namespace kwatch::watch {

absl::StatusOr<PerfBackend::Slot> PerfBackend::Open(const drmgr::SlotChange& change) const {
  Slot slot;
  slot.chunk = change.chunk;
  slot.kind = change.kind;
  slot.holders = change.holders;
  std::vector<pid_t> tids;
  if (change.scope.kind == drmgr::Scope::Kind::kThread) {
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
    req.ring_pages = opts_.ring_pages;
    req.wakeup_events = opts_.wakeup_events;
    KW_ASSIGN_OR_RETURN(std::unique_ptr<PerfBreakpoint> bp, PerfBreakpoint::Open(req));
    slot.bps.push_back(std::move(bp));
  }
  return slot;
}

void PerfBackend::Close(Slot& slot) {
  DrainSlot(slot, pending_);
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
  // No thread may be created between listing the threads and opening their events.
  const bool stop = proc_.alive();
  if (stop) {
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

const PerfBackend::Operand& PerfBackend::OperandAt(core::RemoteAddr trap_ip,
                                                   const core::AccessSite& site) {
  auto [it, inserted] = operands_.try_emplace(trap_ip.value);
  if (!inserted || !site.exact || site.ip == trap_ip) {
    return it->second;
  }
  // A breakpoint sample carries no registers, but an operand whose address does not depend
  // on them (RIP-relative: the globals) is known exactly: decode with two different register
  // sets and keep the address only when both agree.
  uint8_t code[15] = {};
  const size_t n = std::min<uint64_t>(sizeof(code), trap_ip.value - site.ip.value);
  if (!proc_.ReadMemory(site.ip, std::span<uint8_t>(code, n)).ok()) {
    return it->second;
  }
  user_regs_struct a{};
  user_regs_struct b{};
  std::memset(&b, 0x5a, sizeof(b));
  a.rip = b.rip = site.ip.value;
  auto da = core::DecodeAccess(std::span<const uint8_t>(code, n), site.ip.value, a);
  auto db = core::DecodeAccess(std::span<const uint8_t>(code, n), site.ip.value, b);
  if (da.ok() && db.ok() && da->memory.size() == 1 && db->memory.size() == 1 &&
      da->memory[0].addr == db->memory[0].addr && da->memory[0].size == db->memory[0].size) {
    it->second.known = true;
    it->second.addr = da->memory[0].addr;
    it->second.size = da->memory[0].size;
  }
  return it->second;
}

void PerfBackend::DrainSlot(Slot& slot, std::vector<core::AccessEvent>& out) {
  for (const auto& bp : slot.bps) {
    PerfRing* ring = bp->ring();
    if (ring == nullptr) {
      continue;
    }
    ring->Drain([&](const PerfSample& s) {
      if (static_cast<pid_t>(s.pid) != proc_.pid()) {
        return;  // an inherited breakpoint in a forked child: forks are not followed
      }
      core::AccessEvent ev;
      ev.time_ns = s.time;
      ev.pid = static_cast<pid_t>(s.pid);
      ev.tid = static_cast<pid_t>(s.tid);
      ev.cpu = s.cpu;
      ev.trap_ip = core::RemoteAddr{s.ip};
      // The bytes the access touched, when the instruction says so regardless of registers;
      // else the whole chunk.
      uint64_t lo = slot.chunk.addr.value;
      uint64_t hi = slot.chunk.end().value;
      bool op_known = false;
      if (slot.kind == drmgr::DrKind::kExec) {
        ev.ip = ev.trap_ip;
        ev.kind = core::AccessKind::kExec;
      } else {
        const core::AccessSite& site = symbolizer_.SiteForTrap(ev.trap_ip);
        ev.ip = site.ip;
        if (slot.kind == drmgr::DrKind::kWrite) {
          ev.kind = core::AccessKind::kWrite;
        } else {
          ev.kind =
              (site.exact && site.writes) ? core::AccessKind::kWrite : core::AccessKind::kRead;
        }
        const Operand& op = OperandAt(ev.trap_ip, site);
        op_known = op.known;
        if (op.known) {
          lo = std::max(lo, op.addr);
          hi = std::min(hi, op.addr + op.size);
        }
      }
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
        if (slot.kind == drmgr::DrKind::kExec) {
          e.addr = w.target.addr;
          e.len = 1;
        } else {
          e.addr = core::RemoteAddr{from};
          e.len = static_cast<uint32_t>(to - from);
          e.access_addr = e.addr;
          e.access_size = op_known ? e.len : 0;
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
