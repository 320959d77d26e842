#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"

namespace kwatch::core::store {

// Puts records that arrive from several sources (one ring per CPU, per thread or per process,
// and the session's own stops) in time order before they reach a TraceWriter, so that the
// recording's batches do not overlap in time and its profile snapshot stays usable (a
// recording whose batches overlap is replayed event by event: core/store/trace_reader.h).
//
// The rule is perf's ordered events, by rounds: a round is one drain of every source. A
// record stamped at or before the latest time seen by the end of round N was written to its
// source before round N ended, so round N+1 has read it at the latest: at the end of round
// N+1 every held record up to that time is released, in time order (ties in arrival order).
// Records are held for one round (one drain interval) at most, plus what arrives meanwhile.
// A source that is not drained whole in a round breaks the rule for its late records: they
// still come out, after later ones (the writer then marks the recording out of order), never
// lost. `Record` has a `time_ns` member; times share one clock (CLOCK_MONOTONIC here).
template <typename Record>
class RoundOrder {
 public:
  using EmitFn = absl::FunctionRef<absl::Status(const Record&)>;

  // Holds `r` until a round releases it.
  void Add(const Record& r) {
    latest_ = std::max(latest_, r.time_ns);
    held_.push_back(r);
  }

  // Ends a round: emits, in time order, each held record stamped at or before the latest time
  // seen by the end of the previous round. Stops at the first error (records not emitted yet
  // stay held).
  absl::Status EndRound(EmitFn emit) {
    const uint64_t release = released_up_to_;
    released_up_to_ = latest_;
    return Emit(emit, [&](const Record& r) { return r.time_ns <= release; });
  }

  // Emits everything held, in time order (the session's end).
  absl::Status TakeAll(EmitFn emit) {
    return Emit(emit, [](const Record&) { return true; });
  }

  size_t held() const { return held_.size(); }

 private:
  template <typename Pred>
  absl::Status Emit(EmitFn emit, Pred ready) {
    // held_[0, sorted_) is in time order already (what an earlier round kept back).
    auto by_time = [](const Record& a, const Record& b) { return a.time_ns < b.time_ns; };
    const auto mid = held_.begin() + static_cast<std::ptrdiff_t>(sorted_);
    if (!std::is_sorted(mid, held_.end(), by_time)) {
      std::stable_sort(mid, held_.end(), by_time);
    }
    std::inplace_merge(held_.begin(), mid, held_.end(), by_time);
    size_t n = 0;
    absl::Status status;
    while (n < held_.size() && ready(held_[n])) {
      status = emit(held_[n]);
      if (!status.ok()) {
        break;
      }
      ++n;
    }
    held_.erase(held_.begin(), held_.begin() + static_cast<std::ptrdiff_t>(n));
    sorted_ = held_.size();
    return status;
  }

  std::vector<Record> held_;
  size_t sorted_ = 0;            // held_'s first sorted_ records are in time order
  uint64_t latest_ = 0;          // the latest time added
  uint64_t released_up_to_ = 0;  // the latest time added by the end of the previous round
};

}  // namespace kwatch::core::store
