#pragma once

// What decides which hits of a probe session are taken: each probe's `if COND`, gdb's ignore
// count (--skip) and a count per probe (-c EVENT:N). A HitSink in front of the
// session's fan-out (tally, recorder, printer): a hit it leaves out reaches none of them, and a
// hit it passes has its hidden arguments (those fetched for the condition only) taken off.

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "watch/condition.h"
#include "watch/probe/hit_sink.h"
#include "watch/probe/probe_set.h"

namespace kwatch::watch::probe {

// A return probe's time since the entry of its call (ProbeDef::duration), in ns.
inline constexpr std::string_view kDurationName = "$duration";
// How a hit shows $duration: the ns, or "(no entry)" for a call entered before the session
// (or whose entry hit was lost).
std::string DurationText(std::optional<uint64_t> ns);

// The names a hit gives a condition besides its arguments: tid, pid, cpu.
bool IsHitBuiltin(const std::string& name);

// How a condition reads an argument of type `t`; nullopt for floats.
std::optional<ConditionVariable::Kind> ConditionKindOf(const core::probe::ArgType& t);

// An integer as an argument's text shows it (decimal, -decimal, 0x hex) read as `kind`; nullopt
// for "(fault)", "(not sampled)" and errors.
std::optional<uint64_t> ArgNumber(std::string_view shown_text, ConditionVariable::Kind kind);

// How `def`'s condition names its arguments: variable i is def.args[i]. InvalidArgument when
// the condition uses a float argument (conditions compare integers and strings).
absl::StatusOr<ConditionOptions> ConditionOptionsFor(const ProbeDef& def);

// A probe's EVENT:N (or N for every probe) from the command line: --skip, -c.
struct PerProbeCounts {
  std::optional<uint64_t> every;          // N: each probe
  std::map<std::string, uint64_t> event;  // EVENT:N
};

// Parses "N" or "EVENT:N" into `counts`; `option` names the option in errors.
absl::Status ParsePerProbeCount(const std::string& text, const std::string& option,
                                PerProbeCounts& counts);

struct HitFilterOptions {
  PerProbeCounts skip;   // --skip: matching hits ignored first (gdb's ignore count)
  PerProbeCounts count;  // -c EVENT:N: matching hits taken, then the probe's hits are not
  bool stop_on = false;  // --stop-on: the first hit taken ends the session
};

// What the filter did with one probe's hits.
struct ProbeFilterStats {
  uint64_t seen = 0;              // hits the backend delivered
  uint64_t matched = 0;           // of those, the condition held (every hit without a condition)
  uint64_t skipped = 0;           // matched hits ignored by --skip
  uint64_t over_count = 0;        // matched hits after the probe's -c EVENT:N was reached
  uint64_t unpaired_entries = 0;  // $duration: entries whose call never returned (longjmp)
  std::optional<ConditionStats> condition;  // the condition's own counters
};

// The filter's counters of a probe as the summary shows them: when its condition ran in the
// target (ProbeEndStats::target_filter), seen and matched are the target's (every hit tested,
// records lost in full rings included) and the condition's counters the target's; --skip and
// -c's stay the filter's.
ProbeFilterStats SummaryFilterStats(ProbeFilterStats filter, const ProbeEndStats& end);

// Not thread-safe. Made before the session starts (its errors come first), then given the
// sink it passes hits to (Attach) before the first hit; that sink is the caller's and outlives
// the filter, as `probes` do.
class HitFilter final : public HitSink {
 public:
  // InvalidArgument for an EVENT that names no probe, or a condition that does not compile.
  static absl::StatusOr<std::unique_ptr<HitFilter>> Make(const std::vector<ProbeDef>& probes,
                                                         HitFilterOptions opts);
  void Attach(HitSink& next) { next_ = &next; }
  // Also gives `also` every hit `next` took, hidden arguments included (the aggregations read
  // them).
  void AlsoGiveTaken(HitSink& also) { also_ = &also; }

  void OnStart() override { next_->OnStart(); }
  // Passes `hit` on when it matches, is past its skip count and under its count. Always true:
  // a hit left out was still taken (the backend goes on with the next one).
  bool Add(const ProbeHit& hit) override;
  bool done() const override;
  std::string done_reason() const override;
  void Flush() override { next_->Flush(); }
  absl::Status status() const override { return next_->status(); }
  void OnNote(const ProbeNote& note) override { next_->OnNote(note); }

  // By ProbeDef::id (every probe has an entry).
  ProbeFilterStats stats(uint32_t probe_id) const;
  // Whether any probe has a condition, --skip or a count (the summary then shows the columns).
  bool filters() const { return filters_; }

 private:
  struct PerProbe {
    const ProbeDef* def = nullptr;
    std::optional<Condition> condition;
    std::vector<ConditionVariable::Kind> kinds;  // of each argument, as the condition reads it
    uint64_t skip = 0;
    std::optional<uint64_t> count;
    uint64_t taken = 0;
    ProbeFilterStats stats;
  };

  // A thread's calls of a return probe with $duration, entered and not returned yet.
  struct CallKey {
    pid_t pid;
    pid_t tid;
    uint32_t probe;
    bool operator<(const CallKey& o) const {
      return std::tie(pid, tid, probe) < std::tie(o.pid, o.tid, o.probe);
    }
  };
  struct Entry {
    uint64_t time_ns;
    uint64_t sp;
  };

  explicit HitFilter(HitFilterOptions opts) : opts_(std::move(opts)) {}
  bool Matches(PerProbe& p, const ProbeHit& hit, std::optional<uint64_t> duration);
  // An entry hit of an internal probe: kept. A return hit: its $duration (nullopt without
  // its entry).
  std::optional<uint64_t> Pair(const ProbeHit& hit);

  HitFilterOptions opts_;
  HitSink* next_ = nullptr;
  HitSink* also_ = nullptr;
  std::optional<ProbeHit> stopped_at_;  // --stop-on's hit
  std::map<uint32_t, PerProbe> per_probe_;
  std::map<CallKey, std::vector<Entry>> calls_;
  bool filters_ = false;
  // Scratch for Matches (no allocation per hit once grown).
  std::vector<std::optional<uint64_t>> numbers_;
  std::vector<std::optional<std::string_view>> strings_;
  std::vector<std::string> string_values_;
};

}  // namespace kwatch::watch::probe
