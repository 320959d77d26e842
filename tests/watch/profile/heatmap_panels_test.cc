// watch/profile/heatmap_panels.h: a profile's heatmap panels (the PNG's cells).
#include "watch/profile/heatmap_panels.h"

#include <cstdint>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/watch/profile/profile_test_util.h"

namespace kwatch::watch::profile {
namespace {

using ::testing::ElementsAre;
using testing::Read;
using testing::Write;

constexpr uint64_t kStart = 1'000'000'000;
constexpr uint64_t kMs = 1'000'000;

// struct s { long a; int b; int c; } at 0x1038: .a ends one cache line, .b and .c start the
// next.
WatchedObject Struct() {
  WatchedObject o;
  o.id = 0;
  o.expr = "g";
  o.addr = core::RemoteAddr{0x1038};
  o.length = 16;
  o.type_name = "struct s";
  o.fields = {{".a", "long", 0, 8, 0, 0, 0, true},
              {".b", "int", 8, 4, 0, 0, 0, true},
              {".c", "int", 12, 4, 0, 0, 0, true}};
  return o;
}

WatchedObject Untyped() {
  WatchedObject o;
  o.id = 1;
  o.expr = "0x2000";
  o.addr = core::RemoteAddr{0x2000};
  o.length = 8;
  return o;
}

StorageProfile Profile() {
  ProfileOptions opts;
  opts.start_ns = kStart;
  opts.bucket_ns = kMs;
  StorageProfile p({Struct(), Untyped()}, opts);
  p.Add(Write(kStart + kMs / 2, 1, 0x1038, 8));
  p.Add(Write(kStart + kMs / 2 + 1, 2, 0x1038, 8));
  p.Add(Read(kStart + 2 * kMs + 5, 1, 0x1040, 4));
  p.Add(Write(kStart + 2 * kMs + 6, 1, 0x1040, 4));
  return p;
}

TEST(HeatmapPanelsTest, OnePanelPerObjectWithFields) {
  const StorageProfile p = Profile();
  const std::vector<HeatmapPanel> panels = HeatmapPanels(p, "");
  ASSERT_EQ(panels.size(), 2U);
  const HeatmapPanel& s = panels[0];
  EXPECT_EQ(s.title, "g  (struct s, 16 bytes at 0x1038)");
  EXPECT_THAT(s.rows, ElementsAre("g.a", "g.b", "g.c"));
  EXPECT_THAT(s.row_lines, ElementsAre(0x40, 0x41, 0x41));
  EXPECT_EQ(s.bucket_ns, kMs);
  EXPECT_EQ(s.start_ns, 0U);
  EXPECT_EQ(s.columns, 3U);
  EXPECT_THAT(s.counts, ElementsAre(2, 0, 0,  //
                                    0, 0, 2,  //
                                    0, 0, 0));
  EXPECT_EQ(panels[1].title, "0x2000  (8 bytes at 0x2000)");
  EXPECT_EQ(panels[1].rows.size(), 1U);
  EXPECT_THAT(panels[1].counts, ElementsAre(0, 0, 0));
}

TEST(HeatmapPanelsTest, FieldFilter) {
  const StorageProfile p = Profile();
  const std::vector<HeatmapPanel> panels = HeatmapPanels(p, ".b");
  ASSERT_EQ(panels.size(), 1U);  // the untyped object has no field called .b
  EXPECT_THAT(panels[0].rows, ElementsAre("g.b"));
  EXPECT_THAT(panels[0].counts, ElementsAre(0, 0, 2));
  EXPECT_TRUE(HeatmapPanels(p, "no such field").empty());
}

TEST(HeatmapPanelsTest, AProfileWithoutEventsHasOneEmptyColumn) {
  ProfileOptions opts;
  opts.start_ns = kStart;
  const StorageProfile p({Struct()}, opts);
  const std::vector<HeatmapPanel> panels = HeatmapPanels(p, "");
  ASSERT_EQ(panels.size(), 1U);
  EXPECT_EQ(panels[0].columns, 1U);
  EXPECT_THAT(panels[0].counts, ElementsAre(0, 0, 0));
}

}  // namespace
}  // namespace kwatch::watch::profile
