#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/store/trace_reader.h"
#include "watch/recording.h"

namespace kwatch::watch {

// The hits of one probe of a recording: how many, by which threads, and the values each
// argument took.
struct ProbeTally {
  // Distinct values kept per argument; further values are counted in other_values.
  static constexpr size_t kMaxValues = 64;

  uint64_t hits = 0;
  std::map<pid_t, uint64_t> threads;  // tid -> hits
  // Per argument, in the hits' order: its name and value -> count.
  std::vector<std::pair<std::string, std::map<std::string, uint64_t>>> args;
  std::vector<uint64_t> other_values;  // per argument: hits with a value beyond kMaxValues
};

// The probe hits of `reader` within `slice`, by probe id (probes without hits are absent).
absl::StatusOr<std::map<uint32_t, ProbeTally>> TallyHits(const core::store::TraceReader& reader,
                                                         const RecordingSlice& slice);

// The `n` most frequent values of an argument, most first (equal counts in value order).
std::vector<std::pair<std::string, uint64_t>> TopValues(const std::map<std::string, uint64_t>& m,
                                                        size_t n);

}  // namespace kwatch::watch
