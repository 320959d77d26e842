#include "watch/session.h"

#include <algorithm>
#include <cstring>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/expr.h"
#include "core/status_macros.h"

namespace kwatch::watch {

WatchSession::WatchSession(core::Process& proc, std::unique_ptr<core::Symbols> symbols,
                           std::vector<Watch> watches, const SessionOptions& opts)
    : proc_(proc),
      symbols_(std::move(symbols)),
      symbolizer_(std::make_unique<core::Symbolizer>(*symbols_)),
      watches_(std::move(watches)),
      opts_(opts) {}

absl::StatusOr<std::unique_ptr<WatchSession>> WatchSession::Create(
    core::Process& proc, std::vector<WatchRequest> requests, const SessionOptions& opts) {
  if (requests.empty()) {
    return absl::InvalidArgumentError("nothing to watch: give at least one expression");
  }
  KW_ASSIGN_OR_RETURN(std::unique_ptr<core::Symbols> symbols,
                      core::Symbols::ForProcess(proc.pid()));
  const core::MemoryReader reader = [&proc](core::RemoteAddr addr, std::span<uint8_t> out) {
    return proc.ReadMemory(addr, out);
  };
  std::vector<Watch> watches;
  for (auto& req : requests) {
    KW_ASSIGN_OR_RETURN(const core::Expr expr, core::ParseExpr(req.expr));
    auto resolved = symbols->Resolve(expr, reader);
    if (!resolved.ok()) {
      return absl::Status(resolved.status().code(),
                          absl::StrCat("'", req.expr, "': ", resolved.status().message()));
    }
    if (req.length.has_value()) {
      resolved->length = *req.length;
    }
    const absl::Status fits =
        drmgr::CheckHardwareRange(resolved->addr, resolved->length, req.kind);
    if (!fits.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "'", resolved->display, "' (", resolved->type_name.empty() ? "" : resolved->type_name,
          resolved->type_name.empty() ? "" : ", ", resolved->length, " bytes at ",
          absl::StrFormat("0x%x", resolved->addr.value), "): ", fits.message(),
          ". Watching ranges that need several debug registers comes with the drmgr "
          "allocator; for now watch one field, or use --len with an aligned 1/2/4/8"));
    }
    Watch w;
    w.id = static_cast<uint32_t>(watches.size());
    w.request = std::move(req);
    w.target = *std::move(resolved);
    watches.push_back(std::move(w));
  }
  return std::unique_ptr<WatchSession>(
      new WatchSession(proc, std::move(symbols), std::move(watches), opts));
}

absl::Status WatchSession::Arm() {
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

void WatchSession::Disarm() {
  for (auto& e : events_) {
    if (PerfRing* ring = e.bp->ring()) {
      lost_closed_ += ring->lost();
    }
  }
  events_.clear();
}

std::vector<int> WatchSession::Fds() const {
  std::vector<int> fds;
  fds.reserve(events_.size());
  for (const auto& e : events_) {
    for (int fd : e.bp->fds()) {
      fds.push_back(fd);
    }
  }
  return fds;
}

uint64_t WatchSession::lost() const {
  uint64_t total = lost_closed_;
  for (const auto& e : events_) {
    if (const PerfRing* ring = e.bp->ring()) {
      total += ring->lost();
    }
  }
  return total;
}

size_t WatchSession::Drain(absl::FunctionRef<void(const core::AccessEvent&)> sink) {
  batch_.clear();
  for (auto& e : events_) {
    PerfRing* ring = e.bp->ring();
    if (ring == nullptr) {
      continue;
    }
    const Watch& w = watches_[e.watch_id];
    ring->Drain([&](const PerfSample& s) {
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
        const core::AccessSite& site = symbolizer_->SiteForTrap(ev.trap_ip);
        ev.ip = site.ip;
        if (w.request.kind == drmgr::DrKind::kWrite) {
          ev.kind = core::AccessKind::kWrite;
        } else {
          ev.kind = (site.exact && site.writes) ? core::AccessKind::kWrite : core::AccessKind::kRead;
        }
      }
      if (w.request.reads_only && ev.kind == core::AccessKind::kWrite) {
        ++filtered_;
        return;
      }
      batch_.push_back(ev);
    });
  }
  if (batch_.empty()) {
    return 0;
  }
  std::stable_sort(batch_.begin(), batch_.end(),
                   [](const core::AccessEvent& a, const core::AccessEvent& b) {
                     return a.time_ns < b.time_ns;
                   });
  // One read per watch per batch: the value at drain time.
  std::vector<std::optional<uint64_t>> values(watches_.size());
  if (proc_.alive()) {
    for (const Watch& w : watches_) {
      if (w.request.kind == drmgr::DrKind::kExec || w.target.length > 8) {
        continue;
      }
      uint8_t buf[8] = {};
      if (proc_.ReadMemory(w.target.addr, std::span<uint8_t>(buf, w.target.length)).ok()) {
        uint64_t v = 0;
        std::memcpy(&v, buf, 8);
        values[w.id] = v;
      }
    }
  }
  for (auto& ev : batch_) {
    ev.value = values[ev.watch_id];
    sink(ev);
  }
  return batch_.size();
}

}  // namespace kwatch::watch
