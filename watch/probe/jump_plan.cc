#include "watch/probe/jump_plan.h"

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"
#include "core/probe/trampoline.h"

namespace kwatch::watch::probe {

core::probe::JumpDecision PlanJumpAt(const core::symbols::Symbols* syms, core::RemoteAddr addr,
                                     const std::vector<core::RemoteAddr>& all) {
  core::probe::JumpDecision none;
  none.reason = "no function symbol with a size around it";
  if (syms == nullptr) {
    return none;
  }
  const std::optional<core::symbols::FunctionSymbol> fn = syms->FunctionAt(addr);
  if (!fn.has_value() || fn->size == 0) {
    return none;
  }
  std::vector<uint8_t> bytes(fn->size);
  if (absl::Status s = syms->ReadCode(fn->start, bytes); !s.ok()) {
    none.reason = absl::StrCat("the code of ", fn->name, " cannot be read: ", s.message());
    return none;
  }
  core::probe::JumpOptions jo;
  // The function's cold part (gcc's FUNC.cold) may branch back into it.
  std::vector<uint8_t> cold_bytes;
  if (std::optional<core::symbols::FunctionSymbol> cold = syms->FindFunction(fn->name + ".cold");
      cold.has_value() && cold->size > 0) {
    cold_bytes.resize(cold->size);
    if (syms->ReadCode(cold->start, cold_bytes).ok()) {
      jo.other_code.push_back(core::probe::FunctionCode{cold->name, cold->start, cold_bytes});
    }
  }
  for (core::RemoteAddr a : all) {
    if (a != addr) {
      jo.other_probes.push_back(a);
    }
  }
  jo.read_image = [syms](core::RemoteAddr a, std::span<uint8_t> out) {
    return syms->ReadCode(a, out);
  };
  return core::probe::PlanJumpProbe(core::probe::FunctionCode{fn->name, fn->start, bytes}, addr,
                                    jo);
}

absl::Status PatchJumpProbe(agent::Controller& ctl, core::ptrace::Process& proc,
                            const core::probe::JumpPlan& plan, uint32_t index,
                            core::RemoteAddr addr) {
  const core::RemoteAddr jump_entry{ctl.tables().control().jump_entry};
  std::optional<core::probe::Trampoline> built;
  KW_ASSIGN_OR_RETURN(
      const core::RemoteAddr at,
      ctl.PlaceCode(proc, addr, core::probe::kMaxTrampolineBytes,
                    [&](core::RemoteAddr where) -> absl::StatusOr<std::vector<uint8_t>> {
                      KW_ASSIGN_OR_RETURN(
                          core::probe::Trampoline t,
                          core::probe::BuildTrampoline(plan, where, index, jump_entry));
                      built = t;
                      return t.code;
                    }));
  KW_ASSIGN_OR_RETURN(const core::probe::JumpPatch patch, core::probe::BuildJumpPatch(plan, at));
  ctl.tables().probe(index).xol_addr = built->xol_addr().value;
  return ctl.Patch(proc, index, addr, patch.patched);
}

}  // namespace kwatch::watch::probe
