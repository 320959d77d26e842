#pragma once

// `kwatch probe --dry-run`: where each probe would go, the path it would take and how its
// arguments would be fetched, decided from the probed file alone: no target is started,
// attached or touched.

#include <string>
#include <vector>

#include "watch/probe/probe_set.h"

namespace kwatch::watch::probe {

struct DryRunOptions {
  std::string backend = "auto";  // auto, agent, ptrace, uprobe, hw
  bool allow_jump = true;        // the agent's jump probes (false: --no-jump)
};

// One probe's plan.
struct ProbePlan {
  const ProbeDef* probe = nullptr;
  std::string path;                    // "jump", "int3", "ptrace", "uprobe", "hw"
  std::string why;                     // why not a faster path ("" when none)
  std::vector<std::string> displaced;  // jump: the instructions the jmp overwrites
  bool shared = false;  // the agent: runs in the patch of an earlier probe at its address
  // With a condition: "target" (the agent tests it before the record) or "kwatch", and why
  // kwatch when the backend is the agent.
  std::string condition_in;
  std::string condition_why;
  struct Arg {
    std::string name;
    std::string type;     // "s32", "string"...
    std::string fetch;    // how the backend gets it
    bool hidden = false;  // fetched for the condition or --agg only
  };
  std::vector<Arg> args;
};

// The plan of every probe of `set` (its internal ones, for $duration, included).
std::vector<ProbePlan> PlanProbes(const ProbeSet& set, const DryRunOptions& opts);

// As text, one block per probe; as JSON lines ({"type":"plan",...}).
std::string PlansText(const ProbeSet& set, const std::vector<ProbePlan>& plans,
                      const DryRunOptions& opts);
std::string PlansJson(const std::vector<ProbePlan>& plans);

}  // namespace kwatch::watch::probe
