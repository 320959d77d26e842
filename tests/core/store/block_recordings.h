#pragma once

// What the tests of the block tables (event_blocks, hit_blocks) share: writing batches of
// events or hits to a recording in either storage, reading them back through a filter, and the
// 30 in-order batches both read through every filter.

#include <cstdint>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include <gtest/gtest.h>

#include "core/event.h"
#include "core/store/trace_reader.h"
#include "core/store/trace_records.h"
#include "core/store/trace_writer.h"

namespace kwatch::core::store::testing {

inline constexpr uint64_t kStart = 5'000'000'000ULL;

inline absl::Status AppendTo(TraceWriter& w, const AccessEvent& e) {
  return w.Append(e);
}
inline absl::Status AppendTo(TraceWriter& w, const HitRecord& h) {
  return w.AppendHit(h);
}
inline absl::Status ForEachIn(const TraceReader& r, const EventFilter& f,
                              const std::function<bool(const AccessEvent&)>& fn) {
  return r.ForEachEvent(f, fn);
}
inline absl::Status ForEachIn(const TraceReader& r, const HitFilter& f,
                              const std::function<bool(const HitRecord&)>& fn) {
  return r.ForEachHit(f, fn);
}

// Writes `batches` (each committed by a Flush) in `storage`, finished.
template <typename Record>
void WriteBatches(const std::string& path, const std::vector<std::vector<Record>>& batches,
                  EventStorage storage) {
  SessionRecord s;
  s.command_line = "kwatch -o x";
  s.start_mono_ns = kStart;
  s.mode = std::is_same_v<Record, HitRecord> ? "probe" : "watch";
  auto w = TraceWriter::Create(path, s, 1'000'000, storage);
  ASSERT_TRUE(w.ok()) << w.status();
  for (const auto& batch : batches) {
    for (const Record& r : batch) {
      ASSERT_TRUE(AppendTo(**w, r).ok());
    }
    ASSERT_TRUE((*w)->Flush().ok());
  }
  ASSERT_TRUE((*w)->Finish(SessionEnd{}).ok());
}

// Every record of the recording at `path` that `f` passes, in the order the reader gives.
template <typename Record, typename Filter>
std::vector<Record> ReadRecords(const std::string& path, const Filter& f) {
  auto r = TraceReader::Open(path);
  EXPECT_TRUE(r.ok()) << r.status();
  std::vector<Record> out;
  if (!r.ok()) {
    return out;
  }
  const absl::Status s = ForEachIn(**r, f, [&](const Record& x) {
    out.push_back(x);
    return true;
  });
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

// 30 batches of 1000 records made by make(i, time), 1 us apart, with ties (two records per
// time stamp every 7th), the first few before the session's start.
template <typename Record>
std::vector<std::vector<Record>> InOrderBatches(
    const std::function<Record(uint64_t, uint64_t)>& make) {
  std::vector<std::vector<Record>> batches(30);
  uint64_t t = kStart - 5000;
  for (uint64_t i = 0; i < 30'000; ++i) {
    if (i % 7 != 3) {
      t += 1000;
    }
    batches[i / 1000].push_back(make(i, t));
  }
  return batches;
}

}  // namespace kwatch::core::store::testing
