#pragma once

// A probe's `if COND` as the agent's filter program (agent/abi.h "Filter programs"): the
// condition runs inside the target, before the hit's record is written, so that a hit it
// rejects costs no record, no ring space and nothing in kwatch, and a thread hitting the probe
// flat out is tested hit by hit (a full ring loses only matching hits, counted).
//
// What the agent evaluates: the condition's integer arithmetic and comparisons (every operator
// of watch/condition.h), arguments whose value the agent computes whole (registers, memory
// through pointers, bitfields: core::probe::AgentFilterValue), tid and pid (when the target
// shares kwatch's pid namespace). What stays in kwatch, with the reason: string comparisons
// (comm, :string arguments), cpu, $duration, floats, values kwatch finishes from the record.

#include <cstdint>
#include <string>
#include <vector>

#include "agent/abi.h"
#include "watch/probe/probe_set.h"

namespace kwatch::watch::probe {

struct AgentFilter {
  std::vector<agent::KwFetchOp> ops;  // ends with kKwFilterEnd; empty: kwatch evaluates it
  std::string in_kwatch_why;          // with no ops: why the target cannot evaluate it
};

// Compiles `def`'s condition (none: no ops, no reason) for a target where the file's load bias
// is `load_bias`. `ids_as_shown`: the target's tids and pids are kwatch's (no pid namespace
// between them), so `tid` and `pid` compare as the user reads them.
AgentFilter CompileAgentFilter(const ProbeDef& def, uint64_t load_bias, bool ids_as_shown);

}  // namespace kwatch::watch::probe
