#pragma once

// `kwatch probe --agg`: what bpftrace's maps and SystemTap's statistics give, over a probe
// session's hits: count(), sum(x), min(x), max(x), avg(x), hist(x) (power-of-two buckets),
// lhist(x, MIN, MAX, STEP), each optionally `by KEY[,KEY...]` (tid, pid, cpu, comm, or an
// argument), each on every probe or on one (`EVENT:` prefix). An Aggregator is a HitSink behind
// the filter: it sees the hits the session takes.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/symbols/symbolizer.h"
#include "watch/condition.h"
#include "watch/probe/hit_sink.h"
#include "watch/probe/probe_set.h"

namespace kwatch::watch::probe {

struct AggregationSpec {
  enum class Func : uint8_t { kCount, kSum, kMin, kMax, kAvg, kHist, kLhist };
  std::string text;   // as written
  std::string event;  // EVENT: prefix, "" for every probe
  Func func = Func::kCount;
  std::string value;              // what is aggregated ("" for count())
  int64_t low = 0;                // lhist: MIN
  int64_t high = 0;               // lhist: MAX
  int64_t step = 1;               // lhist: STEP
  std::vector<std::string> keys;  // `by` names, in order
  // "hist(n)", "lhist(n, 0, 100, 10)", "count() by tid,comm": as JSON's "agg"
  std::string call;
};

// The key of the hit's user stack (--stack's frames), in the folded form flame-graph tools
// read: "main;run;tick", outermost first, function names ("0x..." without a symbol).
inline constexpr std::string_view kUstack = "ustack";

// Whether any of `specs` is keyed by ustack (the session must capture stacks).
bool UsesStacks(const std::vector<AggregationSpec>& specs);

// Parses `text` ("[EVENT:]FUNC(ARGS) [by KEY[,KEY]]"). InvalidArgument with the column and a
// caret: "--agg 'hist(x': expected ')' at column 7".
absl::StatusOr<AggregationSpec> ParseAggregation(const std::string& text);

// The names aggregations read that a probe may have to fetch (values and keys but tid, pid,
// cpu), each with the event it is for ("" for every probe): ResolveProbes' also_fetch.
std::vector<FetchFor> NamesToFetch(const std::vector<AggregationSpec>& specs);

// One histogram bucket: values in [low, high); nullopt low is "below" (negative values for
// hist, values under MIN for lhist), nullopt high "MAX and above" (lhist).
struct HistBucket {
  std::optional<int64_t> low;
  std::optional<int64_t> high;
  uint64_t count = 0;
};

// One key's accumulation.
struct AggregateValue {
  uint64_t count = 0;  // hits with a value
  // As the value's type reads (signed or unsigned), wrapping modulo 2^64.
  uint64_t sum = 0;
  uint64_t min = 0;
  uint64_t max = 0;
  std::map<int, uint64_t> buckets;  // by bucket index (Aggregator::Bucket)
};

// One aggregation on one probe.
struct AggregateTable {
  const ProbeDef* probe = nullptr;
  const AggregationSpec* spec = nullptr;
  bool is_signed = true;  // how the value reads
  // The key's parts, by name, as the hits show them ("tid" -> "1234", "comm" -> "\"prog\"").
  using Key = std::vector<std::pair<std::string, std::string>>;
  std::map<Key, AggregateValue> rows;
  uint64_t no_value = 0;  // hits whose value (or a key) could not be read: not aggregated
  // The agent backend: whether the rows are the target's own (watch/probe/agent_aggregation.h)
  // or, when kwatch aggregated the hits it received, why the target could not.
  bool in_target = false;
  std::string in_kwatch_why;
  uint64_t no_row = 0;  // in the target: hits of a new key when every row was taken

  // The value a row shows for count/sum/min/max (avg: AverageOf).
  uint64_t Scalar(const AggregateValue& v) const;
  double AverageOf(const AggregateValue& v) const;
  // The buckets of a hist or lhist row, in order, empty ones between the first and the last
  // included (as bpftrace prints them).
  std::vector<HistBucket> Buckets(const AggregateValue& v) const;
};

class Aggregator final : public HitSink {
 public:
  // InvalidArgument for an EVENT that names no probe, a value or key a probe cannot give (with
  // what it has), a string value summed.
  static absl::StatusOr<std::unique_ptr<Aggregator>> Make(const std::vector<ProbeDef>& probes,
                                                          std::vector<AggregationSpec> specs);

  bool Add(const ProbeHit& hit) override;
  // Names the frames of ustack keys (null: hex addresses).
  void SetLocate(std::function<core::symbols::CodeLocation(core::RemoteAddr)> locate) {
    locate_ = std::move(locate);
  }

  // In the order of the specs, then of the probes.
  const std::vector<AggregateTable>& tables() const { return tables_; }

  // What a table reads from each hit.
  struct Binding {
    size_t table = 0;
    int value_arg = -1;         // index in the hit's args; -1: count() or a builtin
    std::string value_builtin;  // tid, pid, cpu
    ConditionVariable::Kind kind = ConditionVariable::Kind::kSigned;
    std::vector<int> key_args;  // per key: index in args, or -1 for a builtin
  };
  const Binding& binding(size_t table) const;

  // A table the backend accumulates itself (the agent, in the target): Add leaves it alone and
  // `read` sets its rows and counters from the backend's at each Refresh.
  using TableReader = std::function<void(AggregateTable&)>;
  void TakeOver(size_t table, TableReader read);
  // A table kwatch accumulates on the agent backend, and why the target could not.
  void KeepInKwatch(size_t table, std::string why);
  // Reads the tables taken over (before printing them).
  void Refresh();
  // Reads them a last time and forgets the readers (the backend is going).
  void Release();

 private:
  Aggregator() = default;
  std::string FoldedStack(const std::vector<core::RemoteAddr>& stack) const;
  static void Accumulate(AggregateTable& t, AggregateValue& v, uint64_t value);

  std::vector<AggregationSpec> specs_;
  std::vector<AggregateTable> tables_;
  std::map<uint32_t, std::vector<Binding>> by_probe_;  // ProbeDef::id -> its aggregations
  AggregateTable::Key key_;                            // scratch
  std::map<size_t, TableReader> readers_;              // tables taken over
  std::function<core::symbols::CodeLocation(core::RemoteAddr)> locate_;
};

}  // namespace kwatch::watch::probe
