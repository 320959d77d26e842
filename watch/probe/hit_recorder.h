#pragma once

// The recording of a probe session (-o): its probes, then every hit with the code site it hit,
// into a trace store (core/store/trace_writer.h). Closing the recording (TraceWriter::Finish)
// is the caller's, once the session has ended.

#include <cstdint>
#include <functional>
#include <map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "core/store/trace_writer.h"
#include "core/symbols/symbolizer.h"
#include "watch/probe/hit_sink.h"
#include "watch/probe/probe_set.h"

namespace kwatch::watch::probe {

// Stores the probes in a recording (one ProbeRecord per ProbeDef; addresses absolute when
// `load_bias` is known, link-time when it is 0).
absl::Status AddProbes(core::store::TraceWriter& writer, const std::vector<ProbeDef>& probes,
                       uint64_t load_bias);

// A HitSink that records each hit it is given (its site once, the first time an address is
// hit) and commits them at each Flush. Takes every hit: the hit limit is the tally's. The first
// failure is sticky: later hits are dropped, and status() gives it as the session's stop
// reason ("recording failed: ..."). The writer holds the probes (AddProbes) and outlives the
// recorder. Not thread-safe.
class HitRecorder final : public HitSink {
 public:
  explicit HitRecorder(core::store::TraceWriter& writer) : writer_(writer) {}

  bool Add(const ProbeHit& hit) override;
  // Commits the hits recorded since the last Flush.
  void Flush() override;
  absl::Status status() const override;

  // The first failure, as the writer gave it; OK while recording works.
  const absl::Status& error() const { return error_; }

  // Names the frames of the hits' stacks (--stack) as they are first recorded (null: hex only).
  void SetLocate(std::function<core::symbols::CodeLocation(core::RemoteAddr)> locate) {
    locate_ = std::move(locate);
  }

 private:
  // The id of `stack` in the recording, adding it the first time.
  absl::StatusOr<uint32_t> StackId(const std::vector<core::RemoteAddr>& stack);

  core::store::TraceWriter& writer_;
  absl::Status error_;
  std::function<core::symbols::CodeLocation(core::RemoteAddr)> locate_;
  std::map<std::vector<core::RemoteAddr>, uint32_t> stack_ids_;
};

}  // namespace kwatch::watch::probe
