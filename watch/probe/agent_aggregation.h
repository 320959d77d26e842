#pragma once

// `kwatch probe --agg` accumulated inside the target by the agent (agent/abi.h "Aggregations"):
// each hit a probe takes updates its aggregations' rows in the shared memory before its record
// is written, so that an aggregation counts every hit, at any rate, whether the hit's record
// reached kwatch or was lost in a full ring.
//
// What the target accumulates: count(), sum, min, max, avg, hist and lhist of an integer the
// agent computes whole (an argument as core::probe::AgentFilterValue reads it, tid, pid), by
// nothing or by one key of that kind. What stays in kwatch (on the hits it receives), with the
// reason: cpu and comm, ustack, $duration, several keys, strings and values kwatch finishes
// from the record, bitfield keys; and every aggregation when --skip, -c EVENT:N, --count or
// --stop-on decide in kwatch which hits are taken.

#include <cstdint>
#include <optional>
#include <string>

#include "watch/agent/tables.h"
#include "watch/probe/aggregation.h"

namespace kwatch::watch::probe {

// Rows of a keyed aggregation in the target (a new key beyond them is counted, not added).
inline constexpr uint32_t kAgentAggregateRows = 1024;
// The aggregations' area of a session with --agg: room for a dozen keyed histograms.
inline constexpr uint64_t kAgentAggregateBytes = 8ULL << 20;

// Table `table` of `agg` as the agent's aggregation for a target where the probe's file has
// load bias `load_bias`; `ids_as_shown`: the target's tids and pids are kwatch's. Nullopt, with
// `why`, when the target cannot accumulate it.
std::optional<watch::agent::AggregateEntry> CompileAgentAggregate(const Aggregator& agg,
                                                                  size_t table, uint64_t load_bias,
                                                                  bool ids_as_shown,
                                                                  std::string* why);

// Sets `table`'s rows and counters from the agent's aggregation `handle` (keys as the hits
// show them; a key in two rows is added together). `b`: the table's binding.
void ReadAgentAggregate(const watch::agent::ShmTables& tables, uint32_t handle,
                        const Aggregator::Binding& b, AggregateTable& table);

}  // namespace kwatch::watch::probe
