#include "watch/probe/agent_calls.h"

#include <linux/hw_breakpoint.h>
#include <linux/perf_event.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "agent/abi.h"
#include "core/base/status_macros.h"
#include "core/base/syscall_status.h"
#include "core/base/unique_fd.h"
#include "core/base/unique_mmap.h"
#include "core/probe/agent_fetch.h"
#include "core/symbols/symbols.h"
#include "watch/agent/controller.h"
#include "watch/perf_access.h"
#include "watch/perf_ring.h"
#include "watch/perf_util.h"
#include "watch/probe/jump_plan.h"

namespace kwatch::watch::probe {

namespace ka = kwatch::agent;
namespace wa = kwatch::watch::agent;

namespace {

// The samples the agent's breakpoints take: PerfBackend's stream format with the general user
// registers (TrapDecoder finds each access's bytes and value from them).
constexpr uint64_t kSampleType = PERF_SAMPLE_IP | PERF_SAMPLE_TID | PERF_SAMPLE_TIME |
                                 PERF_SAMPLE_ADDR | PERF_SAMPLE_CPU | PERF_SAMPLE_REGS_USER;

// What the planted probes are, per address: the first of an address is patched with the jump.
struct Planned {
  core::RemoteAddr addr;
  core::probe::JumpPlan plan;
};

class AgentCalls final : public CallAgent {
 public:
  AgentCalls(core::ptrace::Process& proc, CallWatches& calls, const AgentCallsOptions& options)
      : proc_(proc),
        calls_(calls),
        options_(options),
        decoder_(calls.session().symbolizer(), PerfUserRegsMaskGeneral()) {}
  ~AgentCalls() override = default;
  AgentCalls(const AgentCalls&) = delete;
  AgentCalls& operator=(const AgentCalls&) = delete;

  absl::Status Plant(const CallAgentPlan& plan);

  void Collect(std::vector<core::AccessEvent>& out) override;
  std::vector<int> Fds() const override { return {}; }
  absl::Status End() override;
  void Forget() override;
  uint64_t Missed(uint32_t watch_id) const override;
  uint64_t Lost() const override;
  std::string Description() const override;

 private:
  // One watched object kind (a KwCallWatch).
  struct Watched {
    uint32_t watch_id = 0;
    drmgr::DrKind kind = drmgr::DrKind::kWrite;
    uint32_t len = 0;
  };
  void OnRecord(const wa::AgentHit& hit);
  // The accesses of `bytes` (whole perf records of one call's breakpoint) into `out_`.
  // `from`: the ring position of bytes[0]; records below what was delivered of the call
  // already (read live from the target) are skipped.
  void OnSamples(const ka::KwCallRecord& rec, uint64_t from, std::span<const uint8_t> bytes);
  // The calls still running: what their breakpoints caught since the last read.
  void ReadRunning();
  // kwatch's mapping of the ring of KwCallSlot `slot` of KwThread `thread` (breakpoint
  // `target_fd` in the target), made the first time; null when it cannot be mapped.
  const uint8_t* RingOf(uint32_t thread, uint32_t slot, int32_t target_fd);
  // A gone thread's breakpoints go to the agent's close queue (or left_open_ when it is full).
  void QueueCloses(ka::KwThread& th);
  bool OwnCode(uint64_t ip) const;

  core::ptrace::Process& proc_;
  CallWatches& calls_;
  AgentCallsOptions options_;
  TrapDecoder decoder_;
  std::unique_ptr<wa::Controller> ctl_;
  std::vector<Watched> watched_;                         // by KwCallWatch index
  std::vector<std::pair<uint64_t, uint64_t>> own_code_;  // the agent's code and trampolines
  std::vector<core::AccessEvent>* out_ = nullptr;        // during Collect and End
  std::vector<core::AccessEvent> at_end_;                // End's, for the last Collect
  uint64_t own_samples_ = 0;   // samples of the agent's own code (dropped)
  uint64_t lost_ = 0;          // samples the breakpoints' rings lost (PERF_RECORD_LOST)
  uint64_t lost_records_ = 0;  // the agent's records that did not fit its rings
  std::vector<std::pair<int, uint64_t>> left_open_;  // (fd, ring) of gone threads, for End
  // Calls armed and not ended, by (KwCallWatch, call): the ring position up to which their
  // samples were delivered (read live from the target's ring, or from the agent's copies).
  std::map<std::pair<uint32_t, uint32_t>, uint64_t> running_;
  struct Mapped {
    int32_t target_fd = -1;
    core::UniqueFd fd;  // kwatch's copy of the target's breakpoint
    core::UniqueMmap map;
  };
  std::map<std::pair<uint32_t, uint32_t>, Mapped> mapped_;  // by (KwThread, KwCallSlot)
  uint32_t jumps_ = 0;
  bool ended_ = false;
};

}  // namespace

absl::Status AgentCalls::Plant(const CallAgentPlan& plan) {
  // Every probe must be a jump (an INT3 would stop the traced thread for kwatch): decided from
  // the file before the target is touched.
  absl::StatusOr<std::unique_ptr<core::symbols::Symbols>> syms =
      core::symbols::Symbols::ForProcess(proc_.pid());
  if (!syms.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("no symbols: ", syms.status().message()));
  }
  std::vector<core::RemoteAddr> all;
  for (const CallAgentPlan::Function& f : plan.functions) {
    for (const core::RemoteAddr a : {f.entry, f.at, f.until}) {
      if (a.value != 0 && std::find(all.begin(), all.end(), a) == all.end()) {
        all.push_back(a);
      }
    }
  }
  std::map<uint64_t, core::probe::JumpPlan> jumps;
  for (const core::RemoteAddr a : all) {
    core::probe::JumpDecision d = PlanJumpAt(syms->get(), a, all);
    if (!d.plan.has_value()) {
      return absl::FailedPreconditionError(
          absl::StrFormat("no jump can be placed at 0x%x (%s)", a.value, d.reason));
    }
    jumps.emplace(a.value, *d.plan);
  }
  std::vector<std::vector<ka::KwFetchOp>> programs;  // each object's address, in plan order
  for (const CallAgentPlan::Function& f : plan.functions) {
    for (const CallAgentPlan::Object& o : f.objects) {
      std::string why;
      std::optional<std::vector<ka::KwFetchOp>> p =
          core::probe::AgentObjectAddress(o.place, plan.load_bias, &why);
      if (!p.has_value()) {
        return absl::FailedPreconditionError(absl::StrCat("'", o.place.text, "': ", why));
      }
      programs.push_back(*std::move(p));
    }
  }
  wa::LoadOptions lopts;
  lopts.shm.probe_capacity = 64;
  // A watched call writes ~200 bytes of records plus its samples (~250 bytes each): 4 MiB
  // holds thousands of calls between two drains (pages are taken as they are written).
  lopts.shm.thread_capacity = 64;
  lopts.shm.ring_bytes = 4 * 1024 * 1024;
  lopts.shm.code_capacity = 1024;
  lopts.shm.call_watch_capacity = static_cast<uint32_t>(programs.size());
  lopts.shm.call_ring_pages = options_.ring_pages;
  lopts.shm.call_sample_type = kSampleType;
  lopts.shm.call_sample_regs = PerfUserRegsMaskGeneral();
  KW_ASSIGN_OR_RETURN(const std::vector<core::ptrace::MapEntry> before, proc_.Maps());
  absl::StatusOr<std::unique_ptr<wa::Controller>> ctl = wa::Controller::Load(proc_, lopts);
  if (!ctl.ok()) {
    return absl::UnavailableError(ctl.status().message());
  }
  ctl_ = *std::move(ctl);
  const ka::KwControl& c = ctl_->tables().control();
  if ((c.agent_features & ka::kKwFeatureJump) == 0 ||
      (c.agent_features & ka::kKwFeatureReturn) == 0 || c.jump_entry == 0) {
    return absl::UnavailableError("the agent started without its jump entry or return probes");
  }
  std::map<uint64_t, uint32_t> first_at;  // address -> the probe patched there
  const auto place = [&](wa::ProbeEntry entry) -> absl::StatusOr<uint32_t> {
    entry.flags |= ka::kKwProbeJump;
    entry.resume = ka::kKwResumeXol;
    if (auto it = first_at.find(entry.addr.value); it != first_at.end()) {
      entry.xol_addr = ctl_->tables().probe(it->second).xol_addr;
      return ctl_->AddProbe(entry);  // chained: the agent runs it after the first
    }
    KW_ASSIGN_OR_RETURN(const uint32_t index, ctl_->AddProbe(entry));
    KW_RETURN_IF_ERROR(PatchJumpProbe(*ctl_, proc_, jumps.at(entry.addr.value), index, entry.addr));
    first_at[entry.addr.value] = index;
    ++jumps_;
    return index;
  };
  uint32_t next_watch = 0;
  for (const CallAgentPlan::Function& f : plan.functions) {
    const uint32_t first = next_watch;
    wa::ProbeEntry ret;
    ret.addr = f.entry;
    ret.flags = ka::kKwProbeEnabled | ka::kKwProbeReturn;
    ret.call_watch = first + 1;
    KW_ASSIGN_OR_RETURN(const uint32_t ret_index, place(ret));
    for (const CallAgentPlan::Object& o : f.objects) {
      const uint32_t w = next_watch++;
      ka::KwCallWatch& cw = ctl_->tables().call_watch(w);
      cw.function = ret_index;
      cw.first = first;
      cw.bp_type = o.kind == drmgr::DrKind::kWrite ? HW_BREAKPOINT_W : HW_BREAKPOINT_RW;
      cw.bp_len = o.length;
      watched_.push_back(Watched{o.watch_id, o.kind, o.length});
      wa::ProbeEntry arm;
      arm.addr = f.at;
      arm.flags = ka::kKwProbeEnabled | ka::kKwProbeCallArm;
      arm.call_watch = w + 1;
      arm.program = std::move(programs[w]);
      arm.record_bytes = 16;
      KW_RETURN_IF_ERROR(place(arm).status());
    }
    if (f.until.value != 0) {
      wa::ProbeEntry until;
      until.addr = f.until;
      until.flags = ka::kKwProbeEnabled | ka::kKwProbeCallEnd;
      until.call_watch = first + 1;
      KW_RETURN_IF_ERROR(place(until).status());
    }
  }
  // The agent's code and the trampolines: mappings with execute rights that the load made.
  KW_ASSIGN_OR_RETURN(const std::vector<core::ptrace::MapEntry> after, proc_.Maps());
  for (const core::ptrace::MapEntry& m : after) {
    const bool old = std::any_of(before.begin(), before.end(), [&m](const auto& b) {
      return b.start == m.start && b.end == m.end && b.path == m.path;
    });
    if (!old && m.exec) {
      own_code_.emplace_back(m.start.value, m.end.value);
    }
  }
  ctl_->Activate();
  return absl::OkStatus();
}

bool AgentCalls::OwnCode(uint64_t ip) const {
  return std::any_of(own_code_.begin(), own_code_.end(),
                     [ip](const auto& r) { return ip >= r.first && ip < r.second; });
}

void AgentCalls::OnRecord(const wa::AgentHit& hit) {
  const uint16_t type = hit.record.type;
  if ((type != ka::kKwRecordCallArm && type != ka::kKwRecordCallEnd &&
       type != ka::kKwRecordCallSamples) ||
      hit.payload.size() < sizeof(ka::KwCallRecord)) {
    return;
  }
  ka::KwCallRecord rec{};
  std::memcpy(&rec, hit.payload.data(), sizeof(rec));
  if (rec.watch >= watched_.size()) {
    return;
  }
  const Watched& w = watched_[rec.watch];
  const pid_t tid = hit.record.tid;
  const uint64_t entry_sp = rec.stack_slot;
  if (type == ka::kKwRecordCallArm) {
    if (rec.status == ka::kKwCallArmed) {
      running_[{rec.watch, rec.call}] = rec.head;  // its samples start there
    }
    std::string why;
    if (rec.status != ka::kKwCallArmed) {
      why = rec.status == ka::kKwCallNoSlot ? std::string(kCallNoRegister)
            : rec.status == ka::kKwCallNull ? std::string("a NULL pointer on the way to the object")
            : rec.status == ka::kKwCallUnaligned
                ? absl::StrFormat("its address is not aligned to its %d bytes", w.len)
                : absl::StrCat("the agent could not arm it: ", core::ErrnoText(rec.error));
    }
    calls_.AgentLookup(w.watch_id, rec.call, tid, hit.time_ns, entry_sp, core::RemoteAddr{rec.addr},
                       why);
    return;
  }
  if (type == ka::kKwRecordCallSamples) {
    if (rec.head <= hit.payload.size() - sizeof(rec)) {
      OnSamples(rec, rec.ring, hit.payload.subspan(sizeof(rec), rec.head));
    }
    return;
  }
  running_.erase({rec.watch, rec.call});  // its samples all came (copied before the end)
  CallWatches::EndHow how = CallWatches::EndHow::kReturned;
  switch (rec.status) {
    case ka::kKwCallUntil:
      how = CallWatches::EndHow::kUntil;
      break;
    case ka::kKwCallAbandoned:
      how = CallWatches::EndHow::kAbandoned;
      break;
    case ka::kKwCallNotLooked:
      how = CallWatches::EndHow::kNotLooked;
      break;
    default:
      break;
  }
  calls_.AgentEnd(w.watch_id, rec.call, tid, hit.time_ns, entry_sp, how);
}

void AgentCalls::OnSamples(const ka::KwCallRecord& rec, uint64_t from,
                           std::span<const uint8_t> bytes) {
  const Watched& w = watched_[rec.watch];
  const PerfSampleFormat format{.callchain = false, .regs_user = PerfUserRegsMaskGeneral()};
  uint64_t* delivered = nullptr;
  if (auto it = running_.find({rec.watch, rec.call}); it != running_.end()) {
    delivered = &it->second;
  }
  size_t at = 0;
  while (at + sizeof(perf_event_header) <= bytes.size()) {
    perf_event_header h{};
    std::memcpy(&h, bytes.data() + at, sizeof(h));
    if (h.size < sizeof(h) || at + h.size > bytes.size()) {
      break;
    }
    const std::span<const uint8_t> record = bytes.subspan(at, h.size);
    const uint64_t position = from + at;
    at += h.size;
    if (delivered != nullptr) {
      if (position < *delivered) {
        continue;  // read live already
      }
      *delivered = position + h.size;
    }
    if (h.type == PERF_RECORD_LOST && record.size() >= 24) {
      uint64_t n = 0;
      std::memcpy(&n, record.data() + 16, sizeof(n));
      lost_ += n;
      continue;
    }
    PerfSample s;
    if (!ParseSample(record, format, s)) {
      continue;
    }
    if (OwnCode(s.ip)) {
      ++own_samples_;  // the agent's trampolines pushing over a returned call's frame
      continue;
    }
    const SampledAccess a = decoder_.Resolve(s);
    core::AccessEvent ev = SampleEvent(s);
    ev.ip = a.ip;
    ev.kind = w.kind == drmgr::DrKind::kWrite || a.writes ? core::AccessKind::kWrite
                                                          : core::AccessKind::kRead;
    ev.watch_id = w.watch_id;
    ev.call = rec.call;
    const TouchedBytes t = Touched(a, rec.addr, rec.addr + w.len);
    SetWatchedPart(ev, t, t.lo, t.hi);
    (out_ != nullptr ? *out_ : at_end_).push_back(ev);
  }
}

const uint8_t* AgentCalls::RingOf(uint32_t thread, uint32_t slot, int32_t target_fd) {
  Mapped& m = mapped_[{thread, slot}];
  if (m.target_fd != target_fd || m.map.get() == nullptr) {
    m = Mapped{};
    // The target's ring cannot be read through /proc/PID/mem (a perf mapping): kwatch maps the
    // same ring through a copy of the fd.
    core::UniqueFd fd(static_cast<int>(::syscall(SYS_pidfd_getfd, ctl_->pidfd(), target_fd, 0)));
    if (!fd.valid()) {
      return nullptr;
    }
    const size_t bytes = (size_t{options_.ring_pages} + 1) * 4096;
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    if (p == MAP_FAILED) {
      return nullptr;
    }
    m.target_fd = target_fd;
    m.fd = std::move(fd);
    m.map = core::UniqueMmap(p, bytes);
  }
  return static_cast<const uint8_t*>(m.map.get());
}

void AgentCalls::ReadRunning() {
  const uint64_t data_bytes = uint64_t{options_.ring_pages} * 4096;
  for (uint32_t i = 0; i < ctl_->tables().layout().thread_capacity; ++i) {
    const ka::KwThread& th = ctl_->tables().thread(i);
    if (th.tid.load(std::memory_order_acquire) == 0) {
      continue;
    }
    for (uint32_t j = 0; j < ka::kKwCallSlots; ++j) {
      const ka::KwCallSlot& slot = th.call_slot[j];
      const uint32_t watch = slot.watch;
      const uint32_t call = slot.call;
      const int32_t fd_plus1 = slot.fd_plus1;
      auto it = running_.find({watch - 1, call});
      if (watch == 0 || fd_plus1 <= 0 || it == running_.end()) {
        continue;  // free, or its lookup is not read yet
      }
      const uint8_t* ring = RingOf(i, j, fd_plus1 - 1);
      if (ring == nullptr) {
        continue;
      }
      const auto* meta = reinterpret_cast<const perf_event_mmap_page*>(ring);
      const uint64_t head = __atomic_load_n(&meta->data_head, __ATOMIC_ACQUIRE);
      const uint64_t from = it->second;
      if (head <= from || head - from > data_bytes) {
        continue;
      }
      std::vector<uint8_t> bytes(head - from);
      for (uint64_t k = 0; k < bytes.size(); ++k) {
        bytes[k] = ring[4096 + ((from + k) & (data_bytes - 1))];
      }
      // Still this call's (its end would have moved the slot on): else its end's copy has them.
      if (slot.watch != watch || slot.call != call) {
        continue;
      }
      ka::KwCallRecord rec{};
      rec.watch = watch - 1;
      rec.call = call;
      rec.addr = slot.addr;
      OnSamples(rec, from, bytes);
    }
  }
}

void AgentCalls::Collect(std::vector<core::AccessEvent>& out) {
  if (ctl_ == nullptr) {
    return;
  }
  out.insert(out.end(), at_end_.begin(), at_end_.end());
  at_end_.clear();
  if (!ended_) {
    out_ = &out;
    const auto on_record = [this](const wa::AgentHit& hit) { OnRecord(hit); };
    if (absl::StatusOr<wa::DrainStats> d = ctl_->Drain(on_record); d.ok()) {
      lost_records_ += d->lost;
    }
    // Threads that are gone: their slots are freed for new threads, and their breakpoints
    // closed by the agent (at its next lookup) or by kwatch at the end.
    (void)ctl_->ReapThreadSlots(on_record, [this](ka::KwThread& th) { QueueCloses(th); });
    ReadRunning();  // calls still running: what their breakpoints caught so far, live
    out_ = nullptr;
  }
}

absl::Status AgentCalls::End() {
  if (ctl_ == nullptr || ended_) {
    return absl::OkStatus();
  }
  // Every thread is stopped (CallWatches::Remove): the code goes back first, so that no call
  // starts; calls in flight keep their return through the agent's trampoline.
  const bool live = proc_.alive();
  absl::Status s = ctl_->End(proc_);  // a target gone: nothing to restore (EndGone)
  // The agent's records written up to now (calls that ended before the stop), then the calls
  // still running, from the target's rings.
  (void)ctl_->Drain([this](const wa::AgentHit& hit) { OnRecord(hit); });
  if (live) {
    ReadRunning();
  }
  mapped_.clear();
  // The target's breakpoints and rings go: they take no register any more.
  for (uint32_t i = 0; i < ctl_->tables().layout().thread_capacity; ++i) {
    for (ka::KwCallSlot& cs : ctl_->tables().thread(i).call_slot) {
      if (cs.fd_plus1 > 0) {
        left_open_.emplace_back(cs.fd_plus1 - 1, cs.ring);
      }
      cs = ka::KwCallSlot{};  // closed below: the watchdog must not touch a reused fd number
    }
  }
  // ... and the gone threads' breakpoints the agent has not closed yet.
  for (ka::KwCloseEntry& e : ctl_->tables().control().closes) {
    if (const int32_t fd = e.fd_plus1.exchange(0); fd > 0) {
      left_open_.emplace_back(fd - 1, e.ring);
    }
  }
  const pid_t tid = proc_.AnyStoppedThread();
  const uint64_t bytes = (uint64_t{options_.ring_pages} + 1) * 4096;
  for (const auto& [fd, ring] : left_open_) {
    if (tid != 0 && live) {
      (void)proc_.RemoteSyscall(tid, SYS_munmap, std::vector<uint64_t>{ring, bytes});
      (void)proc_.RemoteSyscall(tid, SYS_close, std::vector<uint64_t>{static_cast<uint64_t>(fd)});
    }
  }
  left_open_.clear();
  ended_ = true;
  if (absl::Status f = ctl_->Finish([this](const wa::AgentHit& hit) { OnRecord(hit); }); s.ok()) {
    s = f;
  }
  return s;
}

uint64_t AgentCalls::Lost() const {
  return lost_ + lost_records_;
}

void AgentCalls::QueueCloses(ka::KwThread& th) {
  ka::KwControl& c = ctl_->tables().control();
  for (ka::KwCallSlot& cs : th.call_slot) {
    if (cs.fd_plus1 <= 0) {
      continue;
    }
    bool queued = false;
    for (ka::KwCloseEntry& e : c.closes) {
      if (e.fd_plus1.load(std::memory_order_acquire) == 0) {
        e.ring = cs.ring;
        e.fd_plus1.store(cs.fd_plus1, std::memory_order_release);
        c.closes_pending.fetch_add(1, std::memory_order_acq_rel);
        queued = true;
        break;
      }
    }
    if (!queued) {
      left_open_.emplace_back(cs.fd_plus1 - 1, cs.ring);  // closed at the end
    }
    for (auto m = mapped_.begin(); m != mapped_.end();) {
      m = m->second.target_fd == cs.fd_plus1 - 1 ? mapped_.erase(m) : std::next(m);
    }
    cs = ka::KwCallSlot{};
  }
}

void AgentCalls::Forget() {
  ended_ = true;
  mapped_.clear();
  ctl_.reset();
}

uint64_t AgentCalls::Missed(uint32_t watch_id) const {
  if (ctl_ == nullptr) {
    return 0;
  }
  for (uint32_t i = 0; i < watched_.size(); ++i) {
    if (watched_[i].watch_id == watch_id) {
      const wa::Controller& ctl = *ctl_;
      const ka::KwCallWatch& cw = ctl.tables().call_watch(i);
      const ka::KwProbe& ret = ctl.tables().probe(cw.function);
      return cw.missed.load(std::memory_order_relaxed) +
             ret.nmissed.load(std::memory_order_relaxed);
    }
  }
  return 0;
}

std::string AgentCalls::Description() const {
  return absl::StrCat(
      "watches per call run in the target: kwatch's agent arms each call's object in a "
      "breakpoint of the calling thread at the lookup point and disarms it at the call's end "
      "(",
      jumps_, " jump", jumps_ == 1 ? "" : "s", " to trampolines, no stop per call)");
}

absl::StatusOr<std::unique_ptr<CallAgent>> StartAgentCalls(core::ptrace::Process& proc,
                                                           CallWatches& calls,
                                                           const CallAgentPlan& plan,
                                                           const AgentCallsOptions& options) {
  auto a = std::make_unique<AgentCalls>(proc, calls, options);
  if (absl::Status s = a->Plant(plan); !s.ok()) {
    (void)a->End();
    return s;
  }
  return a;
}

}  // namespace kwatch::watch::probe
