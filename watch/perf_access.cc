#include "watch/perf_access.h"

#include <algorithm>
#include <span>

#include "watch/perf_util.h"

namespace kwatch::watch {

const TrapDecoder::Entry& TrapDecoder::EntryFor(core::RemoteAddr trap_ip) {
  auto [it, inserted] = cache_.try_emplace(trap_ip.value);
  if (!inserted) {
    return it->second;
  }
  ++stats_.decodes;
  Entry& e = it->second;
  const core::symbols::AccessSite& site = symbolizer_.SiteForTrap(trap_ip);
  e.ip = site.ip;
  e.exact_ip = site.exact && site.ip != trap_ip;
  e.writes = site.exact && site.writes;
  if (e.exact_ip) {
    const size_t n = std::min<size_t>(trap_ip - site.ip, site.code.size());
    if (auto plan =
            core::x86::PlanAccess(std::span<const uint8_t>(site.code.data(), n), site.ip.value);
        plan.ok() && plan->length == n) {
      e.plan = *plan;
      e.needs_regs = e.plan.address == core::x86::AccessPlan::Address::kFromRegisters ||
                     e.plan.value == core::x86::AccessPlan::Value::kRegister;
    }
  }
  return e;
}

SampledAccess TrapDecoder::Resolve(const PerfSample& sample) {
  ++stats_.samples;
  const Entry& e = EntryFor(core::RemoteAddr{sample.ip});
  SampledAccess out;
  out.ip = e.ip;
  out.exact_ip = e.exact_ip;
  out.writes = e.writes;
  user_regs_struct regs{};
  const user_regs_struct* after = nullptr;
  // The registers must be those of this trap: the kernel samples them at the #DB, after the
  // instruction, so their rip is the trap address.
  if (e.needs_regs && !sample.user_regs.empty() &&
      LoadPerfUserRegs(sample.user_regs, regs_mask_, regs) && regs.rip == sample.ip) {
    after = &regs;
  }
  out.access = core::x86::EvaluateAccess(e.plan, after);
  stats_.exact_addresses += out.access.addr_known ? 1 : 0;
  stats_.exact_values += out.access.value_known ? 1 : 0;
  return out;
}

core::AccessEvent SampleEvent(const PerfSample& s) {
  core::AccessEvent ev;
  ev.time_ns = s.time;
  ev.pid = static_cast<pid_t>(s.pid);
  ev.tid = static_cast<pid_t>(s.tid);
  ev.cpu = s.cpu;
  ev.trap_ip = core::RemoteAddr{s.ip};
  return ev;
}

TouchedBytes Touched(const SampledAccess& a, uint64_t lo, uint64_t hi) {
  TouchedBytes t;
  t.lo = lo;
  t.hi = hi;
  const core::x86::RegisterAccess& r = a.access;
  // The hardware says the access touched the range: bytes that miss it mean the decoding was
  // wrong for this trap, and only the range is known.
  if (r.addr_known && r.size > 0 && r.addr < hi && r.addr + r.size > lo) {
    t.op_known = true;
    t.op_addr = r.addr;
    t.lo = std::max(lo, r.addr);
    t.hi = std::min(hi, r.addr + r.size);
    if (r.value_known) {
      t.value = r.value;
    }
  } else if (!r.addr_known && r.value_known && r.size == hi - lo) {
    // The address is lost (`mov 0x10(%rax),%rax` overwrote its base) but the value is in the
    // register, and an access as wide as the range the hardware says it touched is that range
    // (a breakpoint's range is aligned to its size, as compilers align scalars).
    t.op_known = true;
    t.op_addr = lo;
    t.value = r.value;
  }
  return t;
}

void SetWatchedPart(core::AccessEvent& e, const TouchedBytes& t, uint64_t from, uint64_t to) {
  e.addr = core::RemoteAddr{from};
  e.len = static_cast<uint32_t>(to - from);
  e.access_addr = e.addr;
  e.access_size = t.op_known ? e.len : 0;
  if (t.value.has_value()) {
    // The watched part of the access: bytes [from, to) of [op_addr, op_addr + size).
    const uint64_t v = *t.value >> (8 * (from - t.op_addr));
    e.value = e.len >= 8 ? v : v & ((uint64_t{1} << (8 * e.len)) - 1);
    e.value_exact = true;
  }
}

}  // namespace kwatch::watch
