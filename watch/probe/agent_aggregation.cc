#include "watch/probe/agent_aggregation.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/probe/agent_fetch.h"
#include "core/probe/fetch_format.h"
#include "watch/probe/hit_filter.h"

namespace kwatch::watch::probe {

namespace {

namespace ka = kwatch::agent;
using Func = AggregationSpec::Func;

ka::KwFetchOp FilterOp(uint16_t op) {
  return ka::KwFetchOp{op, 0, 0, 0};
}

// The program leaving tid or pid on top; nullopt (why) when the target's differ from kwatch's.
std::optional<std::vector<ka::KwFetchOp>> IdProgram(const std::string& name, bool ids_as_shown,
                                                    std::string* why) {
  if (name == "cpu") {
    *why = "the agent does not see the cpu";
    return std::nullopt;
  }
  if (!ids_as_shown) {
    *why = "the target's tids and pids are its pid namespace's, not kwatch's";
    return std::nullopt;
  }
  return std::vector<ka::KwFetchOp>{
      FilterOp(name == "tid" ? ka::kKwFilterPushTid : ka::kKwFilterPushPid),
      FilterOp(ka::kKwFilterEnd)};
}

// The program leaving argument `index`'s value on top.
std::optional<std::vector<ka::KwFetchOp>> ArgProgram(const ProbeDef& def, size_t index,
                                                     uint64_t load_bias, std::string* why) {
  if (index >= def.args.size()) {
    *why = "$duration pairs calls in kwatch";
    return std::nullopt;
  }
  std::optional<std::vector<ka::KwFetchOp>> ops =
      core::probe::AgentFilterValue(def.args[index], load_bias, def.point.is_return, why);
  if (ops.has_value()) {
    ops->push_back(FilterOp(ka::kKwFilterEnd));
  }
  return ops;
}

void Merge(AggregateValue& into, const AggregateValue& v, bool is_signed) {
  const auto less = [is_signed](uint64_t a, uint64_t b) {
    return is_signed ? static_cast<int64_t>(a) < static_cast<int64_t>(b) : a < b;
  };
  if (into.count == 0 || less(v.min, into.min)) {
    into.min = v.min;
  }
  if (into.count == 0 || less(into.max, v.max)) {
    into.max = v.max;
  }
  into.count += v.count;
  into.sum += v.sum;
  for (const auto& [i, n] : v.buckets) {
    into.buckets[i] += n;
  }
}

}  // namespace

std::optional<watch::agent::AggregateEntry> CompileAgentAggregate(const Aggregator& agg,
                                                                  size_t table, uint64_t load_bias,
                                                                  bool ids_as_shown,
                                                                  std::string* why) {
  const AggregateTable& t = agg.tables().at(table);
  const Aggregator::Binding& b = agg.binding(table);
  const AggregationSpec& spec = *t.spec;
  const ProbeDef& def = *t.probe;
  watch::agent::AggregateEntry e;
  watch::agent::AggregateEntry& h = e;
  h.flags = t.is_signed ? ka::kKwAggSigned : 0U;
  switch (spec.func) {
    case Func::kCount:
      h.func = ka::kKwAggCount;
      break;
    case Func::kSum:
    case Func::kMin:
    case Func::kMax:
    case Func::kAvg:
      h.func = ka::kKwAggStats;
      break;
    case Func::kHist:
      h.func = ka::kKwAggHist;
      h.buckets = 66;  // below 0, 0, then [2^(k-1), 2^k) for k = 1..64
      break;
    case Func::kLhist: {
      h.func = ka::kKwAggLhist;
      const int64_t n = (spec.high - spec.low + spec.step - 1) / spec.step;
      if (n <= 0 || n > 4096) {
        *why = absl::StrCat(n, " linear buckets (the target keeps at most 4096)");
        return std::nullopt;
      }
      h.buckets = static_cast<uint32_t>(n + 2);
      h.low = spec.low;
      h.high = spec.high;
      h.step = spec.step;
      break;
    }
  }
  if (spec.func != Func::kCount) {
    std::optional<std::vector<ka::KwFetchOp>> value =
        !b.value_builtin.empty() ? IdProgram(b.value_builtin, ids_as_shown, why)
        : b.value_arg >= 0       ? ArgProgram(def, static_cast<size_t>(b.value_arg), load_bias, why)
                                 : std::nullopt;
    if (!value.has_value()) {
      return std::nullopt;
    }
    e.value = *std::move(value);
  }
  h.row_capacity = 1;
  if (spec.keys.size() > 1) {
    *why = "it has several keys";
    return std::nullopt;
  }
  if (spec.keys.size() == 1) {
    const std::string& key = spec.keys[0];
    std::optional<std::vector<ka::KwFetchOp>> program;
    if (key == kUstack) {
      *why = "stacks are unwound in kwatch";
    } else if (key == "comm") {
      *why = "comm is a string";
    } else if (IsHitBuiltin(key)) {
      program = IdProgram(key, ids_as_shown, why);
    } else if (const int arg = b.key_args.at(0); arg >= 0 &&
                                                 static_cast<size_t>(arg) < def.args.size() &&
                                                 def.args[static_cast<size_t>(arg)].bit_size != 0) {
      *why = absl::StrCat("the key '", key, "' is a bitfield");
    } else {
      program = ArgProgram(def, static_cast<size_t>(std::max(arg, 0)), load_bias, why);
    }
    if (!program.has_value()) {
      return std::nullopt;
    }
    e.key = *std::move(program);
    h.row_capacity = kAgentAggregateRows;
  }
  return e;
}

void ReadAgentAggregate(const watch::agent::ShmTables& tables, uint32_t handle,
                        const Aggregator::Binding& b, AggregateTable& table) {
  const ka::KwAggregate& a = tables.aggregate(handle);
  const ProbeDef& def = *table.probe;
  const AggregationSpec& spec = *table.spec;
  table.rows.clear();
  table.no_value = a.no_value.load(std::memory_order_relaxed);
  table.no_row = a.no_row.load(std::memory_order_relaxed);
  for (const watch::agent::AggregateRowView& row : tables.AggregateRows(handle)) {
    AggregateTable::Key key;
    if (!spec.keys.empty()) {
      const std::string& name = spec.keys[0];
      const int arg = b.key_args.at(0);
      std::string text;
      if (row.key_faulted) {
        text = std::string{core::probe::kFetchFault};
      } else if (arg < 0) {
        text = absl::StrCat(static_cast<int64_t>(row.key));  // tid, pid
      } else {
        text = core::probe::FormatFetchScalar(def.args.at(static_cast<size_t>(arg)), row.key);
      }
      key.emplace_back(name, std::move(text));
    }
    AggregateValue v;
    v.count = row.count;
    if (a.func == ka::kKwAggCount) {  // as the Aggregator counts: a value of 1 per hit
      v.sum = row.count;
      v.min = 1;
      v.max = 1;
    } else {
      v.sum = row.sum;
      v.min = row.min;
      v.max = row.max;
    }
    for (size_t i = 0; i < row.buckets.size(); ++i) {
      if (row.buckets[i] > 0) {
        v.buckets[static_cast<int>(i) - 1] = row.buckets[i];  // word 0: Aggregator's -1
      }
    }
    if (v.count > 0) {
      Merge(table.rows[key], v, table.is_signed);
    }
  }
}

}  // namespace kwatch::watch::probe
