#include "watch/summary.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace kwatch::watch {
namespace {

using ::testing::ElementsAre;

// struct s { long a; int b; unsigned x : 3, y : 5; char pad[3]; union { int u; char c; } un; };
core::symbols::TypeLayout Layout() {
  core::symbols::TypeLayout l;
  l.type_name = "struct s";
  l.size = 20;
  l.fields = {
      {".a", "long", 0, 8, 0, 0, 0, true},           {".b", "int", 8, 4, 0, 0, 0, true},
      {".x", "unsigned int", 12, 4, 0, 3, 0, true},  {".y", "unsigned int", 12, 4, 3, 5, 0, true},
      {".un", "union {...}", 16, 4, 0, 0, 0, false}, {".un.u", "int", 16, 4, 0, 0, 1, true},
      {".un.c", "char", 16, 1, 0, 0, 1, true},
  };
  return l;
}

Watch MakeWatch(uint64_t length) {
  Watch w;
  w.id = 0;
  w.target.display = "g";
  w.target.addr = core::RemoteAddr{0x1000};
  w.target.length = length;
  w.target.layout = Layout();
  return w;
}

core::AccessEvent Access(uint64_t offset, uint32_t size, core::AccessKind kind) {
  core::AccessEvent ev;
  ev.watch_id = 0;
  ev.tid = 7;
  ev.addr = core::RemoteAddr{0x1000};
  ev.access_addr = core::RemoteAddr{0x1000 + offset};
  ev.access_size = size;
  ev.kind = kind;
  return ev;
}

TEST(FieldsOverlapping, BitfieldsCoverOnlyTheirBytes) {
  const core::symbols::TypeLayout l = Layout();
  EXPECT_THAT(FieldsOverlapping("g", l, 12, 1), ElementsAre("g.x", "g.y"));
  EXPECT_THAT(FieldsOverlapping("g", l, 13, 1), ElementsAre());  // bits 0..7 live in byte 12
  EXPECT_THAT(FieldsOverlapping("g", l, 0, 8), ElementsAre("g.a"));
  EXPECT_THAT(FieldsOverlapping("g", l, 6, 4), ElementsAre("g.a", "g.b"));
  EXPECT_THAT(FieldsOverlapping("g", l, 16, 1), ElementsAre("g.un.u", "g.un.c"));
  EXPECT_THAT(FieldsOverlapping("g", l, 17, 1), ElementsAre("g.un.u"));
  // A marked union is one field: accesses through any member name the union.
  core::symbols::TypeLayout marked = l;
  marked.fields[4].is_union = true;
  ASSERT_EQ(marked.fields[4].path, ".un");
  EXPECT_THAT(FieldsOverlapping("g", marked, 16, 1), ElementsAre("g.un"));
  EXPECT_THAT(FieldsOverlapping("g", marked, 12, 8), ElementsAre("g.x", "g.y", "g.un"));
}

TEST(Summary, CountsPerFieldThreadAndSite) {
  std::vector<Watch> watches = {MakeWatch(20)};
  Summary s(watches);
  s.Add(Access(0, 8, core::AccessKind::kWrite));
  s.Add(Access(0, 8, core::AccessKind::kWrite));
  s.Add(Access(8, 4, core::AccessKind::kRead));
  auto straddle = Access(6, 4, core::AccessKind::kWrite);  // one access, two fields
  straddle.tid = 8;
  s.Add(straddle);
  const WatchCounts& c = s.counts(0);
  EXPECT_EQ(s.events(), 4u);
  EXPECT_EQ(c.total.writes, 3u);
  EXPECT_EQ(c.total.reads, 1u);
  EXPECT_EQ(c.fields.at("g.a").writes, 3u);
  EXPECT_EQ(c.fields.at("g.b").reads, 1u);
  EXPECT_EQ(c.fields.at("g.b").writes, 1u);
  EXPECT_EQ(c.threads.at(7).total(), 3u);
  EXPECT_EQ(c.threads.at(8).total(), 1u);
  EXPECT_EQ(s.FieldLabel(straddle), "g.a,g.b");
}

TEST(Summary, PaddingAndUnknownAccessesAreNamed) {
  std::vector<Watch> watches = {MakeWatch(20)};
  Summary s(watches);
  EXPECT_EQ(s.FieldLabel(Access(13, 1, core::AccessKind::kRead)), "g (padding +13)");
  core::AccessEvent unknown = Access(0, 0, core::AccessKind::kWrite);  // perf: no exact bytes
  EXPECT_EQ(s.FieldLabel(unknown), "g");
  std::vector<Watch> one = {MakeWatch(4)};
  one[0].target.addr = core::RemoteAddr{0x1008};
  one[0].target.display = "g.b";
  core::symbols::TypeLayout scalar;
  scalar.fields = {{"", "int", 0, 4, 0, 0, 0, true}};
  one[0].target.layout = scalar;
  Summary s2(one);
  unknown.addr = core::RemoteAddr{0x1008};
  EXPECT_EQ(s2.FieldLabel(unknown), "g.b");
}

}  // namespace
}  // namespace kwatch::watch
