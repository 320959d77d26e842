#include "watch/probe/dry_run.h"

#include <memory>
#include <nlohmann/json.hpp>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/probe/agent_fetch.h"
#include "core/symbols/symbols.h"
#include "watch/probe/agent_filter.h"
#include "watch/probe/jump_plan.h"

namespace kwatch::watch::probe {

namespace {

using core::probe::AgentArgPlan;
using core::probe::CompiledArg;

// How the agent gets an argument, from its fetch plan.
std::string AgentFetchText(const AgentArgPlan& plan) {
  switch (plan.kind) {
    case AgentArgPlan::Kind::kBytes:
      return "copied by the agent at the hit";
    case AgentArgPlan::Kind::kString:
      return "string copied by the agent at the hit";
    case AgentArgPlan::Kind::kConstant:
      return "known before the hit";
    case AgentArgPlan::Kind::kExpression:
      return "parts copied at the hit, the DWARF expression finished by kwatch";
    case AgentArgPlan::Kind::kFallback:
      return absl::StrCat("registers and stack copied at the hit, evaluated by kwatch (",
                          plan.reason, ")");
  }
  return "";
}

// How the uprobe backend gets an argument: from the sample.
std::string UprobeFetchText(const CompiledArg& a) {
  switch (a.base) {
    case CompiledArg::Base::kRegister:
      return a.steps.empty() ? "from the sampled registers"
                             : "through memory: shown only where it lies in the sampled stack";
    case CompiledArg::Base::kComm:
      return "the thread's name, read by kwatch when the sample is read";
    default:
      return "from the sampled registers and stack (memory elsewhere shows (not sampled))";
  }
}

std::string PathName(const DryRunOptions& opts) {
  if (opts.backend == "uprobe" || opts.backend == "ptrace" || opts.backend == "hw") {
    return opts.backend;
  }
  return "agent";
}

}  // namespace

std::vector<ProbePlan> PlanProbes(const ProbeSet& set, const DryRunOptions& opts) {
  std::unique_ptr<core::symbols::Symbols> syms;
  if (absl::StatusOr<std::unique_ptr<core::symbols::Symbols>> s =
          core::symbols::Symbols::ForFile(set.path);
      s.ok()) {
    syms = *std::move(s);
  }
  std::vector<core::RemoteAddr> all;
  for (const ProbeDef& def : set.probes) {
    all.push_back(def.point.vaddr);
  }
  const std::string backend = PathName(opts);
  std::vector<ProbePlan> plans;
  std::vector<core::RemoteAddr> first_at;  // the agent chains probes at one address
  for (const ProbeDef& def : set.probes) {
    ProbePlan plan;
    plan.probe = &def;
    plan.path = backend;
    std::optional<core::probe::AgentFetchProgram> program;
    if (backend == "agent") {
      const bool chained =
          std::find(first_at.begin(), first_at.end(), def.point.vaddr) != first_at.end();
      first_at.push_back(def.point.vaddr);
      if (!opts.allow_jump) {
        plan.path = "int3";
        plan.why = "--no-jump";
      } else {
        const core::probe::JumpDecision d = PlanJumpAt(syms.get(), def.point.vaddr, all);
        if (d.plan.has_value()) {
          plan.path = "jump";
          plan.displaced = d.plan->insn_text;
        } else {
          plan.path = "int3";
          plan.why = d.reason;
        }
      }
      if (chained) {
        plan.displaced.clear();
        plan.why = "";
        plan.shared = true;
      }
      if (absl::StatusOr<core::probe::AgentFetchProgram> p =
              core::probe::CompileAgentFetch(def.args, 0);
          p.ok()) {
        program = *std::move(p);
      }
    }
    if (!def.condition.empty()) {
      plan.condition_in = "kwatch";
      if (backend == "agent") {
        // The target's ids are taken as kwatch's: a target in another pid namespace tests
        // conditions on tid and pid in kwatch (said when it runs).
        AgentFilter f = CompileAgentFilter(def, 0, true);
        plan.condition_in = f.ops.empty() ? "kwatch" : "target";
        plan.condition_why = std::move(f.in_kwatch_why);
      }
    }
    for (size_t i = 0; i < def.args.size(); ++i) {
      const CompiledArg& a = def.args[i];
      ProbePlan::Arg arg;
      arg.name = a.name;
      arg.type = a.type.Name();
      arg.hidden = i + def.hidden_args >= def.args.size();
      if (program.has_value() && i < program->args.size()) {
        arg.fetch = AgentFetchText(program->args[i]);
      } else if (backend == "uprobe") {
        arg.fetch = UprobeFetchText(a);
      } else {
        arg.fetch = "read by kwatch while the thread is stopped at the hit";
      }
      plan.args.push_back(std::move(arg));
    }
    plans.push_back(std::move(plan));
  }
  return plans;
}

std::string PlansText(const ProbeSet& set, const std::vector<ProbePlan>& plans,
                      const DryRunOptions& opts) {
  std::string out = absl::StrFormat(
      "kwatch probe --dry-run: %d probe%s in %s, %s backend%s; nothing was started or "
      "touched\n",
      plans.size(), plans.size() == 1 ? "" : "s", set.path, PathName(opts),
      opts.backend == "auto" ? " (auto: the ptrace backend if the agent cannot load)" : "");
  for (const ProbePlan& p : plans) {
    const ProbeDef& def = *p.probe;
    const std::string source =
        def.SourceLine().empty() ? "" : absl::StrCat(" (", def.SourceLine(), ")");
    absl::StrAppend(&out, "\n", def.point.event, "  ", def.Location(), source, " at 0x",
                    absl::Hex(def.point.vaddr.value), ": ", p.path);
    if (def.internal()) {
      absl::StrAppend(&out, "  [internal: the entry of a return probe, for $duration]");
    }
    absl::StrAppend(&out, "\n");
    if (p.shared) {
      absl::StrAppend(&out, "    runs in the patch of the probe before it at this address\n");
    }
    if (!p.displaced.empty()) {
      absl::StrAppend(&out, "    the jmp displaces: ", absl::StrJoin(p.displaced, "; "), "\n");
    }
    if (!p.why.empty()) {
      absl::StrAppend(&out, "    not jump: ", p.why, "\n");
    }
    if (!def.condition.empty()) {
      absl::StrAppend(&out, "    if ", def.condition, "  (tested in ",
                      p.condition_in == "target" ? "the target" : "kwatch",
                      p.condition_why.empty() ? "" : absl::StrCat(": ", p.condition_why), ")\n");
    }
    for (const ProbePlan::Arg& a : p.args) {
      absl::StrAppend(&out,
                      absl::StrFormat("    %-16s %-7s %s%s\n", a.name, a.type, a.fetch,
                                      a.hidden ? " [not shown: for the condition or --agg]" : ""));
    }
    if (def.duration_shown.has_value() || def.duration) {
      absl::StrAppend(&out, absl::StrFormat("    %-16s %-7s %s\n", "$duration", "u64",
                                            "ns since the entry of the same call"));
    }
  }
  return out;
}

std::string PlansJson(const std::vector<ProbePlan>& plans) {
  std::string out;
  for (const ProbePlan& p : plans) {
    const ProbeDef& def = *p.probe;
    nlohmann::ordered_json args = nlohmann::ordered_json::array();
    for (const ProbePlan::Arg& a : p.args) {
      args.push_back(
          {{"name", a.name}, {"type", a.type}, {"fetch", a.fetch}, {"hidden", a.hidden}});
    }
    nlohmann::ordered_json j = {
        {"type", "plan"},
        {"probe", def.id},
        {"event", def.point.event},
        {"location", def.Location()},
        {"file", def.point.file},
        {"line", def.point.line},
        {"address", absl::StrCat("0x", absl::Hex(def.point.vaddr.value))},
        {"path", p.path},
        {"path_reason", p.why},
        {"displaced", p.displaced},
        {"shared", p.shared},
        {"condition", def.condition.empty() ? nlohmann::ordered_json(nullptr)
                                            : nlohmann::ordered_json(def.condition)},
        {"condition_in", p.condition_in.empty() ? nlohmann::ordered_json(nullptr)
                                                : nlohmann::ordered_json(p.condition_in)},
        {"internal", def.internal()},
        {"args", args}};
    absl::StrAppend(&out, j.dump(), "\n");
  }
  return out;
}

}  // namespace kwatch::watch::probe
