#include "core/symbols/symbol_match.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace kwatch::core::symbols {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

TEST(EditDistanceTest, Basics) {
  EXPECT_EQ(EditDistance("", ""), 0u);
  EXPECT_EQ(EditDistance("abc", ""), 3u);
  EXPECT_EQ(EditDistance("", "abc"), 3u);
  EXPECT_EQ(EditDistance("g_stat", "g_stats"), 1u);
  EXPECT_EQ(EditDistance("kitten", "sitting"), 3u);
  EXPECT_EQ(EditDistance("flaw", "lawn"), 2u);
}

TEST(NearMatchesTest, NearestFirstThenAlphabetical) {
  const std::vector<std::string> names = {"g_cache2", "g_cache", "g_stats", "g_name", "other"};
  EXPECT_THAT(NearMatches("g_cach", names, 3), ElementsAre("g_cache", "g_cache2"));
  EXPECT_THAT(NearMatches("g_stat", names, 3), ElementsAre("g_stats"));
  EXPECT_THAT(NearMatches("G_STATS", names, 3), ElementsAre("g_stats"));
  EXPECT_THAT(NearMatches("zzzzzz", names, 3), IsEmpty());
}

TEST(NearMatchesTest, ThresholdGrowsWithLength) {
  // Short words allow one edit only.
  EXPECT_THAT(NearMatches("abc", {"abd", "axy"}, 3), ElementsAre("abd"));
  // Longer words allow up to three.
  EXPECT_THAT(NearMatches("request_count", {"requests_counted", "reply_count"}, 3),
              ElementsAre("requests_counted"));
}

TEST(NearMatchesTest, LimitAndNoSelfOrDuplicates) {
  const std::vector<std::string> names = {"hits", "hit", "hat", "hot", "hut", "hit"};
  EXPECT_THAT(NearMatches("hit", names, 3), ElementsAre("hat", "hits", "hot"));
}

}  // namespace
}  // namespace kwatch::core::symbols
