#include "watch/perf_backend.h"

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace kwatch::watch {

absl::Status PerfBackend::Arm() {
  KW_RETURN_IF_ERROR(proc_.StopAll());
  absl::Cleanup resume = [this] { (void)proc_.ResumeAll(); };
  std::vector<Event> opened;
  for (const Watch& w : watches_) {
    for (pid_t tid : proc_.TracedThreads()) {
      BreakpointRequest req;
      req.addr = w.target.addr;
      req.len = static_cast<uint32_t>(w.target.length);
      req.kind = w.request.kind;
      req.tid = tid;
      req.inherit = true;
      req.ring_pages = opts_.ring_pages;
      req.wakeup_events = opts_.wakeup_events;
      auto bp = PerfBreakpoint::Open(req);
      if (!bp.ok()) {
        // `opened` closes on return: no event stays.
        return absl::Status(bp.status().code(), absl::StrCat("arming '", w.target.display,
                                                             "': ", bp.status().message()));
      }
      opened.push_back(Event{w.id, *std::move(bp)});
    }
  }
  events_ = std::move(opened);
  return absl::OkStatus();
}

void PerfBackend::Disarm() {
  for (auto& e : events_) {
    if (PerfRing* ring = e.bp->ring()) {
      lost_closed_ += ring->lost();
    }
  }
  events_.clear();
}

std::vector<int> PerfBackend::Fds() const {
  std::vector<int> fds;
  for (const auto& e : events_) {
    for (int fd : e.bp->fds()) {
      fds.push_back(fd);
    }
  }
  return fds;
}

uint64_t PerfBackend::lost() const {
  uint64_t total = lost_closed_;
  for (const auto& e : events_) {
    if (const PerfRing* ring = e.bp->ring()) {
      total += ring->lost();
    }
  }
  return total;
}

void PerfBackend::Collect(std::vector<core::AccessEvent>& out) {
  for (auto& e : events_) {
    PerfRing* ring = e.bp->ring();
    if (ring == nullptr) {
      continue;
    }
    const Watch& w = watches_[e.watch_id];
    ring->Drain([&](const PerfSample& s) {
      if (static_cast<pid_t>(s.pid) != proc_.pid()) {
        return;  // an inherited breakpoint in a forked child: forks are not followed
      }
      core::AccessEvent ev;
      ev.time_ns = s.time;
      ev.pid = static_cast<pid_t>(s.pid);
      ev.tid = static_cast<pid_t>(s.tid);
      ev.cpu = s.cpu;
      ev.watch_id = w.id;
      ev.trap_ip = core::RemoteAddr{s.ip};
      ev.addr = w.target.addr;
      ev.len = static_cast<uint32_t>(w.target.length);
      if (w.request.kind == drmgr::DrKind::kExec) {
        ev.ip = ev.trap_ip;
        ev.kind = core::AccessKind::kExec;
      } else {
        const core::AccessSite& site = symbolizer_.SiteForTrap(ev.trap_ip);
        ev.ip = site.ip;
        if (w.request.kind == drmgr::DrKind::kWrite) {
          ev.kind = core::AccessKind::kWrite;
        } else {
          ev.kind =
              (site.exact && site.writes) ? core::AccessKind::kWrite : core::AccessKind::kRead;
        }
      }
      out.push_back(ev);
    });
  }
}

}  // namespace kwatch::watch
