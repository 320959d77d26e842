#include "watch/profile/site_table.h"

#include <gtest/gtest.h>

namespace kwatch::watch::profile {
namespace {

TEST(SiteTable, ExactUpToCapacityThenOther) {
  SiteTable t(3);
  for (uint64_t ip = 1; ip <= 100; ++ip) {
    for (uint64_t k = 0; k < ip; ++k) {
      t.Add(core::RemoteAddr{ip * 0x1000}, k % 2 == 0);
    }
  }
  EXPECT_EQ(t.size(), 3u);
  const auto ranked = t.Ranked();
  ASSERT_EQ(ranked.size(), 3u);
  EXPECT_EQ(ranked[0].ip, core::RemoteAddr{0x3000});
  EXPECT_EQ(ranked[0].counts, (RwCounts{1, 2}));
  EXPECT_EQ(ranked[2].ip, core::RemoteAddr{0x1000});
  EXPECT_EQ(t.other().total(), 100u * 101 / 2 - 6);
}

TEST(SiteTable, TiesRankByAddress) {
  SiteTable t(8);
  t.Add(core::RemoteAddr{0x30}, true);
  t.Add(core::RemoteAddr{0x10}, false);
  t.Add(core::RemoteAddr{0x20}, true);
  const auto ranked = t.Ranked();
  ASSERT_EQ(ranked.size(), 3u);
  EXPECT_EQ(ranked[0].ip, core::RemoteAddr{0x10});
  EXPECT_EQ(ranked[1].ip, core::RemoteAddr{0x20});
  EXPECT_EQ(ranked[2].ip, core::RemoteAddr{0x30});
}

TEST(SiteTable, ZeroCapacityCountsEverythingAsOther) {
  SiteTable t;
  t.Add(core::RemoteAddr{1}, true);
  EXPECT_TRUE(t.Ranked().empty());
  EXPECT_EQ(t.other(), (RwCounts{0, 1}));
}

}  // namespace
}  // namespace kwatch::watch::profile
