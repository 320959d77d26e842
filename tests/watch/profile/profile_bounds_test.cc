// The storage profile's memory follows what was accessed, not the product of what a recording
// declares (a recording is a file people share: thousands of fields, threads and watches cost
// what their accesses need). Asserts on structure sizes, and exact counts alongside.
#include <cstdint>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/watch/profile/profile_test_util.h"
#include "watch/profile/report_rows.h"
#include "watch/profile/storage_profile.h"

namespace kwatch::watch::profile {
namespace {

using testing::Write;

constexpr uint64_t kBase = 0x100000;
constexpr uint64_t kStart = 1'000'000'000;

// One object of `n` int fields (".fI" at 4*I).
WatchedObject Wide(uint32_t n, uint32_t id = 0, uint64_t addr = kBase) {
  WatchedObject o;
  o.id = id;
  o.expr = "g" + std::to_string(id);
  o.addr = core::RemoteAddr{addr};
  o.length = 4ULL * n;
  o.type_name = "struct wide";
  o.fields.reserve(n);
  for (uint32_t i = 0; i < n; ++i) {
    o.fields.push_back({".f" + std::to_string(i), "int", 4ULL * i, 4, 0, 0, 0, true});
  }
  return o;
}

ProfileOptions Opts() {
  ProfileOptions o;
  o.start_ns = kStart;
  return o;
}

TEST(ProfileBounds, FortyThousandFieldsHoldTimeColumnsOnlyForTheAccessedOnes) {
  StorageProfile p({Wide(40000)}, Opts());
  // Three threads write two fields: .f7 (twice) and .f39999.
  p.Add(Write(kStart + 10, 1, kBase + 4 * 7, 4));
  p.Add(Write(kStart + 20, 2, kBase + 4 * 7, 4));
  p.Add(Write(kStart + 30, 3, kBase + 4 * 39999, 4));
  EXPECT_EQ(p.fields().size(), 40000u);
  EXPECT_EQ(p.bins().rows(),
            2 * 40000u + 2 * 3);  // every field's rows, one pair per (thread, field)
  // Counters only where counted: full rows for the writes of .f7 and .f39999, one (column,
  // count) pair for each of the three (thread, field) pairs. Before, all 80006 rows held 240
  // counters each (150 MB).
  EXPECT_EQ(p.bins().counted_rows(), 2u);
  EXPECT_EQ(p.bins().sparse_cells(), 3u);
  EXPECT_EQ(p.thread_field_pairs(), 3u);
  EXPECT_EQ(p.field_counts(7).writes, 2u);
  EXPECT_EQ(p.FieldThreadCount(7), 2u);
  EXPECT_EQ(p.FieldThreadCount(39999), 1u);
  EXPECT_EQ(p.FieldThreadCount(8), 0u);
  EXPECT_EQ(p.ThreadFieldCounts(1, 7).writes, 1u);
  EXPECT_EQ(p.ThreadFieldCounts(1, 39999).writes, 0u);
  EXPECT_THAT(p.FieldBins(8, true), ::testing::Each(0u));
  EXPECT_EQ(p.FieldBins(7, true)[0], 2u);  // all in the first 1 ms column
}

TEST(ProfileBounds, ThousandsOfThreadsCostTheirAccessedFieldsOnly) {
  // 4000 fields x 5000 threads, each thread writing one field once: the per-thread views hold
  // 5000 pairs (the dense [thread x field] tables held 20 million).
  StorageProfile p({Wide(4000)}, Opts());
  for (uint32_t t = 0; t < 5000; ++t) {
    p.Add(Write(kStart + t, static_cast<pid_t>(1000 + t), kBase + 4 * (t % 4000), 4));
  }
  EXPECT_EQ(p.threads().size(), 5000u);
  EXPECT_EQ(p.thread_field_pairs(), 5000u);
  EXPECT_EQ(p.bins().counted_rows(), 4000u);  // the fields' writes
  EXPECT_EQ(p.bins().sparse_cells(), 5000u);  // one column for each thread's one write
  EXPECT_EQ(p.FieldThreadCount(0), 2u);       // threads 1000 and 5000
  EXPECT_EQ(p.FieldThreadCount(3999), 1u);
  const std::vector<std::pair<uint32_t, RwCounts>> f = p.ThreadFields(p.ThreadIndex(5000));
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].first, 0u);
  EXPECT_EQ(f[0].second.writes, 1u);

  // The report rows: one thread row per thread, each with its one field.
  const ReportRows rows = BuildReportRows(p, {});
  ASSERT_EQ(rows.watches.size(), 1u);
  EXPECT_EQ(rows.watches[0].threads.size(), 5000u);
  EXPECT_EQ(rows.watches[0].fields[0].threads, 2u);
  for (const ThreadRow& t : rows.watches[0].threads) {
    ASSERT_EQ(t.fields.size(), 1u);
    EXPECT_EQ(t.total.writes, 1u);
  }
  // One thread selected: its counts only.
  ReportSelection sel;
  sel.threads = {1000};
  const ReportRows one = BuildReportRows(p, sel);
  EXPECT_EQ(one.watches[0].fields[0].counts.writes, 1u);
  EXPECT_EQ(one.watches[0].fields[0].threads, 1u);
  EXPECT_EQ(one.watches[0].fields[1].counts.writes, 0u);
  ASSERT_EQ(one.watches[0].threads.size(), 1u);
  EXPECT_EQ(p.threads()[one.watches[0].threads[0].thread].tid, 1000);
}

TEST(ProfileBounds, ManyThreadsWritingOneLineAreFoundByIndex) {
  // 20000 threads take turns writing two fields of one line (each thread one write): every
  // write after the first is a false-sharing transfer. Finding the previous writer is a hash
  // lookup (it was a scan of all the line's writers: quadratic in threads).
  StorageProfile p({Wide(4)}, Opts());
  for (uint32_t t = 0; t < 20000; ++t) {
    p.Add(Write(kStart + t, static_cast<pid_t>(1000 + t), kBase + 4 * (t % 2), 4));
  }
  ASSERT_EQ(p.lines().size(), 1u);
  const CacheLine& line = p.lines()[0];
  EXPECT_EQ(line.writers.size(), 20000u);
  EXPECT_EQ(line.writer_index.size(), 20000u);
  EXPECT_EQ(line.writes, 20000u);
  EXPECT_EQ(line.false_transfers, 19999u);
  EXPECT_EQ(line.true_transfers, 0u);
  for (const LineWriter& w : line.writers) {
    ASSERT_EQ(w.field_writes.size(), 1u);  // one (position, writes) pair: what it wrote
    EXPECT_EQ(w.field_writes[0].second, 1u);
  }
}

TEST(ProfileBounds, PerByteCountsShareOneBudget) {
  // 100 objects of 64 KiB: together they would take 100 x 64 KiB x 16 bytes of counters.
  std::vector<WatchedObject> objects;
  for (uint32_t i = 0; i < 100; ++i) {
    WatchedObject o;
    o.id = i;
    o.expr = "big" + std::to_string(i);
    o.addr = core::RemoteAddr{kBase + (uint64_t{i} << 20)};
    o.length = 64 * 1024;
    objects.push_back(o);
  }
  const ProfileOptions opts = Opts();
  StorageProfile p(objects, opts);
  uint64_t tracked = 0;
  for (uint32_t i = 0; i < 100; ++i) {
    tracked += p.ByteWrites(i).size();
  }
  EXPECT_EQ(tracked, opts.max_tracked_total);
  EXPECT_EQ(p.ByteWrites(0).size(), 64u * 1024);
  EXPECT_EQ(p.ByteWrites(15).size(), 64u * 1024);  // 16 objects fill 1 MiB
  EXPECT_EQ(p.ByteWrites(16).size(), 0u);
  // Field counts still cover every object.
  p.Add(Write(kStart, 1, kBase + (uint64_t{99} << 20) + 5, 1, 0x401000, 99));
  EXPECT_EQ(p.field_counts(99).writes, 1u);
  EXPECT_EQ(p.object_stats(99).total.writes, 1u);
}

TEST(ProfileBounds, OverlappingFieldsJoinLinesUpToTheCap) {
  // 3000 fields each covering the same 64 KiB (only a crafted layout overlaps like this): they
  // would put 3000 x 1024 memberships in the cache lines.
  WatchedObject o;
  o.expr = "u";
  o.addr = core::RemoteAddr{kBase};
  o.length = 64 * 1024;
  for (int i = 0; i < 3000; ++i) {
    o.fields.push_back({".alt" + std::to_string(i), "char[65536]", 0, 64 * 1024, 0, 0, 0, true});
  }
  ProfileOptions opts = Opts();
  opts.max_line_members = 100'000;
  StorageProfile p({o}, opts);
  size_t members = 0;
  for (const CacheLine& l : p.lines()) {
    members += l.fields.size();
  }
  EXPECT_LE(members, opts.max_line_members);
  EXPECT_EQ(members, 97u * 1024);  // the first 97 fields fit whole
  p.Add(Write(kStart, 1, kBase + 100, 8));
  EXPECT_EQ(p.field_counts(2999).writes, 1u);  // counted, though outside the lines
}

}  // namespace
}  // namespace kwatch::watch::profile
