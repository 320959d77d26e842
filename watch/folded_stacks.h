#pragma once

// `kwatch report FILE --format folded`: the stacks a probe recording holds (`kwatch probe
// --stack -o FILE`) in the folded format flamegraph.pl, inferno and speedscope read: one line
// per distinct stack, "EVENT;outermost;...;innermost COUNT", the probe's event as the root so
// that each probe is its own tower.

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "core/store/trace_reader.h"
#include "watch/recording.h"

namespace kwatch::watch {

struct FoldedStacks {
  std::string text;      // the lines, sorted
  uint64_t hits = 0;     // hits with a stack, counted in the lines
  uint64_t without = 0;  // hits in the slice without a stack
  uint64_t stacks = 0;   // distinct lines
};

// The folded stacks of the hits of `reader` within `slice`. FailedPrecondition when the
// recording holds no stack at all (recorded without --stack), saying how to get them.
absl::StatusOr<FoldedStacks> FoldStacks(const core::store::TraceReader& reader,
                                        const RecordingSlice& slice);

}  // namespace kwatch::watch
