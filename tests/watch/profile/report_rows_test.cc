#include "watch/profile/report_rows.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "tests/watch/profile/profile_test_util.h"

namespace kwatch::watch::profile {
namespace {

using testing::Read;
using testing::Write;

constexpr uint64_t kStart = 1'000'000'000;

// struct s { long hits; unsigned flags : 3, mode : 5; int misses; } g at 0x1000: thread 11
// writes hits 3 times (ip 0x401010), thread 12 reads it once (0x401020) and writes flags
// once (0x401030).
StorageProfile Small() {
  WatchedObject o;
  o.id = 0;
  o.expr = "g";
  o.addr = core::RemoteAddr{0x1000};
  o.length = 16;
  o.type_name = "struct s";
  o.fields = {
      {".hits", "long", 0, 8, 0, 0, 0, true},
      {".flags", "unsigned int", 8, 4, 0, 3, 0, true},
      {".mode", "unsigned int", 8, 4, 3, 5, 0, true},
      {".misses", "int", 12, 4, 0, 0, 0, true},
  };
  ProfileOptions opts;
  opts.start_ns = kStart;
  StorageProfile p({o}, opts);
  for (uint64_t t : {100'000, 200'000, 300'000}) {
    p.Add(Write(kStart + t, 11, 0x1000, 8, 0x401010));
  }
  p.Add(Read(kStart + 1'500'000, 12, 0x1000, 8, 0x401020));
  p.Add(Write(kStart + 3'500'000, 12, 0x1008, 1, 0x401030));
  return p;
}

ReportSelection OfThreads(std::vector<pid_t> tids) {
  ReportSelection sel;
  sel.threads = std::move(tids);
  return sel;
}
ReportSelection Prefix(std::string prefix) {
  ReportSelection sel;
  sel.path_prefix = std::move(prefix);
  return sel;
}

uint64_t Sum(const std::vector<uint64_t>& v) {
  uint64_t n = 0;
  for (const uint64_t x : v) {
    n += x;
  }
  return n;
}

TEST(ReportRows, AllFieldsAllThreads) {
  const StorageProfile p = Small();
  const ReportRows rows = BuildReportRows(p, {});
  ASSERT_EQ(rows.watches.size(), 1u);
  const WatchRows& w = rows.watches[0];
  ASSERT_EQ(w.fields.size(), 4u);
  const FieldRow& hits = w.fields[0];
  EXPECT_EQ(p.fields()[hits.field].path, "g.hits");
  EXPECT_EQ(hits.counts.reads, 1u);
  EXPECT_EQ(hits.counts.writes, 3u);
  EXPECT_EQ(hits.threads, 2u);
  EXPECT_EQ(hits.reads.size(), p.bins().columns());
  EXPECT_EQ(Sum(hits.reads), 1u);
  EXPECT_EQ(Sum(hits.writes), 3u);
  ASSERT_FALSE(hits.sites.empty());
  EXPECT_EQ(hits.sites[0].ip.value, 0x401010u);
  // Sites of the watch, ranked, with the shown fields they touched.
  ASSERT_EQ(w.sites.size(), 3u);
  EXPECT_EQ(w.sites[0].site.ip.value, 0x401010u);
  EXPECT_EQ(w.sites[0].fields, (std::vector<uint32_t>{hits.field}));
  // Threads in order of appearance, non-zero fields only.
  ASSERT_EQ(w.threads.size(), 2u);
  EXPECT_EQ(p.threads()[w.threads[0].thread].tid, 11);
  EXPECT_EQ(w.threads[0].total.writes, 3u);
  EXPECT_EQ(w.threads[0].fields.size(), 1u);
  EXPECT_EQ(p.threads()[w.threads[1].thread].tid, 12);
  EXPECT_EQ(w.threads[1].total.reads, 1u);
  EXPECT_TRUE(rows.false_sharing.empty());
}

TEST(ReportRows, ThreadSelectionFiltersCountsHeatAndThreads) {
  const StorageProfile p = Small();
  const ReportRows rows = BuildReportRows(p, OfThreads({12}));
  const WatchRows& w = rows.watches[0];
  const FieldRow& hits = w.fields[0];
  EXPECT_EQ(hits.counts.reads, 1u);
  EXPECT_EQ(hits.counts.writes, 0u);
  EXPECT_EQ(hits.threads, 1u);
  EXPECT_EQ(Sum(hits.writes), 0u);
  EXPECT_EQ(Sum(hits.reads), 1u);
  EXPECT_EQ(hits.sites.size(), 2u);  // sites stay for all threads
  ASSERT_EQ(w.threads.size(), 1u);
  EXPECT_EQ(p.threads()[w.threads[0].thread].tid, 12);

  // A thread absent from the profile selects nothing.
  const ReportRows none = BuildReportRows(p, OfThreads({999}));
  EXPECT_EQ(none.watches[0].fields[0].counts.total(), 0u);
  EXPECT_TRUE(none.watches[0].threads.empty());
  const ThreadSelection sel(p, {999});
  EXPECT_TRUE(sel.filtered());
  EXPECT_EQ(Sum(sel.FieldHeat(w.fields[0].field, true)), 0u);
}

TEST(ReportRows, FieldFilterAndPathPrefix) {
  const StorageProfile p = Small();
  ReportSelection mode;
  mode.field_filter = "mode";
  const ReportRows rows = BuildReportRows(p, mode);
  ASSERT_EQ(rows.watches[0].fields.size(), 1u);
  EXPECT_EQ(p.fields()[rows.watches[0].fields[0].field].path, "g.mode");
  // The writer of hits touched no shown field.
  EXPECT_TRUE(rows.watches[0].sites[0].fields.empty());

  ReportSelection prefix;
  prefix.path_prefix = "g.hit";  // not a member boundary
  EXPECT_TRUE(BuildReportRows(p, prefix).watches[0].fields.empty());
  prefix.path_prefix = "g";
  EXPECT_EQ(BuildReportRows(p, prefix).watches[0].fields.size(), 4u);
  EXPECT_TRUE(FieldShown(Prefix("g.lines"), "g.lines[3].tag"));
  EXPECT_TRUE(FieldShown(Prefix("g.lines"), "g.lines->n"));
  EXPECT_FALSE(FieldShown(Prefix("g.lines"), "g.lines_used"));
}

TEST(ReportRows, FalseSharingKeptWhenASelectedThreadTookPart) {
  WatchedObject o;
  o.id = 0;
  o.expr = "g_pair";
  o.addr = core::RemoteAddr{0x2000};
  o.length = 16;
  o.type_name = "struct pair";
  o.fields = {{".left", "long", 0, 8, 0, 0, 0, true}, {".right", "long", 8, 8, 0, 0, 0, true}};
  ProfileOptions opts;
  opts.start_ns = kStart;
  StorageProfile p({o}, opts);
  for (int i = 0; i < 10; ++i) {
    const bool first = i % 2 == 0;
    p.Add(Write(kStart + static_cast<uint64_t>(i) * 100, first ? 21 : 22, first ? 0x2000 : 0x2008,
                8, first ? 0x401010 : 0x401020));
  }
  EXPECT_EQ(BuildReportRows(p, {}).false_sharing.size(), 1u);
  EXPECT_EQ(BuildReportRows(p, OfThreads({22})).false_sharing.size(), 1u);
  EXPECT_TRUE(BuildReportRows(p, OfThreads({33})).false_sharing.empty());
}

}  // namespace
}  // namespace kwatch::watch::profile
