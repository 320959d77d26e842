// core/store/round_order.h: records from sources drained in rounds come out in time order, each
// held one round at most; a late record still comes out; an error keeps what was not emitted.
#include "core/store/round_order.h"

#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "absl/status/status.h"

namespace kwatch::core::store {
namespace {

struct Rec {
  uint64_t time_ns = 0;
  int source = 0;
};

class Collect {
 public:
  absl::Status operator()(const Rec& r) {
    if (fail_at_ != 0 && r.time_ns == fail_at_) {
      return absl::ResourceExhaustedError("disk full");
    }
    times.push_back(r.time_ns);
    return absl::OkStatus();
  }
  void FailAt(uint64_t t) { fail_at_ = t; }
  std::vector<uint64_t> times;

 private:
  uint64_t fail_at_ = 0;
};

// Two rings, drained one after the other in each round: a record stamped before the end of
// round 1 but read in round 2 (ring A was read before it was written) comes out before the
// records of round 2 that are later.
TEST(RoundOrder, TwoRingsComeOutInTimeOrderOneRoundLate) {
  RoundOrder<Rec> order;
  Collect out;
  auto emit = [&](const Rec& r) { return out(r); };
  // Round 1: ring A gives 10, 30; ring B gives 20, 40, 50.
  for (const uint64_t t : {10, 30}) {
    order.Add({t, 0});
  }
  for (const uint64_t t : {20, 40, 50}) {
    order.Add({t, 1});
  }
  ASSERT_TRUE(order.EndRound(emit).ok());
  EXPECT_TRUE(out.times.empty());  // nothing is known complete after one round
  EXPECT_EQ(order.held(), 5u);
  // Round 2: ring A gives 45 (written after A was read in round 1), 60; ring B gives 55.
  for (const uint64_t t : {45, 60}) {
    order.Add({t, 0});
  }
  order.Add({55, 1});
  ASSERT_TRUE(order.EndRound(emit).ok());
  EXPECT_EQ(out.times, (std::vector<uint64_t>{10, 20, 30, 40, 45, 50}));
  EXPECT_EQ(order.held(), 2u);
  // Round 3, empty: the rest of round 2 comes out.
  ASSERT_TRUE(order.EndRound(emit).ok());
  EXPECT_EQ(out.times, (std::vector<uint64_t>{10, 20, 30, 40, 45, 50, 55, 60}));
  EXPECT_EQ(order.held(), 0u);
}

// Equal times keep their arrival order; TakeAll empties the stage in time order.
TEST(RoundOrder, TiesKeepArrivalOrderAndTakeAllEmpties) {
  RoundOrder<Rec> order;
  std::vector<int> sources;
  auto emit = [&](const Rec& r) {
    sources.push_back(r.source);
    return absl::OkStatus();
  };
  order.Add({7, 3});
  order.Add({5, 1});
  order.Add({7, 4});
  order.Add({5, 2});
  ASSERT_TRUE(order.TakeAll(emit).ok());
  EXPECT_EQ(sources, (std::vector<int>{1, 2, 3, 4}));
  EXPECT_EQ(order.held(), 0u);
}

// A source that breaks the rule (a record older than what was released) is not lost: it comes
// out with the next round, after the later ones already emitted.
TEST(RoundOrder, ALateRecordIsEmittedNotLost) {
  RoundOrder<Rec> order;
  Collect out;
  auto emit = [&](const Rec& r) { return out(r); };
  order.Add({100, 0});
  ASSERT_TRUE(order.EndRound(emit).ok());
  ASSERT_TRUE(order.EndRound(emit).ok());
  EXPECT_EQ(out.times, (std::vector<uint64_t>{100}));
  order.Add({50, 1});  // late
  ASSERT_TRUE(order.EndRound(emit).ok());
  EXPECT_EQ(out.times, (std::vector<uint64_t>{100, 50}));
}

// An error stops the round at the failing record, which stays held with the ones after it.
TEST(RoundOrder, AnErrorKeepsWhatWasNotEmitted) {
  RoundOrder<Rec> order;
  Collect out;
  auto emit = [&](const Rec& r) { return out(r); };
  for (const uint64_t t : {4, 1, 3, 2}) {
    order.Add({t, 0});
  }
  out.FailAt(3);
  const absl::Status s = order.TakeAll(emit);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(out.times, (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(order.held(), 2u);
  out.FailAt(0);
  ASSERT_TRUE(order.TakeAll(emit).ok());
  EXPECT_EQ(out.times, (std::vector<uint64_t>{1, 2, 3, 4}));
}

}  // namespace
}  // namespace kwatch::core::store
