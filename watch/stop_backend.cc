#include "watch/stop_backend.h"

#include <sys/resource.h>

#include <algorithm>
#include <csignal>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <iterator>
#include <set>
#include <span>
#include <string>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/clock.h"
#include "core/base/status_macros.h"
#include "core/ptrace/trap_origin.h"
#include "core/x86/access_regs.h"
#include "core/x86/x86_access.h"
#include "drmgr/dr7.h"

namespace kwatch::watch {

namespace {

// The largest holder range kept in a shadow copy (hardware covers at most 32 bytes a scope).
constexpr uint64_t kMaxShadow = 4096;
constexpr uint64_t kEflagsRf = uint64_t{1} << 16;

// DR7 bits of physical slot `p`: its enables and its R/W and LEN fields.
uint64_t SlotBits(int p) {
  return (uint64_t{3} << (2 * p)) | (uint64_t{0xF} << (16 + 4 * p));
}

bool Enabled(uint64_t dr7, int p) {
  return (dr7 & (uint64_t{3} << (2 * p))) != 0;
}

uint64_t LittleEndian(std::span<const uint8_t> bytes) {
  uint64_t v = 0;
  std::memcpy(&v, bytes.data(), std::min<size_t>(bytes.size(), 8));
  return v;
}

}  // namespace

StopBackend::StopBackend(core::ptrace::Process& proc, const std::vector<Watch>& watches,
                         core::symbols::Symbolizer& symbolizer,
                         std::map<drmgr::RequestId, uint32_t> owners)
    : SlotBackend(std::move(owners)), proc_(proc), watches_(watches), symbolizer_(symbolizer) {}

StopBackend::~StopBackend() {
  Disarm();
  proc_.RemoveInterceptor(this);
}

absl::Status StopBackend::Arm() {
  armed_ = true;
  draining_ = false;
  proc_.AddInterceptor(this);
  return absl::OkStatus();
}

ThreadDebugRegs StopBackend::RegistersOf(pid_t tid) const {
  auto it = threads_.find(tid);
  return it == threads_.end() ? ThreadDebugRegs{} : it->second.regs;
}

absl::StatusOr<StopBackend::ThreadState> StopBackend::Layout(pid_t tid,
                                                             const std::map<SlotKey, Armed>& slots,
                                                             const ThreadState& cur) {
  std::vector<SlotKey> wanted;
  for (const auto& [key, armed] : slots) {
    const drmgr::Scope& s = key.first;
    if (s.kind == drmgr::Scope::Kind::kProcess ||
        (s.kind == drmgr::Scope::Kind::kThread && s.tid == tid)) {
      wanted.push_back(key);
    }
  }
  ThreadState next;
  std::vector<SlotKey> unplaced;
  for (const SlotKey& key : wanted) {  // stay where they are
    bool kept = false;
    for (int p = 0; p < drmgr::kNumDebugRegisters && !kept; ++p) {
      if (cur.phys[p] == key && !next.phys[p].has_value()) {
        next.phys[p] = key;
        kept = true;
      }
    }
    if (!kept) {
      unplaced.push_back(key);
    }
  }
  // Process slots prefer their own index, then everyone takes the lowest free register.
  std::stable_partition(unplaced.begin(), unplaced.end(), [](const SlotKey& key) {
    return key.first.kind == drmgr::Scope::Kind::kProcess;
  });
  for (const SlotKey& key : unplaced) {
    int p = -1;
    if (key.first.kind == drmgr::Scope::Kind::kProcess && !next.phys[key.second].has_value()) {
      p = key.second;
    }
    for (int i = 0; p < 0 && i < drmgr::kNumDebugRegisters; ++i) {
      if (!next.phys[i].has_value()) {
        p = i;
      }
    }
    if (p < 0) {
      return absl::ResourceExhaustedError(
          absl::StrFormat("thread %d would carry more than 4 debug-register slots", tid));
    }
    next.phys[p] = key;
  }
  drmgr::Dr7 dr7;
  bool any = false;
  for (int p = 0; p < drmgr::kNumDebugRegisters; ++p) {
    next.regs.addr[p] = cur.regs.addr[p];  // a free register keeps its old address
    if (!next.phys[p].has_value()) {
      continue;
    }
    const Armed& a = slots.at(*next.phys[p]);
    next.regs.addr[p] = a.chunk.addr.value;
    dr7.slots[p] = drmgr::LocalSlot(a.kind, a.chunk.len);
    any = true;
  }
  if (any) {
    KW_ASSIGN_OR_RETURN(next.regs.dr7, drmgr::EncodeDr7(dr7));
  }
  return next;
}

absl::Status StopBackend::WriteRegs(pid_t tid, const ThreadState& cur, const ThreadState& want,
                                    int* refused) {
  // The registers whose breakpoint changes are closed first, so that the thread never counts
  // more of its four registers than `want` uses; then the new ones are opened.
  std::array<bool, drmgr::kNumDebugRegisters> changed{};
  bool any = false;
  for (int p = 0; p < drmgr::kNumDebugRegisters; ++p) {
    const bool on = Enabled(want.regs.dr7, p);
    changed[p] = (cur.regs.dr7 & SlotBits(p)) != (want.regs.dr7 & SlotBits(p)) ||
                 (on && cur.regs.addr[p] != want.regs.addr[p]);
    any = any || changed[p];
  }
  if (!any) {
    return absl::OkStatus();
  }
  KW_ASSIGN_OR_RETURN(const drmgr::Dr7 dr7, drmgr::DecodeDr7(want.regs.dr7));
  for (int p = 0; p < drmgr::kNumDebugRegisters; ++p) {
    if (changed[p]) {
      bps_.Clear(tid, p);
    }
  }
  for (int p = 0; p < drmgr::kNumDebugRegisters; ++p) {
    if (!changed[p] || !Enabled(want.regs.dr7, p)) {
      continue;
    }
    const TrapSlot slot{core::RemoteAddr{want.regs.addr[p]},
                        static_cast<uint32_t>(drmgr::DrLenBytes(dr7.slots[p].len)),
                        dr7.slots[p].kind};
    if (absl::Status s = bps_.Set(tid, p, slot); !s.ok()) {
      *refused = p;
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status StopBackend::Apply(const drmgr::Changes& changes) {
  refused_scope_.reset();
  std::map<SlotKey, Armed> next = slots_;
  bool registers_change = false;
  for (const drmgr::SlotChange& c : changes.slots) {
    if (!c.scope.is_task() || c.scope.pid != proc_.pid()) {
      return absl::InvalidArgumentError(absl::StrCat("stop mode writes debug registers of process ",
                                                     proc_.pid(), " only, not of ",
                                                     c.scope.ToString()));
    }
    if (c.slot < 0 || c.slot >= drmgr::kNumDebugRegisters) {
      return absl::InvalidArgumentError(absl::StrCat("no debug-register slot ", c.slot));
    }
    const SlotKey key{c.scope, c.slot};
    switch (c.op) {
      case drmgr::SlotChange::Op::kDisarm:
        if (next.erase(key) == 0) {
          return absl::FailedPreconditionError(absl::StrCat("not armed: ", c.ToString()));
        }
        registers_change = true;
        break;
      case drmgr::SlotChange::Op::kUpdateHolders: {
        auto it = next.find(key);
        if (it == next.end()) {
          return absl::FailedPreconditionError(absl::StrCat("not armed: ", c.ToString()));
        }
        it->second.holders = c.holders;
        break;
      }
      case drmgr::SlotChange::Op::kArm:
        if (next.contains(key)) {
          return absl::FailedPreconditionError(absl::StrCat("slot busy: ", c.ToString()));
        }
        KW_RETURN_IF_ERROR(drmgr::CheckHardwareRange(c.chunk.addr, c.chunk.len, c.kind));
        next[key] = Armed{c.chunk, c.kind, c.holders};
        registers_change = true;
        break;
    }
  }
  if (!armed_) {
    KW_RETURN_IF_ERROR(Arm());
  }
  if (!registers_change) {
    slots_ = std::move(next);
    SeedShadows(slots_);
    return absl::OkStatus();
  }
  // Changes of thread scopes alone (a per-call watch's, made while its thread is stopped at a
  // probe) write those threads' registers only, and stop no other thread: a trap handler's
  // thread must stay where it is.
  std::set<pid_t> only;
  for (const drmgr::SlotChange& c : changes.slots) {
    if (c.scope.kind != drmgr::Scope::Kind::kThread) {
      only.clear();
      break;
    }
    only.insert(c.scope.tid);
  }
  const bool stop = only.empty();
  if (stop) {
    KW_RETURN_IF_ERROR(proc_.StopAll());
  }
  absl::Cleanup resume = [this, stop] {
    if (stop) {
      (void)proc_.ResumeAll();
    }
  };
  std::map<pid_t, ThreadState> wrote;                 // new state of each thread
  std::vector<std::pair<pid_t, ThreadState>> before;  // for the rollback
  absl::Status failed = absl::OkStatus();
  if (!stop) {
    for (const auto& [tid, st] : threads_) {
      if (!only.contains(tid)) {
        wrote[tid] = st;  // unchanged
      }
    }
  }
  for (pid_t tid : stop ? proc_.TracedThreads() : std::vector<pid_t>(only.begin(), only.end())) {
    auto it = threads_.find(tid);
    const ThreadState cur = it == threads_.end() ? ThreadState{} : it->second;
    absl::StatusOr<ThreadState> want = Layout(tid, next, cur);
    if (!want.ok()) {
      failed = want.status();
      break;
    }
    int refused = -1;
    absl::Status s = WriteRegs(tid, cur, *want, &refused);
    if (absl::IsNotFound(s)) {
      continue;  // ESRCH: the thread died under kwatch (SIGKILL); its registers went with it
    }
    if (!s.ok()) {
      int ignored = -1;
      (void)WriteRegs(tid, *want, cur, &ignored);  // whatever part of it was written
      if (refused >= 0 && want->phys[refused].has_value()) {
        refused_scope_ = want->phys[refused]->first;
      }
      failed = s;
      break;
    }
    before.emplace_back(tid, cur);
    wrote[tid] = *std::move(want);
  }
  if (!failed.ok()) {
    for (const auto& [tid, old] : before) {  // all or nothing
      int ignored = -1;
      if (absl::Status r = WriteRegs(tid, wrote.at(tid), old, &ignored); !r.ok()) {
        std::fprintf(stderr, "kwatch: restoring debug registers of thread %d: %s\n", tid,
                     std::string{r.message()}.c_str());
      }
    }
    return failed;
  }
  for (const auto& [tid, st] : threads_) {
    if (!wrote.contains(tid)) {
      bps_.Drop(tid);  // gone meanwhile
    }
  }
  threads_ = std::move(wrote);
  slots_ = std::move(next);
  SeedShadows(slots_);
  return absl::OkStatus();
}

absl::Status StopBackend::OnThreadStart(pid_t tid) {
  // A recycled tid: the kernel gives new threads no breakpoint.
  threads_.erase(tid);
  bps_.Drop(tid);
  if (!armed_ || slots_.empty()) {
    return absl::OkStatus();
  }
  // Each new thread's arrival closes the breakpoints of threads that exited since the last
  // one (their events would keep a descriptor each): thread churn keeps the count bounded.
  if (threads_.size() >= proc_.TracedThreads().size()) {
    const std::vector<pid_t> traced = proc_.TracedThreads();
    const std::set<pid_t> live(traced.begin(), traced.end());
    for (auto it = threads_.begin(); it != threads_.end();) {
      if (!live.contains(it->first)) {
        bps_.Drop(it->first);
        it = threads_.erase(it);
      } else {
        ++it;
      }
    }
  }
  const ThreadState cur;
  KW_ASSIGN_OR_RETURN(ThreadState want, Layout(tid, slots_, cur));
  int refused = -1;
  absl::Status s = WriteRegs(tid, cur, want, &refused);
  if (absl::IsNotFound(s)) {
    return absl::OkStatus();
  }
  if (!s.ok()) {
    bps_.Drop(tid);
    std::string advice;
    if (absl::IsResourceExhausted(s)) {  // EMFILE
      rlimit lim{};
      ::getrlimit(RLIMIT_NOFILE, &lim);
      advice = absl::StrCat(
          "; kwatch holds one descriptor per thread and debug register: raise "
          "its limit (ulimit -n, now ",
          lim.rlim_cur, ")");
    }
    return {s.code(), absl::StrCat("arming the debug registers of new thread ", tid, ": ",
                                   s.message(), advice)};
  }
  threads_[tid] = std::move(want);
  return absl::OkStatus();
}

void StopBackend::Disarm() {
  if (!armed_) {
    return;
  }
  // Closing the events removes the breakpoints at once, running or stopped threads alike.
  bps_.DropAll();
  armed_ = false;
  // Traps raised before the breakpoints were closed may still be queued: claimed and dropped.
  draining_ = true;
  slots_.clear();
  threads_.clear();
  shadows_.clear();
}

void StopBackend::Forget() {
  // exec removed the breakpoints from the threads (remove_on_exec); their events still count
  // against the thread's registers until closed.
  bps_.DropAll();
  armed_ = false;
  draining_ = false;
  slots_.clear();
  threads_.clear();
  shadows_.clear();
  plans_.clear();  // the new image has other code at these addresses
  proc_.RemoveInterceptor(this);
}

absl::Status StopBackend::OnFork(core::ptrace::Process& /*child*/) {
  // The child carries no event of kwatch's (none is inherited) and no ptrace debug register.
  return absl::OkStatus();
}

void StopBackend::SeedShadows(const std::map<SlotKey, Armed>& slots) {
  std::set<drmgr::RequestId> live;
  for (const auto& [key, armed] : slots) {
    for (const drmgr::SlotHolder& h : armed.holders) {
      live.insert(h.id);
      if (!shadows_.contains(h.id)) {
        Shadow& sh = shadows_[h.id];
        sh.addr = h.addr.value;
        sh.bytes.assign(std::min(h.len, kMaxShadow), 0);
        (void)proc_.ReadMemory(h.addr, sh.bytes);
      }
    }
  }
  for (auto it = shadows_.begin(); it != shadows_.end();) {
    it = live.contains(it->first) ? std::next(it) : shadows_.erase(it);
  }
}

void StopBackend::RefreshShadow(drmgr::RequestId id) {
  auto it = shadows_.find(id);
  if (it != shadows_.end()) {
    (void)proc_.ReadMemory(core::RemoteAddr{it->second.addr}, it->second.bytes);
  }
}

bool StopBackend::Claims(pid_t /*tid*/, const siginfo_t& si) {
  return (armed_ || draining_) && IsOwnTrap(si);
}

absl::Status StopBackend::Handle(pid_t tid, const siginfo_t& si) {
  return OnTrap(tid, si, /*in_place=*/false).status();
}

absl::StatusOr<bool> StopBackend::HandleInPlace(pid_t tid, const siginfo_t& si) {
  return OnTrap(tid, si, /*in_place=*/true);
}

absl::StatusOr<bool> StopBackend::OnTrap(pid_t tid, const siginfo_t& si, bool in_place) {
  auto th = threads_.find(tid);
  if (!armed_ || th == threads_.end()) {
    return true;  // a late trap of a disarmed slot: dropped
  }
  // The register whose event sent the trap; a closed or replaced one names nothing.
  const int named = bps_.Fired(tid, core::ptrace::SiPerfData(si));
  const Armed* first = nullptr;
  if (named >= 0 && th->second.phys[named].has_value()) {
    auto it = slots_.find(*th->second.phys[named]);
    first = it != slots_.end() ? &it->second : nullptr;
  }
  if (first == nullptr) {
    ++stray_traps_;
    return true;
  }
  absl::StatusOr<user_regs_struct> got = proc_.GetRegs(tid);
  if (absl::IsNotFound(got.status())) {
    return true;  // the thread is gone
  }
  KW_RETURN_IF_ERROR(got.status());
  const user_regs_struct& regs = *got;
  const core::RemoteAddr trap_ip{regs.rip};
  const core::symbols::AccessSite& site = symbolizer_.SiteForTrap(trap_ip);
  // The accessing instruction, decoded with the registers after it ran: exact for the
  // usual stores and loads; an instruction that changes its own base register (push, pop,
  // movs) may miss its operand, and the access then counts as the whole fired chunk.
  std::vector<core::x86::MemoryOperand> operands;
  // A plain mov's value comes from the registers: the bytes it stored or loaded, even when
  // another thread writes the same bytes before kwatch could read them.
  std::optional<core::x86::RegisterAccess> from_regs;
  if (site.exact && site.ip < trap_ip && trap_ip - site.ip <= 15) {
    const std::span<const uint8_t> bytes(site.code.data(), trap_ip - site.ip);
    if (auto d = core::x86::DecodeAccess(bytes, site.ip.value, regs); d.ok()) {
      operands = d->memory;
    }
    auto plan = plans_.find(site.ip.value);
    if (plan == plans_.end()) {
      absl::StatusOr<core::x86::AccessPlan> p = core::x86::PlanAccess(bytes, site.ip.value);
      plan = plans_.emplace(site.ip.value, p.ok() ? std::optional(*p) : std::nullopt).first;
    }
    if (plan->second.has_value()) {
      const core::x86::RegisterAccess ra = core::x86::EvaluateAccess(*plan->second, &regs);
      if (ra.addr_known && ra.value_known) {
        from_regs = ra;
      }
    }
  }
  // One access sends one SIGTRAP, naming one of the registers it hit: the others are those
  // whose bytes the decoded operands touched with the kind they watch, and an execute
  // breakpoint at the stopped instruction when the kernel set RF for it.
  std::vector<const Armed*> fired = {first};
  for (int p = 0; p < drmgr::kNumDebugRegisters; ++p) {
    if (p == named || !th->second.phys[p].has_value()) {
      continue;
    }
    auto it = slots_.find(*th->second.phys[p]);
    if (it == slots_.end()) {
      continue;
    }
    const Armed& a = it->second;
    bool hit = false;
    if (a.kind == drmgr::DrKind::kExec) {
      hit = first->kind != drmgr::DrKind::kExec && a.chunk.addr == trap_ip &&
            (regs.eflags & kEflagsRf) != 0;
    } else if (first->kind != drmgr::DrKind::kExec) {  // (its operands: another instruction's)
      const uint64_t c_lo = a.chunk.addr.value;
      const uint64_t c_hi = c_lo + a.chunk.len;
      for (const core::x86::MemoryOperand& m : operands) {
        hit = hit || (m.addr < c_hi && m.addr + m.size > c_lo &&
                      (m.write || a.kind == drmgr::DrKind::kReadWrite));
      }
    }
    if (hit) {
      fired.push_back(&a);
    }
  }
  struct HolderHit {
    drmgr::SlotHolder holder;
    drmgr::DrKind slot_kind = drmgr::DrKind::kWrite;
    uint64_t chunk_lo = ~uint64_t{0}, chunk_hi = 0;  // fired chunks' span
    bool exact = false;
    uint64_t lo = ~uint64_t{0}, hi = 0;  // the operands' bytes in the fired chunks
    bool write = false;
  };
  std::map<drmgr::RequestId, HolderHit> hits;
  for (const Armed* a : fired) {
    const uint64_t c_lo = a->chunk.addr.value;
    const uint64_t c_hi = c_lo + a->chunk.len;
    for (const drmgr::SlotHolder& h : a->holders) {
      HolderHit& hh = hits[h.id];
      hh.holder = h;
      hh.slot_kind = a->kind;
      hh.chunk_lo = std::min(hh.chunk_lo, c_lo);
      hh.chunk_hi = std::max(hh.chunk_hi, c_hi);
      for (const core::x86::MemoryOperand& m : operands) {
        if (m.addr < c_hi && m.addr + m.size > c_lo) {
          hh.exact = true;
          hh.lo = std::min(hh.lo, m.addr);
          hh.hi = std::max(hh.hi, m.addr + m.size);
          hh.write = hh.write || m.write;
        }
      }
    }
  }
  // When an operand lies in some fired chunk the decoding is trusted: a holder whose chunks it
  // missed saw nothing (a wide cover, or a register DR6 names without a match). Otherwise
  // the instruction is unknown and each holder gets its fired bytes.
  const bool decoded =
      std::any_of(hits.begin(), hits.end(), [](const auto& kv) { return kv.second.exact; });
  const uint64_t now = core::MonotonicNs();
  uint32_t stack = 0;  // taken at the first event of this trap
  struct KnownValue {
    drmgr::RequestId id;
    uint64_t addr;
    uint32_t size;
    uint64_t value;
  };
  std::vector<KnownValue> known;  // values taken from the registers
  std::vector<core::AccessEvent> out;
  uint64_t unrelated = 0;  // committed with the events
  uint64_t reads_filtered = 0;
  for (auto& [id, hh] : hits) {
    const std::optional<uint32_t> owner = OwnerOf(id);
    if (!owner.has_value()) {
      continue;
    }
    const uint64_t h_lo = hh.holder.addr.value;
    const uint64_t h_hi = h_lo + hh.holder.len;
    // The watched bytes in the fired chunks, and those the instruction touched.
    const uint64_t w_lo = std::max(hh.chunk_lo, h_lo);
    const uint64_t w_hi = std::min(hh.chunk_hi, h_hi);
    const uint64_t a_lo = hh.exact ? std::max(hh.lo, h_lo) : w_lo;
    const uint64_t a_hi = hh.exact ? std::min(hh.hi, h_hi) : w_hi;
    if (a_lo >= a_hi || (decoded && !hh.exact && hh.slot_kind != drmgr::DrKind::kExec)) {
      ++unrelated;  // a wide cover: the access missed the watched bytes
      continue;
    }
    const auto size = static_cast<uint32_t>(std::min<uint64_t>(a_hi - a_lo, 8));
    std::array<uint8_t, 8> now_bytes{};
    const absl::Status read =
        proc_.ReadMemory(core::RemoteAddr{a_lo}, std::span<uint8_t>(now_bytes.data(), size));
    std::optional<uint64_t> old_value;
    auto sh = shadows_.find(id);
    if (sh != shadows_.end() && a_lo >= sh->second.addr &&
        a_lo + size <= sh->second.addr + sh->second.bytes.size()) {
      old_value = LittleEndian(
          std::span<const uint8_t>(sh->second.bytes.data() + (a_lo - sh->second.addr), size));
    }
    core::AccessKind kind = core::AccessKind::kRead;
    if (hh.slot_kind == drmgr::DrKind::kExec) {
      kind = core::AccessKind::kExec;
    } else if (hh.exact) {
      kind = hh.write ? core::AccessKind::kWrite : core::AccessKind::kRead;
    } else if (hh.slot_kind == drmgr::DrKind::kWrite ||
               (read.ok() && old_value.has_value() &&
                *old_value != LittleEndian(std::span<const uint8_t>(now_bytes.data(), size)))) {
      kind = core::AccessKind::kWrite;  // undecoded: a write slot, or the bytes changed
    }
    if (hh.holder.kind == drmgr::DrKind::kWrite && kind == core::AccessKind::kRead) {
      ++reads_filtered;
      continue;
    }
    core::AccessEvent ev;
    ev.time_ns = now;
    ev.pid = proc_.pid();
    ev.tid = tid;
    ev.watch_id = *owner;
    ev.call = CallOf(id);
    ev.trap_ip = trap_ip;
    ev.ip = kind == core::AccessKind::kExec ? trap_ip : site.ip;
    ev.addr = core::RemoteAddr{w_lo};
    ev.len = static_cast<uint32_t>(w_hi - w_lo);
    ev.access_addr = core::RemoteAddr{a_lo};
    if (stack == 0) {
      stack = CaptureStack(tid);
    }
    ev.stack_id = stack;
    ev.access_size = hh.exact ? static_cast<uint32_t>(a_hi - a_lo) : 0;
    ev.kind = kind;
    if (kind != core::AccessKind::kExec) {
      if (from_regs.has_value() && a_lo >= from_regs->addr &&
          a_lo + size <= from_regs->addr + from_regs->size) {
        const uint64_t v = from_regs->value >> (8 * (a_lo - from_regs->addr));
        ev.value = size >= 8 ? v : v & ((uint64_t{1} << (8 * size)) - 1);
        known.push_back({id, a_lo, size, *ev.value});
      } else if (read.ok()) {
        ev.value = LittleEndian(std::span<const uint8_t>(now_bytes.data(), size));
      }
      ev.old_value = old_value;
      ev.value_exact = true;
    }
    out.push_back(ev);
  }
  const auto synced = [this](const core::AccessEvent& ev) { return sync_ && sync_(ev.watch_id); };
  const bool any_sync = std::any_of(out.begin(), out.end(), synced);
  if (in_place && any_sync) {
    return false;  // again in Handle, with every thread stopped
  }
  unrelated_ += unrelated;
  reads_filtered_ += reads_filtered;
  for (const auto& [id, hh] : hits) {
    RefreshShadow(id);
  }
  // The shadows hold what this access left, not what another thread wrote since.
  for (const KnownValue& k : known) {
    auto sh = shadows_.find(k.id);
    if (sh != shadows_.end() && k.addr >= sh->second.addr &&
        k.addr + k.size <= sh->second.addr + sh->second.bytes.size()) {
      for (uint32_t i = 0; i < k.size; ++i) {
        sh->second.bytes[k.addr - sh->second.addr + i] = static_cast<uint8_t>(k.value >> (8 * i));
      }
    }
  }
  for (const core::AccessEvent& ev : out) {
    if (!synced(ev)) {
      events_.push_back(ev);
    }
  }
  if (any_sync) {
    // The hook may Apply: the holders and slots iterated above are not used past this point.
    for (const core::AccessEvent& ev : out) {
      if (synced(ev)) {
        KW_RETURN_IF_ERROR(sync_hook_(ev));
      }
    }
  }
  return true;
}

void StopBackend::Collect(std::vector<core::AccessEvent>& out) {
  out.insert(out.end(), events_.begin(), events_.end());
  events_.clear();
}

}  // namespace kwatch::watch
