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

}  // namespace kwatch::watch
