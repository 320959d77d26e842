#include "watch/probe/engine_probes.h"

#include <sys/ptrace.h>
#include <sys/user.h>

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kwatch::watch::probe {

core::store::ProbeArgs FetchProbeArgs(const ProbeDef& def, core::probe::FetchContext fc) {
  user_fpregs_struct fp{};
  if (def.needs_fpregs && fc.tid > 0 && ::ptrace(PTRACE_GETFPREGS, fc.tid, nullptr, &fp) == 0) {
    fc.fpregs = &fp;
  }
  core::store::ProbeArgs args;
  args.reserve(def.args.size());
  for (const core::probe::CompiledArg& a : def.args) {
    absl::StatusOr<std::string> v = core::probe::Evaluate(a, fc);
    args.emplace_back(a.name,
                      v.ok() ? *std::move(v) : absl::StrCat("<error: ", v.status().message(), ">"));
  }
  return args;
}

ProbeHit EngineHit(const ProbeDef& def, const core::probe::ProbeContext& ctx, uint64_t load_bias) {
  ProbeHit hit;
  hit.time_ns = ctx.time_ns;
  hit.pid = ctx.process.pid();
  hit.tid = ctx.tid;
  hit.probe = &def;
  hit.ip = ctx.addr;
  hit.return_address = ctx.return_address;
  const core::ptrace::Process& p = ctx.process;
  core::probe::FetchContext fc;
  fc.regs = &ctx.regs;
  fc.load_bias = load_bias;
  fc.read = [&p](core::RemoteAddr a, std::span<uint8_t> out) { return p.ReadMemory(a, out); };
  fc.at_return = ctx.is_return;
  fc.tid = ctx.tid;
  hit.args = FetchProbeArgs(def, std::move(fc));
  return hit;
}

absl::StatusOr<std::map<uint32_t, core::probe::ProbeId>> RegisterProbes(
    core::probe::Int3Engine& engine, const ProbeSet& set, uint64_t load_bias, uint32_t maxactive,
    const EngineHitHandler& on_hit) {
  std::map<uint32_t, core::probe::ProbeId> ids;
  for (const ProbeDef& def : set.probes) {
    const core::RemoteAddr addr{def.point.vaddr.value + load_bias};
    core::probe::ProbeHandlers h;
    h.pre = [on_hit, &def](const core::probe::ProbeContext& ctx) { on_hit(def, ctx); };
    absl::StatusOr<core::probe::ProbeId> id;
    if (def.point.is_return) {
      core::probe::ReturnProbeOptions ro;
      ro.maxactive = maxactive;
      id = engine.RegisterReturn(addr, std::move(h), ro);
    } else {
      id = engine.Register(addr, std::move(h));
    }
    if (!id.ok()) {
      for (const auto& [def_id, done] : ids) {
        (void)engine.Unregister(done);
      }
      return absl::Status(id.status().code(),
                          absl::StrCat("probe ", def.point.event, " (", def.Location(),
                                       "): ", id.status().message()));
    }
    ids[def.id] = *id;
  }
  return ids;
}

void AddEngineStats(const core::probe::Int3Engine& engine,
                    const std::map<uint32_t, core::probe::ProbeId>& ids,
                    std::map<uint32_t, ProbeEndStats>& stats) {
  for (const auto& [def_id, id] : ids) {
    if (absl::StatusOr<core::probe::ProbeStats> st = engine.Stats(id); st.ok()) {
      ProbeEndStats& e = stats[def_id];
      e.misses += st->misses;
      e.nmissed += st->nmissed;
      e.abandoned += st->abandoned;
      e.faults += st->faults;
    }
  }
}

}  // namespace kwatch::watch::probe
