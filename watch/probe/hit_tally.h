#pragma once

// What the summary of a probe session counts: hits per probe, the values each argument took,
// and the session's hit limit (--count). A HitSink, first in the session's fan-out
// (watch/probe/hit_fanout.h): a hit it does not take (over the limit) goes to no other sink.

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "watch/probe/hit_sink.h"
#include "watch/probe/probe_set.h"

namespace kwatch::watch::probe {

// Counts hits and argument values per probe, and holds the hit limit. Not thread-safe.
class HitTally final : public HitSink {
 public:
  // The values one argument took. At most kMaxValues distinct values are kept; hits with a
  // value beyond them are only counted in `other`.
  struct ArgTally {
    std::string name;
    absl::flat_hash_map<std::string, uint64_t> values;  // formatted value -> hits
    uint64_t other = 0;
  };
  static constexpr size_t kMaxValues = 1024;

  // `limit`: take this many hits, then no more (0: no limit).
  HitTally(const std::vector<ProbeDef>& probes, uint64_t limit);

  // Counts `hit` unless the limit is reached; returns whether it was counted.
  bool Add(const ProbeHit& hit) override;
  bool done() const override { return limit_ > 0 && taken_ >= limit_; }

  // Hits counted, of every probe.
  uint64_t taken() const { return taken_; }
  uint64_t hits(uint32_t probe_id) const;
  // The arguments of probe `probe_id`, in the order of its spec (empty before its first hit).
  const std::vector<ArgTally>& args(uint32_t probe_id) const;

  // The values of `t`, most frequent first (ties in value order: byte order of the text).
  static std::vector<std::pair<std::string, uint64_t>> Ranked(const ArgTally& t);

 private:
  struct PerProbe {
    uint64_t hits = 0;
    std::vector<ArgTally> args;
  };

  uint64_t limit_;
  uint64_t taken_ = 0;
  std::map<uint32_t, PerProbe> per_probe_;  // by ProbeDef::id
};

}  // namespace kwatch::watch::probe
