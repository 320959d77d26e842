#include "watch/gdb/hw_points.h"

#include <algorithm>
#include <array>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"
#include "core/ptrace/trap_origin.h"

namespace kwatch::watch::gdb {

namespace {

drmgr::DrKind DrKindOf(HwKind kind) {
  switch (kind) {
    case HwKind::kBreak:
      return drmgr::DrKind::kExec;
    case HwKind::kWrite:
      return drmgr::DrKind::kWrite;
    case HwKind::kRead:  // x86 has no read-only breakpoint: gdb tells reads from writes
    case HwKind::kAccess:
      return drmgr::DrKind::kReadWrite;
  }
  return drmgr::DrKind::kReadWrite;
}

}  // namespace

HwPoints::HwPoints(core::ptrace::Process& proc)
    : proc_(proc), client_(alloc_.AddClient(drmgr::ClientKind::kDebugger, "gdb")) {}

HwPoints::~HwPoints() {
  RemoveAll();
}

std::vector<std::pair<uint64_t, uint64_t>> HwPoints::DataRanges() const {
  std::vector<std::pair<uint64_t, uint64_t>> out;
  for (const Point& p : points_) {
    if (p.kind != HwKind::kBreak) {
      out.emplace_back(p.addr.value, p.len);
    }
  }
  if (placing_.has_value() && placing_->kind != HwKind::kBreak) {
    out.emplace_back(placing_->addr.value, placing_->len);
  }
  return out;
}

absl::Status HwPoints::Insert(HwKind kind, core::RemoteAddr addr, uint64_t len) {
  placing_ = Point{kind, addr, len, {}};
  absl::Cleanup placed = [this] { placing_.reset(); };
  absl::Status s = TryInsert(kind, addr, len);
  // Debugger priority: kwatch's own watches give up registers, one at a time, until gdb's
  // point fits or they hold none.
  for (int more = 1; s.code() == absl::StatusCode::kResourceExhausted && lender_ &&
                     registers() + more <= drmgr::kNumDebugRegisters;
       ++more) {
    lent_ = registers() + more;
    KW_RETURN_IF_ERROR(lender_(lent_));
    s = TryInsert(kind, addr, len);
  }
  if (lender_ && lent_ > registers()) {
    absl::Status settled = lender_(lent_ = registers());  // what gdb did not need goes back
    if (s.ok()) {
      s = settled;
    }
  }
  return s;
}

void HwPoints::Settle() {
  if (lender_) {
    lent_ = registers();
    (void)lender_(lent_);  // also publishes what gdb's points hold now
  }
}

absl::Status HwPoints::TryInsert(HwKind kind, core::RemoteAddr addr, uint64_t len) {
  // Registers the kernel refused before (ReportNoSpace) may have been given up since.
  KW_ASSIGN_OR_RETURN(drmgr::Changes reset,
                      alloc_.MarkExternallyHeld(drmgr::Scope::Process(proc_.pid()), 0));
  KW_RETURN_IF_ERROR(Apply(reset));
  drmgr::SlotRequest r;
  r.addr = addr;
  r.len = kind == HwKind::kBreak ? 1 : len;
  r.kind = DrKindOf(kind);
  r.scope = drmgr::Scope::Process(proc_.pid());
  r.priority = drmgr::DefaultPriority(drmgr::ClientKind::kDebugger);
  r.policy = drmgr::ShortagePolicy::kFail;
  static constexpr std::array<absl::string_view, 5> kNames = {"", "gdb hbreak", "gdb watch",
                                                              "gdb rwatch", "gdb awatch"};
  r.label = absl::StrFormat("%s 0x%x", kNames[static_cast<size_t>(kind)], addr.value);
  KW_ASSIGN_OR_RETURN(drmgr::Grant g, alloc_.Request(client_, r));
  if (g.state == drmgr::RequestState::kFailed) {
    (void)alloc_.Release(g.id);
    return absl::ResourceExhaustedError(g.reason);
  }
  if (absl::Status s = drmgr::ApplyWithRetry(alloc_, *this, std::move(g.changes)); !s.ok()) {
    if (absl::StatusOr<drmgr::Changes> back = alloc_.Release(g.id); back.ok()) {
      (void)Apply(*back);
    }
    return s;
  }
  KW_ASSIGN_OR_RETURN(const drmgr::RequestView v, alloc_.Describe(g.id));
  if (!v.armed) {
    if (absl::StatusOr<drmgr::Changes> back = alloc_.Release(g.id); back.ok()) {
      (void)Apply(*back);
    }
    return absl::ResourceExhaustedError(
        absl::StrCat("no debug register free for gdb's hardware point: ", v.reason));
  }
  points_.push_back({kind, addr, len, g.id});
  return absl::OkStatus();
}

absl::Status HwPoints::Remove(HwKind kind, core::RemoteAddr addr, uint64_t len) {
  auto it = std::find_if(points_.begin(), points_.end(), [&](const Point& p) {
    return p.kind == kind && p.addr == addr && (kind == HwKind::kBreak || p.len == len);
  });
  if (it == points_.end()) {
    return absl::NotFoundError("no such hardware point");
  }
  KW_ASSIGN_OR_RETURN(drmgr::Changes c, alloc_.Release(it->id));
  points_.erase(it);
  return drmgr::ApplyWithRetry(alloc_, *this, std::move(c));
}

void HwPoints::RemoveAll() {
  while (!points_.empty()) {
    const Point p = points_.back();
    if (!Remove(p.kind, p.addr, p.len).ok()) {
      std::erase_if(points_, [&](const Point& q) { return q.id == p.id; });
    }
  }
  armed_.clear();
  bps_.DropAll();
  Settle();
}

std::optional<HwPoints::Hit> HwPoints::Fired(pid_t tid, const siginfo_t& si) const {
  if (si.si_signo != SIGTRAP || si.si_code != core::ptrace::kTrapPerf) {
    return std::nullopt;
  }
  const int reg = bps_.Fired(tid, core::ptrace::SiPerfData(si));
  if (reg < 0) {
    return std::nullopt;
  }
  auto a = armed_.find(reg);
  if (a == armed_.end()) {
    return std::nullopt;
  }
  for (const drmgr::RequestId id : a->second.holders) {
    for (const Point& p : points_) {
      if (p.id == id) {
        return Hit{p.kind, p.addr};
      }
    }
  }
  return std::nullopt;
}

absl::Status HwPoints::OnThreadStart(pid_t tid) {
  for (const auto& [reg, a] : armed_) {
    KW_RETURN_IF_ERROR(bps_.Set(tid, reg, a.slot));
  }
  return absl::OkStatus();
}

absl::Status HwPoints::Write(const Layout& cur, const Layout& next) {
  const std::vector<pid_t> threads = proc_.TracedThreads();
  std::vector<pid_t> done;
  auto put = [this](pid_t tid, const Layout& from, const Layout& to) -> absl::Status {
    for (int reg = 0; reg < drmgr::kNumDebugRegisters; ++reg) {
      auto f = from.find(reg);
      auto t = to.find(reg);
      if (t == to.end()) {
        if (f != from.end()) {
          bps_.Clear(tid, reg);
        }
        continue;
      }
      if (f == from.end() || !(f->second.slot == t->second.slot)) {
        KW_RETURN_IF_ERROR(bps_.Set(tid, reg, t->second.slot));
      }
    }
    return absl::OkStatus();
  };
  for (const pid_t tid : threads) {
    absl::Status s = put(tid, cur, next);
    if (s.ok()) {
      done.push_back(tid);
      continue;
    }
    if (s.code() == absl::StatusCode::kNotFound) {
      bps_.Drop(tid);  // the thread exited meanwhile
      continue;
    }
    (void)put(tid, next, cur);
    for (const pid_t d : done) {
      (void)put(d, next, cur);
    }
    return s;
  }
  return absl::OkStatus();
}

absl::Status HwPoints::Apply(const drmgr::Changes& changes) {
  refused_.reset();
  Layout next = armed_;
  for (const drmgr::SlotChange& c : changes.slots) {
    if (c.scope != drmgr::Scope::Process(proc_.pid())) {
      return absl::InvalidArgumentError(
          absl::StrCat("gdb's points: a slot of ", c.scope.ToString()));
    }
    std::vector<drmgr::RequestId> holders;
    for (const drmgr::SlotHolder& h : c.holders) {
      holders.push_back(h.id);
    }
    switch (c.op) {
      case drmgr::SlotChange::Op::kDisarm:
        next.erase(c.slot);
        break;
      case drmgr::SlotChange::Op::kUpdateHolders:
        next[c.slot].holders = std::move(holders);
        break;
      case drmgr::SlotChange::Op::kArm:
        next[c.slot] = Armed{TrapSlot{c.chunk.addr, static_cast<uint32_t>(c.chunk.len), c.kind},
                             std::move(holders)};
        break;
    }
  }
  absl::Status s = Write(armed_, next);
  if (!s.ok()) {
    if (s.code() == absl::StatusCode::kResourceExhausted) {
      refused_ = drmgr::Scope::Process(proc_.pid());
    }
    return s;
  }
  armed_ = std::move(next);
  return absl::OkStatus();
}

}  // namespace kwatch::watch::gdb
