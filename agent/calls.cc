// Per-call watches (agent/abi.h "Per-call watches"): a watched function's calls are numbered at
// their entry, each looks its object up at the lookup point and arms it in a perf breakpoint of
// its own thread, and each end disables it. The system calls here (perf_event_open and mmap at a
// thread's first watched call, one ioctl at each arm and each end) are the per-call cost.

#include <linux/hw_breakpoint.h>
#include <linux/perf_event.h>
#include <sys/mman.h>

#include <array>
#include <cerrno>
#include <cstdint>
#include <ctime>

#include "agent/agent.h"
#include "agent/sys.h"

namespace kwatch::agent {

namespace {

constexpr uint64_t kPage = 4096;

inline void Bump(std::atomic<uint64_t>& counter) {
  counter.fetch_add(1, std::memory_order_relaxed);
}

// The breakpoint's attributes: the same at its open and at every retarget (the kernel refuses a
// PERF_EVENT_IOC_MODIFY_ATTRIBUTES that changes more than the address, type, length and
// `disabled`).
perf_event_attr CallAttr(const KwControl& c, const KwCallWatch& w, uint64_t addr, bool disabled) {
  perf_event_attr a{};
  a.type = PERF_TYPE_BREAKPOINT;
  a.size = sizeof(a);
  a.bp_type = w.bp_type;
  a.bp_addr = addr;
  a.bp_len = w.bp_len;
  a.sample_period = 1;
  a.sample_type = c.call_sample_type;
  a.sample_regs_user = c.call_sample_regs;
  a.exclude_kernel = 1;
  a.exclude_hv = 1;
  a.use_clockid = 1;
  a.clockid = CLOCK_MONOTONIC;
  a.watermark = 1;
  a.wakeup_watermark = static_cast<uint32_t>(uint64_t{c.call_ring_pages} * kPage / 2);
  a.disabled = disabled ? 1 : 0;
  return a;
}

inline uint64_t RingHead(uint64_t ring) {
  const auto* page = reinterpret_cast<const perf_event_mmap_page*>(ring);
  return __atomic_load_n(&page->data_head, __ATOMIC_ACQUIRE);
}

// Appends a record of `type` with `payload` to the thread's ring; false when it did not fit.
bool WriteCallRecord(Session& s, ThreadState& t, uint16_t type, uint64_t ip, uint64_t tsc,
                     const KwCallRecord& payload) {
  uint64_t head = 0;
  KwRecord* rec = ReserveRecord(s, t, sizeof(KwRecord) + sizeof(KwCallRecord), &head);
  if (rec == nullptr) {
    return false;
  }
  rec->type = type;
  rec->flags = 0;
  rec->size = sizeof(KwRecord) + sizeof(KwCallRecord);
  rec->probe_index = payload.watch;
  rec->tid = t.tid;
  rec->tsc = tsc;
  rec->ip = ip;
  rec->return_address = 0;
  *reinterpret_cast<KwCallRecord*>(rec + 1) = payload;
  CommitRecord(t, head + rec->size);
  return true;
}

constexpr uint64_t kChunk = 8192;  // sample bytes per kKwRecordCallSamples record at most

// Moves the samples of `slot`'s ring up to `head` (the breakpoint disabled) into records of
// the thread's ring, whole perf records each; what does not fit is counted lost.
void CopySamples(Session& s, ThreadState& t, KwCallSlot& slot, const KwCallRecord& about,
                 uint64_t head, uint64_t ip, uint64_t tsc) {
  auto* page = reinterpret_cast<perf_event_mmap_page*>(slot.ring);
  const uint64_t size = uint64_t{s.ctl->call_ring_pages} * kPage;
  const uint8_t* data = reinterpret_cast<const uint8_t*>(slot.ring) + kPage;
  uint64_t tail = page->data_tail;
  while (tail < head) {
    uint64_t end = tail;
    while (end < head) {
      const auto* h = reinterpret_cast<const perf_event_header*>(data + (end & (size - 1)));
      if (h->size < sizeof(perf_event_header) || end + h->size > head ||
          end + h->size - tail > kChunk) {
        break;
      }
      end += h->size;
    }
    if (end == tail) {
      break;  // a malformed record: the rest is dropped
    }
    const uint64_t n = end - tail;
    uint64_t at = 0;
    KwRecord* rec = ReserveRecord(s, t, sizeof(KwRecord) + sizeof(KwCallRecord) + n, &at);
    if (rec == nullptr) {
      Bump(s.call_watches[about.watch].lost);
    } else {
      rec->type = kKwRecordCallSamples;
      rec->flags = 0;
      rec->size = static_cast<uint32_t>(sizeof(KwRecord) + sizeof(KwCallRecord) + n);
      rec->probe_index = about.watch;
      rec->tid = t.tid;
      rec->tsc = tsc;
      rec->ip = ip;
      rec->return_address = 0;
      auto* payload = reinterpret_cast<KwCallRecord*>(rec + 1);
      *payload = about;
      payload->head = n;
      payload->ring = tail;  // the ring position of the first byte (kwatch may have read it)
      auto* out = reinterpret_cast<uint8_t*>(payload + 1);
      const uint64_t off = tail & (size - 1);
      const uint64_t first = size - off < n ? size - off : n;
      __builtin_memcpy(out, data + off, first);
      if (first < n) {
        __builtin_memcpy(out + first, data, n - first);
      }
      CommitRecord(t, at + rec->size);
    }
    tail = end;
  }
  __atomic_store_n(&page->data_tail, head, __ATOMIC_RELEASE);
}

// Arms `w` on `addr` in slot `j` of the thread (opening its breakpoint the first time).
void ArmSlot(Session& s, KwThread& th, uint32_t j, uint32_t w, uint64_t addr, KwCallRecord& rec) {
  const KwControl& c = *s.ctl;
  const KwCallWatch& cw = s.call_watches[w];
  KwCallSlot& slot = th.call_slot[j];
  const auto fail = [&rec](long err) {
    rec.status = err == -ENOSPC ? kKwCallNoSlot : kKwCallError;
    rec.error = static_cast<int32_t>(-err);
  };
  if (slot.fd_plus1 == 0) {
    perf_event_attr open = CallAttr(c, cw, addr, /*disabled=*/true);
    const long fd = Sys(SYS_perf_event_open, Arg(&open), 0, -1, -1, PERF_FLAG_FD_CLOEXEC);
    if (fd < 0) {
      fail(fd);
      return;
    }
    const uint64_t size = (uint64_t{c.call_ring_pages} + 1) * kPage;
    const long m =
        Sys6(SYS_mmap, 0, static_cast<long>(size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m < 0 && m > -4096) {
      Sys(SYS_close, fd);
      fail(m);
      return;
    }
    slot.fd_plus1 = static_cast<int32_t>(fd) + 1;
    slot.ring = static_cast<uint64_t>(m);
    rec.new_fd = static_cast<int32_t>(fd);
    rec.ring = slot.ring;
  }
  rec.head = RingHead(slot.ring);  // disabled: the call's samples come after this
  perf_event_attr arm = CallAttr(c, cw, addr, /*disabled=*/false);
  if (const long r = Sys(SYS_ioctl, slot.fd_plus1 - 1, PERF_EVENT_IOC_MODIFY_ATTRIBUTES, Arg(&arm));
      r < 0) {
    fail(r);
    return;
  }
  slot.watch = w + 1;
  slot.addr = addr;
  slot.call = rec.call;
  slot.stack_slot = rec.stack_slot;
  rec.slot = j;
  rec.status = kKwCallArmed;
}

// The call's first KwCallWatch (`first`) and how many its function has, from its return probe.
bool FunctionWatches(const Session& s, const KwInstance& inst, uint32_t* first, uint32_t* count) {
  if (inst.call == 0 || inst.probe_index >= s.probe_capacity || s.call_watches == nullptr) {
    return false;
  }
  const uint32_t f = s.probes[inst.probe_index].call_watch;
  if (f == 0 || f - 1 >= s.call_watch_capacity) {
    return false;
  }
  uint32_t n = 0;
  while (f - 1 + n < s.call_watch_capacity && n < 31 && s.call_watches[f - 1 + n].first == f - 1 &&
         s.call_watches[f - 1 + n].bp_len != 0) {
    ++n;
  }
  *first = f - 1;
  *count = n;
  return true;
}

// Closes the breakpoints kwatch queued (threads that are gone).
__attribute__((noinline)) void CloseGone(Session& s) {
  KwControl& c = *s.ctl;
  const long bytes = static_cast<long>((uint64_t{c.call_ring_pages} + 1) * kPage);
  for (KwCloseEntry& e : c.closes) {
    const int32_t fd = e.fd_plus1.exchange(0, std::memory_order_acq_rel);
    if (fd <= 0) {
      continue;
    }
    Sys(SYS_munmap, static_cast<long>(e.ring), bytes);
    Sys(SYS_close, fd - 1);
    c.closes_pending.fetch_sub(1, std::memory_order_acq_rel);
  }
}

}  // namespace

uint32_t NumberCall(Session& s, const KwProbe& return_probe) {
  const uint32_t f = return_probe.call_watch;
  if (f == 0 || s.call_watches == nullptr || f - 1 >= s.call_watch_capacity) {
    return 0;
  }
  return s.call_watches[f - 1].calls.fetch_add(1, std::memory_order_relaxed) + 1;
}

void CallArm(Session& s, ThreadState& t, KwProbe& probe, const KwRegs& regs, uint64_t tsc) {
  const uint32_t w = probe.call_watch - 1;
  if (probe.call_watch == 0 || s.call_watches == nullptr || w >= s.call_watch_capacity) {
    return;
  }
  KwCallWatch& cw = s.call_watches[w];
  if (s.ctl->closes_pending.load(std::memory_order_relaxed) != 0) {
    CloseGone(s);
  }
  if (cw.first > w || w - cw.first >= 31 || !EnsureSlot(s, t)) {
    Bump(cw.missed);
    return;
  }
  KwThread& th = *t.thread;
  KwInstance* inst = nullptr;
  for (uint32_t k = th.instances; k-- > 0;) {
    if (th.instance[k].probe_index == cw.function && th.instance[k].call != 0) {
      inst = &th.instance[k];
      break;
    }
  }
  if (inst == nullptr || (inst->looked & kKwLookedEnded) != 0) {
    Bump(cw.missed);  // not in a tracked call, or its watches ended at --until already
    return;
  }
  const uint32_t bit = 1U << (w - cw.first);
  if ((inst->looked & bit) != 0) {
    return;  // looked up already: the point runs again in the same call
  }
  inst->looked |= bit;
  KwCallRecord rec{};
  rec.watch = w;
  rec.call = inst->call;
  rec.new_fd = -1;
  rec.slot = kKwCallSlots;
  rec.stack_slot = inst->stack_slot;
  // The fetch program leaves the address as argument 0.
  alignas(8) std::array<uint8_t, 64> out{};
  uint16_t flags = 0;
  const uint32_t used = RunFetch(s, probe, regs, nullptr, out.data(), out.size(), &flags);
  const auto* h = reinterpret_cast<const KwArgHeader*>(out.data());
  uint64_t addr = 0;
  if (used >= sizeof(KwArgHeader) + 8 && h->status == kKwArgOk && h->len >= 8) {
    addr = *reinterpret_cast<const uint64_t*>(out.data() + sizeof(KwArgHeader));
  }
  rec.addr = addr;
  if (addr < 4096) {
    rec.status = kKwCallNull;  // 0, or a member of a NULL pointer
  } else if (addr % cw.bp_len != 0) {
    rec.status = kKwCallUnaligned;
  } else {
    rec.status = kKwCallNoSlot;
    for (uint32_t j = 0; j < kKwCallSlots; ++j) {
      if (th.call_slot[j].watch == 0) {
        ArmSlot(s, th, j, w, addr, rec);
        break;
      }
    }
  }
  if (!WriteCallRecord(s, t, kKwRecordCallArm, probe.addr, tsc, rec)) {
    Bump(cw.lost);
  }
}

void CallEnded(Session& s, ThreadState& t, KwInstance& inst, uint32_t how, uint64_t tsc) {
  uint32_t first = 0;
  uint32_t count = 0;
  if ((inst.looked & kKwLookedEnded) != 0 || t.thread == nullptr ||
      !FunctionWatches(s, inst, &first, &count)) {
    return;
  }
  KwThread& th = *t.thread;
  const uint64_t ip = s.probes[inst.probe_index].addr;
  for (uint32_t i = 0; i < count; ++i) {
    KwCallRecord rec{};
    rec.watch = first + i;
    rec.call = inst.call;
    rec.new_fd = -1;
    rec.slot = kKwCallSlots;
    rec.stack_slot = inst.stack_slot;
    rec.status = static_cast<int32_t>(how);
    if ((inst.looked & (1U << i)) == 0) {
      rec.status = kKwCallNotLooked;
    } else {
      for (uint32_t j = 0; j < kKwCallSlots; ++j) {
        KwCallSlot& slot = th.call_slot[j];
        if (slot.watch != first + i + 1 || slot.call != inst.call ||
            slot.stack_slot != inst.stack_slot) {
          continue;
        }
        const long r = Sys(SYS_ioctl, slot.fd_plus1 - 1, PERF_EVENT_IOC_DISABLE, 0);
        rec.error = r < 0 ? static_cast<int32_t>(-r) : 0;
        rec.head = RingHead(slot.ring);  // disabled: every sample of the call is before this
        rec.slot = j;
        rec.addr = slot.addr;
        CopySamples(s, t, slot, rec, rec.head, ip, tsc);
        slot.watch = 0;
        break;
      }
    }
    if (!WriteCallRecord(s, t, kKwRecordCallEnd, ip, tsc, rec)) {
      Bump(s.call_watches[first + i].lost);
    }
  }
  inst.looked |= kKwLookedEnded;
}

void CallUntil(Session& s, ThreadState& t, KwProbe& probe, uint64_t tsc) {
  const uint32_t w = probe.call_watch - 1;
  if (probe.call_watch == 0 || s.call_watches == nullptr || w >= s.call_watch_capacity ||
      t.thread == nullptr) {
    return;
  }
  const uint32_t function = s.call_watches[w].function;
  KwThread& th = *t.thread;
  for (uint32_t k = th.instances; k-- > 0;) {
    if (th.instance[k].probe_index == function && th.instance[k].call != 0) {
      CallEnded(s, t, th.instance[k], kKwCallUntil, tsc);
      return;
    }
  }
}

void DisableCallSlots(Session& s) {
  if (s.call_watches == nullptr) {
    return;
  }
  for (uint32_t i = 0; i < s.thread_capacity; ++i) {
    KwThread& th = s.threads[i];
    if (th.pid != g_pid) {
      continue;
    }
    for (KwCallSlot& slot : th.call_slot) {
      if (slot.fd_plus1 > 0 && slot.watch != 0) {
        Sys(SYS_ioctl, slot.fd_plus1 - 1, PERF_EVENT_IOC_DISABLE, 0);
      }
    }
  }
}

}  // namespace kwatch::agent
