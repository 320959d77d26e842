#include "watch/profile/storage_profile.h"

#include <memory>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/watch/profile/profile_test_util.h"

namespace kwatch::watch::profile {
namespace {

using ::testing::ElementsAre;
using testing::Read;
using testing::Write;

constexpr uint64_t kBase = 0x1000;
constexpr uint64_t kStart = 1'000'000'000;

// struct s { long a; int b; unsigned x : 3, y : 5, z : 4; union { int u; char c; } un;
//            char tail[4]; };  (bytes 14..15 are bitfield-unit padding)
WatchedObject Struct() {
  WatchedObject o;
  o.id = 0;
  o.expr = "g";
  o.addr = core::RemoteAddr{kBase};
  o.length = 24;
  o.type_name = "struct s";
  o.fields = {
      {".a", "long", 0, 8, 0, 0, 0, true},          {".b", "int", 8, 4, 0, 0, 0, true},
      {".x", "unsigned int", 12, 4, 0, 3, 0, true}, {".y", "unsigned int", 12, 4, 3, 5, 0, true},
      {".z", "unsigned int", 12, 4, 8, 4, 0, true}, {".un", "union {...}", 16, 4, 0, 0, 0, false},
      {".un.u", "int", 16, 4, 0, 0, 1, true},       {".un.c", "char", 16, 1, 0, 0, 1, true},
      {".tail", "char[4]", 20, 4, 0, 0, 0, true},
  };
  return o;
}

// struct cache { struct line { long tag; long data; } lines[4]; } at 0x8000.
WatchedObject Cache() {
  WatchedObject o;
  o.id = 1;
  o.expr = "g_cache";
  o.addr = core::RemoteAddr{0x8000};
  o.length = 64;
  o.type_name = "struct cache";
  o.fields.push_back({".lines", "struct line[4]", 0, 64, 0, 0, 0, false});
  for (int i = 0; i < 4; ++i) {
    const std::string p = ".lines[" + std::to_string(i) + "]";
    const uint64_t off = 16 * static_cast<uint64_t>(i);
    o.fields.push_back({p, "struct line", off, 16, 0, 0, 1, false});
    o.fields.push_back({p + ".tag", "long", off, 8, 0, 0, 2, true});
    o.fields.push_back({p + ".data", "long", off + 8, 8, 0, 0, 2, true});
  }
  return o;
}

ProfileOptions Opts() {
  ProfileOptions o;
  o.start_ns = kStart;
  return o;
}

// Global index of the field called `path`.
uint32_t FieldIndex(const StorageProfile& p, const std::string& path) {
  for (uint32_t i = 0; i < p.fields().size(); ++i) {
    if (p.fields()[i].path == path) {
      return i;
    }
  }
  ADD_FAILURE() << "no field " << path;
  return 0;
}

RwCounts Rw(uint64_t reads, uint64_t writes) {
  return RwCounts{reads, writes};
}

TEST(StorageProfile, LeafFieldsWithPathsAndEffectiveBytes) {
  StorageProfile p({Struct(), Cache()}, Opts());
  ASSERT_EQ(p.fields().size(), 16u);  // 8 leaves of g, 8 of g_cache
  EXPECT_EQ(p.FieldRange(0), std::make_pair(0u, 8u));
  EXPECT_EQ(p.FieldRange(1), std::make_pair(8u, 16u));
  const FieldInfo& z = p.fields()[FieldIndex(p, "g.z")];
  EXPECT_EQ(z.begin, 13u);
  EXPECT_EQ(z.end, 14u);
  const FieldInfo& y = p.fields()[FieldIndex(p, "g.y")];
  EXPECT_EQ(y.begin, 12u);
  EXPECT_EQ(y.end, 13u);
  EXPECT_EQ(p.fields()[11].path, "g_cache.lines[1].data");
}

TEST(StorageProfile, ObjectWithoutLayoutIsOneField) {
  WatchedObject o;
  o.expr = "counter";
  o.addr = core::RemoteAddr{0x5000};
  o.length = 8;
  o.type_name = "long";
  StorageProfile p({o}, Opts());
  ASSERT_EQ(p.fields().size(), 1u);
  EXPECT_EQ(p.fields()[0].path, "counter");
  p.Add(Write(kStart, 1, 0x5004, 2));
  EXPECT_EQ(p.field_counts(0), Rw(0, 1));
}

TEST(StorageProfile, BitfieldsCountByTheBytesOfTheirBits) {
  StorageProfile p({Struct()}, Opts());
  p.Add(Write(kStart, 1, kBase + 12, 1));  // byte 12 holds x and y
  p.Add(Read(kStart, 1, kBase + 13, 1));   // byte 13 holds z only
  p.Add(Read(kStart, 1, kBase + 14, 1));   // byte 14 holds no bits
  EXPECT_EQ(p.field_counts(FieldIndex(p, "g.x")), Rw(0, 1));
  EXPECT_EQ(p.field_counts(FieldIndex(p, "g.y")), Rw(0, 1));
  EXPECT_EQ(p.field_counts(FieldIndex(p, "g.z")), Rw(1, 0));
  EXPECT_EQ(p.object_stats(0).total, Rw(2, 1));
  EXPECT_EQ(p.object_stats(0).unattributed, 1u);
  p.Add(Write(kStart, 1, kBase + 12, 4));  // the whole unit: all three
  EXPECT_EQ(p.field_counts(FieldIndex(p, "g.x")), Rw(0, 2));
  EXPECT_EQ(p.field_counts(FieldIndex(p, "g.y")), Rw(0, 2));
  EXPECT_EQ(p.field_counts(FieldIndex(p, "g.z")), Rw(1, 1));
  EXPECT_EQ(p.field_counts(FieldIndex(p, "g.b")), Rw(0, 0));
}

// A layout that does not mark its unions (a recording of schema 2): members count apart.
TEST(StorageProfile, UnionMembersOverlap) {
  StorageProfile p({Struct()}, Opts());
  p.Add(Write(kStart, 1, kBase + 16, 1));  // u and c
  p.Add(Write(kStart, 1, kBase + 17, 1));  // u only
  p.Add(Read(kStart, 1, kBase + 16, 4));   // u and c
  EXPECT_EQ(p.field_counts(FieldIndex(p, "g.un.u")), Rw(1, 2));
  EXPECT_EQ(p.field_counts(FieldIndex(p, "g.un.c")), Rw(1, 1));
}

TEST(StorageProfile, AUnionCountsOnceWhicheverMemberWasAccessed) {
  WatchedObject o = Struct();
  o.fields[5].is_union = true;  // .un
  StorageProfile p({o}, Opts());
  p.Add(Write(kStart, 1, kBase + 16, 1));  // through c
  p.Add(Write(kStart, 1, kBase + 17, 1));  // u's second byte
  p.Add(Read(kStart, 1, kBase + 16, 4));   // through u
  EXPECT_EQ(p.field_counts(FieldIndex(p, "g.un")), Rw(1, 2));
  for (const FieldInfo& f : p.fields()) {
    EXPECT_NE(f.path, "g.un.u");
    EXPECT_NE(f.path, "g.un.c");
  }
  EXPECT_EQ(p.fields().size(), Struct().fields.size() - 2);  // .un for its two members
  EXPECT_EQ(p.object_stats(0).total, Rw(1, 2));
}

TEST(StorageProfile, ArrayElementsAndStraddlingAccesses) {
  StorageProfile p({Struct(), Cache()}, Opts());
  p.Add(Write(kStart, 1, 0x8000 + 48, 8, 0x401000, /*watch_id=*/1));
  p.Add(Read(kStart, 1, 0x8000 + 44, 8, 0x401000, 1));  // lines[2].data and lines[3].tag
  EXPECT_EQ(p.field_counts(FieldIndex(p, "g_cache.lines[3].tag")), Rw(1, 1));
  EXPECT_EQ(p.field_counts(FieldIndex(p, "g_cache.lines[2].data")), Rw(1, 0));
  EXPECT_EQ(p.field_counts(FieldIndex(p, "g_cache.lines[2].tag")), Rw(0, 0));
  EXPECT_EQ(p.object_stats(1).total, Rw(1, 1));
  EXPECT_EQ(p.object_stats(0).total, Rw(0, 0));
}

TEST(StorageProfile, PerByteCounts) {
  StorageProfile p({Struct()}, Opts());
  p.Add(Write(kStart, 1, kBase, 8));
  p.Add(Read(kStart, 1, kBase + 6, 4));
  p.Add(Read(kStart, 1, kBase + 22, 8));  // runs past the object: clipped to bytes 22, 23
  std::vector<uint64_t> reads(24, 0);
  std::vector<uint64_t> writes(24, 0);
  for (int i = 0; i < 8; ++i) {
    writes[i] = 1;
  }
  reads[6] = reads[7] = reads[8] = reads[9] = 1;
  reads[22] = reads[23] = 1;
  EXPECT_EQ(std::vector<uint64_t>(p.ByteReads(0).begin(), p.ByteReads(0).end()), reads);
  EXPECT_EQ(std::vector<uint64_t>(p.ByteWrites(0).begin(), p.ByteWrites(0).end()), writes);
  EXPECT_EQ(p.field_counts(FieldIndex(p, "g.a")), Rw(1, 1));
  EXPECT_EQ(p.field_counts(FieldIndex(p, "g.b")), Rw(1, 0));
  EXPECT_EQ(p.field_counts(FieldIndex(p, "g.tail")), Rw(1, 0));
}

TEST(StorageProfile, WatchedRangeWhenAccessSizeUnknown) {
  StorageProfile p({Struct()}, Opts());
  core::AccessEvent ev = Write(kStart, 1, kBase + 8, 4);
  ev.access_size = 0;  // perf mode: only the watched range [addr, addr+len) is known
  ev.addr = core::RemoteAddr{kBase + 8};
  ev.len = 8;  // bytes 8..15: b, x, y, z
  p.Add(ev);
  EXPECT_EQ(p.field_counts(FieldIndex(p, "g.b")), Rw(0, 1));
  EXPECT_EQ(p.field_counts(FieldIndex(p, "g.z")), Rw(0, 1));
  EXPECT_EQ(p.field_counts(FieldIndex(p, "g.a")), Rw(0, 0));
  EXPECT_EQ(p.ByteWrites(0)[15], 1u);
}

TEST(StorageProfile, SitesRankedAndBounded) {
  ProfileOptions opts = Opts();
  opts.max_sites_per_field = 2;
  StorageProfile p({Struct()}, opts);
  for (int i = 0; i < 3; ++i) {
    p.Add(Write(kStart, 1, kBase, 8, 0x500));
  }
  for (int i = 0; i < 5; ++i) {
    p.Add(Read(kStart, 1, kBase, 8, 0x600));
  }
  p.Add(Write(kStart, 1, kBase, 8, 0x700));  // a third IP: beyond the cap
  p.Add(Write(kStart, 1, kBase, 8, 0x700));
  const uint32_t a = FieldIndex(p, "g.a");
  const std::vector<SiteCount> sites = p.FieldSites(a);
  ASSERT_EQ(sites.size(), 2u);
  EXPECT_EQ(sites[0].ip, core::RemoteAddr{0x600});
  EXPECT_EQ(sites[0].counts, Rw(5, 0));
  EXPECT_EQ(sites[1].ip, core::RemoteAddr{0x500});
  EXPECT_EQ(sites[1].counts, Rw(0, 3));
  EXPECT_EQ(p.FieldOtherSites(a), Rw(0, 2));
  const std::vector<SiteCount> obj_sites = p.ObjectSites(0);  // cap 256: all three
  ASSERT_EQ(obj_sites.size(), 3u);
  EXPECT_EQ(obj_sites[2].ip, core::RemoteAddr{0x700});
  EXPECT_EQ(obj_sites[2].counts, Rw(0, 2));
}

TEST(StorageProfile, PerThreadCounts) {
  StorageProfile p({Struct()}, Opts());
  p.Add(Write(kStart + 5, 7, kBase, 8));
  p.Add(Write(kStart + 9, 8, kBase, 8));
  p.Add(Read(kStart + 20, 8, kBase + 8, 4));
  p.Add(Read(kStart + 30, 7, kBase + 8, 4));
  p.Add(Read(kStart + 40, 8, kBase + 8, 4));
  ASSERT_EQ(p.threads().size(), 2u);
  EXPECT_EQ(p.threads()[0].tid, 7);
  EXPECT_EQ(p.threads()[1].tid, 8);
  EXPECT_EQ(p.threads()[1].first_ns, kStart + 9);
  EXPECT_EQ(p.threads()[1].last_ns, kStart + 40);
  EXPECT_EQ(p.threads()[1].total, Rw(2, 1));
  EXPECT_EQ(p.ThreadIndex(8), 1u);
  EXPECT_EQ(p.ThreadIndex(9), StorageProfile::kNone);
  const uint32_t a = FieldIndex(p, "g.a");
  const uint32_t b = FieldIndex(p, "g.b");
  EXPECT_EQ(p.ThreadFieldCounts(0, a), Rw(0, 1));
  EXPECT_EQ(p.ThreadFieldCounts(0, b), Rw(1, 0));
  EXPECT_EQ(p.ThreadFieldCounts(1, b), Rw(2, 0));
  EXPECT_EQ(p.FieldThreadCount(a), 2u);
  EXPECT_EQ(p.FieldThreadCount(FieldIndex(p, "g.tail")), 0u);
  EXPECT_EQ(p.events(), 5u);
  EXPECT_EQ(p.first_ns(), kStart + 5);
  EXPECT_EQ(p.last_ns(), kStart + 40);
}

TEST(StorageProfile, TimeBinsPerFieldAndThread) {
  ProfileOptions opts = Opts();
  opts.initial_bucket_ns = 100;
  opts.max_buckets = 4;
  StorageProfile p({Struct()}, opts);
  const uint32_t a = FieldIndex(p, "g.a");
  p.Add(Write(kStart + 0, 1, kBase, 8));
  p.Add(Write(kStart + 99, 2, kBase, 8));
  p.Add(Read(kStart + 100, 1, kBase, 8));
  p.Add(Write(kStart + 399, 1, kBase, 8));
  EXPECT_EQ(p.bins().width_ns(), 100u);
  EXPECT_THAT(p.FieldBins(a, true), ElementsAre(2, 0, 0, 1));
  EXPECT_THAT(p.FieldBins(a, false), ElementsAre(0, 1, 0, 0));
  EXPECT_THAT(p.ThreadFieldBins(0, a, true), ElementsAre(1, 0, 0, 1));
  EXPECT_THAT(p.ThreadFieldBins(1, a, true), ElementsAre(1, 0, 0, 0));
  EXPECT_THAT(p.ThreadFieldBins(1, a, false), ElementsAre(0, 0, 0, 0));
  p.Add(Write(kStart + 400, 2, kBase, 8));  // past 4 x 100 ns: the width doubles
  EXPECT_EQ(p.bins().width_ns(), 200u);
  EXPECT_THAT(p.FieldBins(a, true), ElementsAre(2, 1, 1));
  EXPECT_THAT(p.FieldBins(a, false), ElementsAre(1, 0, 0));
  EXPECT_THAT(p.ThreadFieldBins(1, a, true), ElementsAre(1, 0, 1));
  EXPECT_THAT(p.ThreadFieldBins(0, FieldIndex(p, "g.b"), true), ElementsAre(0, 0, 0));
}

TEST(StorageProfile, ValueHistoryExtractsFieldBits) {
  ProfileOptions opts = Opts();
  opts.value_history = 2;
  StorageProfile p({Struct()}, opts);
  core::AccessEvent ev = Write(kStart + 1, 3, kBase + 12, 1, 0x777);
  ev.value = 0b10101'011;  // y = 21, x = 3
  ev.old_value = 0b00001'111;
  ev.value_exact = true;
  p.Add(ev);
  const std::vector<ValueSample> x = p.FieldValues(FieldIndex(p, "g.x"));
  ASSERT_EQ(x.size(), 1u);
  EXPECT_EQ(x[0].value, 3u);
  EXPECT_EQ(x[0].old_value, std::optional<uint64_t>(7));
  EXPECT_EQ(x[0].tid, 3);
  EXPECT_EQ(x[0].ip, core::RemoteAddr{0x777});
  EXPECT_TRUE(x[0].exact);
  const std::vector<ValueSample> y = p.FieldValues(FieldIndex(p, "g.y"));
  ASSERT_EQ(y.size(), 1u);
  EXPECT_EQ(y[0].value, 21u);
  EXPECT_EQ(y[0].old_value, std::optional<uint64_t>(1));

  // An 8-byte value from byte 8 covers b (bytes 8..11) and z (byte 13, bits 0..3).
  core::AccessEvent wide = Read(kStart + 2, 3, kBase + 8, 8);
  wide.value = 0x0000'0a00'1234'5678ULL;
  p.Add(wide);
  const std::vector<ValueSample> b = p.FieldValues(FieldIndex(p, "g.b"));
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b[0].value, 0x12345678u);
  EXPECT_EQ(b[0].kind, core::AccessKind::kRead);
  EXPECT_FALSE(b[0].old_value.has_value());
  const std::vector<ValueSample> z = p.FieldValues(FieldIndex(p, "g.z"));
  ASSERT_EQ(z.size(), 1u);
  EXPECT_EQ(z[0].value, 0xau);

  // A value that covers half of a field is not recorded; the ring keeps the last 2.
  core::AccessEvent half = Write(kStart + 3, 3, kBase + 4, 4);
  half.value = 1;
  p.Add(half);
  EXPECT_TRUE(p.FieldValues(FieldIndex(p, "g.a")).empty());
  for (uint64_t v = 10; v < 13; ++v) {
    core::AccessEvent e = Write(kStart + v, 3, kBase + 8, 4);
    e.value = v;
    p.Add(e);
  }
  const std::vector<ValueSample> b2 = p.FieldValues(FieldIndex(p, "g.b"));
  ASSERT_EQ(b2.size(), 2u);
  EXPECT_EQ(b2[0].value, 11u);
  EXPECT_EQ(b2[1].value, 12u);
}

TEST(StorageProfile, ExecAndUnknownWatchEvents) {
  StorageProfile p({Struct()}, Opts());
  p.Add(testing::Access(kStart, 1, kBase, 1, core::AccessKind::kExec));
  p.Add(Write(kStart, 1, kBase, 8, 0x1, /*watch_id=*/5));
  EXPECT_EQ(p.events(), 2u);
  EXPECT_EQ(p.ignored_events(), 1u);
  EXPECT_EQ(p.object_stats(0).execs, 1u);
  EXPECT_EQ(p.object_stats(0).total, Rw(0, 0));
  EXPECT_EQ(p.field_counts(FieldIndex(p, "g.a")), Rw(0, 0));
}

TEST(StorageProfile, CopyIsAnIndependentSnapshot) {
  StorageProfile p({Struct()}, Opts());
  p.Add(Write(kStart, 1, kBase, 8));
  const auto snap = std::make_shared<const StorageProfile>(p);
  p.Add(Write(kStart + 1, 2, kBase, 8));
  EXPECT_EQ(snap->field_counts(0), Rw(0, 1));
  EXPECT_EQ(snap->threads().size(), 1u);
  EXPECT_EQ(p.field_counts(0), Rw(0, 2));
}

TEST(StorageProfile, ManyAccessShapesStayExactPastTheShapeCache) {
  WatchedObject o;
  o.expr = "buf";
  o.addr = core::RemoteAddr{0x100000};
  o.length = 70000;
  ProfileOptions opts = Opts();
  opts.max_tracked_bytes = 70000;
  StorageProfile p({o}, opts);
  for (uint64_t i = 0; i < 70000; ++i) {  // 70000 distinct shapes; the cache holds 65536
    p.Add(Write(kStart, 1, 0x100000 + i, 1));
  }
  p.Add(Write(kStart, 2, 0x100000 + 69999, 1));
  EXPECT_EQ(p.field_counts(0), Rw(0, 70001));
  EXPECT_EQ(p.ByteWrites(0)[69999], 2u);
  EXPECT_EQ(p.ByteWrites(0)[65536], 1u);
  EXPECT_EQ(p.ByteWrites(0)[0], 1u);
  EXPECT_EQ(p.lines()[69999 / 64].writers.size(), 2u);
}

}  // namespace
}  // namespace kwatch::watch::profile
