#include "watch/profile/false_sharing.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/watch/profile/profile_test_util.h"
#include "watch/profile/storage_profile.h"

namespace kwatch::watch::profile {
namespace {

using ::testing::ElementsAre;
using ::testing::Pair;
using testing::Read;
using testing::Write;

constexpr uint64_t kLine = 0x2000;  // 64-byte aligned
constexpr uint64_t kStart = 5'000'000;

// struct pair { long left; long right; char pad[48]; long far; long counters[4]; } at kLine:
// left and right share line 0x2000; far and counters live in line 0x2040.
WatchedObject Pairs() {
  WatchedObject o;
  o.id = 0;
  o.expr = "g_pair";
  o.addr = core::RemoteAddr{kLine};
  o.length = 104;
  o.type_name = "struct pair";
  o.fields = {
      {".left", "long", 0, 8, 0, 0, 0, true},          {".right", "long", 8, 8, 0, 0, 0, true},
      {".pad", "char[48]", 16, 48, 0, 0, 0, true},     {".far", "long", 64, 8, 0, 0, 0, true},
      {".counters", "long[4]", 72, 32, 0, 0, 0, true},
  };
  return o;
}

ProfileOptions Opts() {
  ProfileOptions o;
  o.start_ns = kStart;
  o.false_sharing_window_ns = 1000;
  o.false_sharing_min_transfers = 4;
  return o;
}

// Threads 1 and 2 write alternately, `n` writes in all, `gap_ns` apart: thread 1 to
// `addr1`, thread 2 to `addr2` (8 bytes each), from sites 0x100 and 0x200.
void Alternate(StorageProfile& p, int n, uint64_t addr1, uint64_t addr2, uint64_t gap_ns,
               uint64_t from_ns = kStart) {
  for (int i = 0; i < n; ++i) {
    const bool first = i % 2 == 0;
    p.Add(Write(from_ns + static_cast<uint64_t>(i) * gap_ns, first ? 1 : 2, first ? addr1 : addr2,
                8, first ? 0x100 : 0x200));
  }
}

TEST(FalseSharing, AdjacentFieldsWrittenAlternatelyIsOneFinding) {
  StorageProfile p({Pairs()}, Opts());
  Alternate(p, 10, kLine, kLine + 8, 100);
  p.Add(Read(kStart + 950, 3, kLine, 8));  // reads are not transfers
  const std::vector<FalseSharingFinding> found = p.FalseSharing();
  ASSERT_EQ(found.size(), 1u);
  const FalseSharingFinding& f = found[0];
  EXPECT_EQ(f.addr, core::RemoteAddr{kLine});
  EXPECT_EQ(f.false_transfers, 9u);
  EXPECT_EQ(f.true_transfers, 0u);
  EXPECT_EQ(f.first_ns, kStart + 100);
  EXPECT_EQ(f.last_ns, kStart + 900);
  EXPECT_THAT(f.fields, ElementsAre(0, 1, 2));  // left, right, pad
  EXPECT_TRUE(f.shared_fields.empty());
  ASSERT_EQ(f.threads.size(), 2u);
  EXPECT_EQ(f.threads[0].tid, 1);
  EXPECT_EQ(f.threads[0].writes, 5u);
  EXPECT_THAT(f.threads[0].fields, ElementsAre(Pair(0, 5)));
  ASSERT_EQ(f.threads[0].top_sites.size(), 1u);
  EXPECT_EQ(f.threads[0].top_sites[0].ip, core::RemoteAddr{0x100});
  EXPECT_EQ(f.threads[0].top_sites[0].counts.writes, 5u);
  EXPECT_EQ(f.threads[1].tid, 2);
  EXPECT_THAT(f.threads[1].fields, ElementsAre(Pair(1, 5)));
  EXPECT_EQ(f.threads[1].top_sites[0].ip, core::RemoteAddr{0x200});
}

TEST(FalseSharing, FieldsSixtyFourBytesApartShareNothing) {
  StorageProfile p({Pairs()}, Opts());
  Alternate(p, 10, kLine, kLine + 64, 100);  // left and far: two lines
  EXPECT_TRUE(p.FalseSharing().empty());
  ASSERT_EQ(p.lines().size(), 2u);
  EXPECT_EQ(p.lines()[0].false_transfers + p.lines()[0].true_transfers, 0u);
  EXPECT_EQ(p.lines()[1].false_transfers + p.lines()[1].true_transfers, 0u);
  EXPECT_EQ(p.lines()[0].writers.size(), 1u);
  EXPECT_EQ(p.lines()[1].writers.size(), 1u);
}

TEST(FalseSharing, OneThreadIsNoFinding) {
  StorageProfile p({Pairs()}, Opts());
  for (int i = 0; i < 10; ++i) {
    p.Add(Write(kStart + static_cast<uint64_t>(i) * 100, 1, kLine + (i % 2) * 8, 8));
  }
  EXPECT_TRUE(p.FalseSharing().empty());
  EXPECT_EQ(p.lines()[0].false_transfers, 0u);
  EXPECT_EQ(p.lines()[0].writes, 10u);
}

TEST(FalseSharing, SameFieldIsTrueSharing) {
  StorageProfile p({Pairs()}, Opts());
  Alternate(p, 10, kLine + 8, kLine + 8, 100);
  EXPECT_TRUE(p.FalseSharing().empty());
  EXPECT_EQ(p.lines()[0].true_transfers, 9u);
  EXPECT_EQ(p.lines()[0].false_transfers, 0u);
}

TEST(FalseSharing, WritesFurtherApartThanTheWindowAreNoTransfers) {
  StorageProfile p({Pairs()}, Opts());
  Alternate(p, 10, kLine, kLine + 8, 1001);
  EXPECT_TRUE(p.FalseSharing().empty());
  EXPECT_EQ(p.lines()[0].false_transfers, 0u);
  StorageProfile q({Pairs()}, Opts());
  Alternate(q, 10, kLine, kLine + 8, 1000);  // the window is inclusive
  EXPECT_EQ(q.lines()[0].false_transfers, 9u);
}

TEST(FalseSharing, FewerTransfersThanTheMinimumIsNoFinding) {
  StorageProfile p({Pairs()}, Opts());
  Alternate(p, 4, kLine, kLine + 8, 100);  // 3 transfers, minimum 4
  EXPECT_TRUE(p.FalseSharing().empty());
  p.Add(Write(kStart + 400, 2, kLine + 8, 8));
  p.Add(Write(kStart + 500, 1, kLine, 8));  // 4
  EXPECT_EQ(p.FalseSharing().size(), 1u);
}

TEST(FalseSharing, MostlyTrueSharingIsNoFinding) {
  StorageProfile p({Pairs()}, Opts());
  Alternate(p, 6, kLine, kLine + 8, 100);  // 5 false; thread 2 wrote last, to right
  Alternate(p, 8, kLine + 8, kLine + 8, 100, kStart + 600);  // 8 true
  EXPECT_EQ(p.lines()[0].false_transfers, 5u);
  EXPECT_EQ(p.lines()[0].true_transfers, 8u);
  EXPECT_TRUE(p.FalseSharing().empty());
}

TEST(FalseSharing, ThreadsWritingTheSameFieldsInTurnAreTrueSharing) {
  // Both threads write left, right, left, ... (as field_writer's workers write hits and
  // misses): consecutive writes of two threads always touch different fields here, but each
  // thread writes the other's field too. Only the first transfer (thread 1 had written only
  // `right` when thread 2 wrote `left`) is false sharing; the 38 after it are true.
  StorageProfile p({Pairs()}, Opts());
  uint64_t t = kStart;
  for (int round = 0; round < 20; ++round) {
    for (uint32_t thread : {1u, 2u}) {
      p.Add(Write(t, thread, (round + thread) % 2 == 0 ? kLine : kLine + 8, 8, 0x100 * thread));
      t += 100;
    }
  }
  EXPECT_EQ(p.lines()[0].false_transfers, 1u);
  EXPECT_EQ(p.lines()[0].true_transfers, 38u);
  EXPECT_TRUE(p.FalseSharing().empty());
}

TEST(FalseSharing, ElementsOfOneArrayFieldAreFalseSharing) {
  // Per-thread counters in one array: one field, disjoint bytes.
  StorageProfile p({Pairs()}, Opts());
  Alternate(p, 8, kLine + 72, kLine + 80, 100);
  const std::vector<FalseSharingFinding> found = p.FalseSharing();
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].addr, core::RemoteAddr{kLine + 64});
  EXPECT_EQ(found[0].false_transfers, 7u);
  EXPECT_THAT(found[0].shared_fields, ElementsAre(4));  // counters, written by both
}

TEST(FalseSharing, LinesAreSharedAcrossObjects) {
  WatchedObject a;
  a.id = 0;
  a.expr = "g_a";
  a.addr = core::RemoteAddr{kLine};
  a.length = 8;
  WatchedObject b = a;
  b.id = 1;
  b.expr = "g_b";
  b.addr = core::RemoteAddr{kLine + 8};
  StorageProfile p({a, b}, Opts());
  ASSERT_EQ(p.lines().size(), 1u);
  for (int i = 0; i < 6; ++i) {
    const bool first = i % 2 == 0;
    p.Add(Write(kStart + static_cast<uint64_t>(i) * 10, first ? 1 : 2, first ? kLine : kLine + 8, 8,
                0x100, first ? 0 : 1));
  }
  const std::vector<FalseSharingFinding> found = p.FalseSharing();
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].false_transfers, 5u);
  EXPECT_THAT(found[0].fields, ElementsAre(0, 1));
}

}  // namespace
}  // namespace kwatch::watch::profile
