// core/store/hit_blocks.h and the recordings that store their probe hits in blocks (schema 8):
// every field round-trips (arguments with repeated, new and empty names and values, strings with
// any byte); reads in time order, with every filter, give exactly what the same hits stored as
// rows give (the reference), also when batches overlap in time; small batches are merged into
// blocks of thousands and big arguments split blocks; `kwatch export --sql` gives one `hits`
// row per hit; a damaged block is a clear error.
#include "core/store/hit_blocks.h"

#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "core/store/trace_reader.h"
#include "core/store/trace_writer.h"
#include "tests/core/store/block_recordings.h"
#include "tests/scratch_store.h"

namespace kwatch::core::store {
namespace {

using testing::kStart;

class TempDir : public ::kwatch::testing::ScratchDir {
 public:
  TempDir() : ScratchDir("kwatch_hit_blocks") {}
};

// Every shape: unknown CPU, return probes, stacks, no arguments, kernel-looking addresses,
// negative deltas everywhere, tids below their pid, strings with quotes, NUL and high bytes.
HitRecord MakeHit(uint64_t i, uint64_t t) {
  HitRecord h;
  h.time_ns = t;
  h.pid = i % 29 == 0 ? 17 : 4242;
  h.tid = static_cast<pid_t>(4242 + (i % 5) - 2);
  h.cpu = i % 5 == 4 ? kUnknownCpu : static_cast<uint32_t>(i % 3);
  h.probe_id = static_cast<uint32_t>(i % 3);
  h.ip = RemoteAddr{i % 7 == 6 ? 0xffffffff81000000ULL + i : 0x555555554000ULL + (i % 11) * 0x10};
  h.is_return = i % 4 == 1;
  h.stack_id = i % 6 == 0 ? static_cast<uint32_t>(1 + i % 13) : 0;
  if (h.probe_id == 0) {
    h.args = {{"i", absl::StrCat(i)}, {"r->len", absl::StrCat(100 + i % 4)}};
  } else if (h.probe_id == 1) {
    h.args = {{"name", i % 3 == 0 ? std::string("\"GET /\\n\"") : std::string("a\0\xff\"", 4)},
              {"", ""},
              {"name", absl::StrCat("0x", i)}};
  }  // probe 2: no arguments
  if (h.is_return) {
    h.args.emplace_back("$retval", absl::StrCat(-static_cast<int64_t>(i)));
  }
  return h;
}

void ExpectSameHits(const std::vector<HitRecord>& got, const std::vector<HitRecord>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i], want[i]) << "hit " << i << " time " << got[i].time_ns << " vs "
                               << want[i].time_ns;
  }
}

void Write(const std::string& path, const std::vector<std::vector<HitRecord>>& batches,
           EventStorage storage) {
  testing::WriteBatches(path, batches, storage);
}

std::vector<HitRecord> ReadAll(const std::string& path, const HitFilter& f = {}) {
  return testing::ReadRecords<HitRecord>(path, f);
}

std::string Sql(const std::string& path, const std::string& sql) {
  return ::kwatch::testing::SqlText(path, sql);
}

std::vector<std::vector<HitRecord>> InOrderBatches() {
  return testing::InOrderBatches<HitRecord>(MakeHit);
}

TEST(HitBlocksTest, EncodeDecodeKeepsEveryField) {
  std::vector<HitRecord> hits;
  for (uint64_t i = 0; i < 5000; ++i) {
    hits.push_back(MakeHit(i, kStart + (i * 7919) % 100000));  // not in time order
  }
  const std::string block = EncodeHitBlock(hits);
  std::vector<HitRecord> back = {MakeHit(99, 1)};  // appended after what is there
  ASSERT_TRUE(DecodeHitBlock(block, hits.size(), &back).ok());
  ASSERT_EQ(back.size(), hits.size() + 1);
  EXPECT_EQ(back[0], MakeHit(99, 1));
  back.erase(back.begin());
  ExpectSameHits(back, hits);
  // Two integer arguments a hit, in time order: a few bytes each.
  std::vector<HitRecord> loop;
  for (uint64_t i = 0; i < 8192; ++i) {
    HitRecord h;
    h.time_ns = kStart + i * 70;
    h.pid = 4242;
    h.tid = 4243;
    h.probe_id = 1;
    h.ip = RemoteAddr{0x555555555149};
    h.args = {{"i", absl::StrCat(i)}, {"r->len", "100"}};
    loop.push_back(h);
  }
  EXPECT_LT(EncodeHitBlock(loop).size(), 8192U * 4);
}

TEST(HitBlocksTest, DamagedBlocksAreRefused) {
  std::vector<HitRecord> hits;
  for (uint64_t i = 0; i < 100; ++i) {
    hits.push_back(MakeHit(i, kStart + i));
  }
  const std::string block = EncodeHitBlock(hits);
  std::vector<HitRecord> out;
  EXPECT_EQ(DecodeHitBlock(block, 70000, &out).message(),
            "a hit block says it holds 70000 hits; a block holds 1 to 65536");
  EXPECT_EQ(DecodeHitBlock(block, 99, &out).message(), "a hit block is truncated or damaged");
  EXPECT_EQ(DecodeHitBlock(block, 101, &out).message(), "a hit block is truncated or damaged");
  EXPECT_EQ(DecodeHitBlock("not zstd at all", 100, &out).message(), "a hit block is not zstd data");
  EXPECT_EQ(DecodeHitBlock(block.substr(0, block.size() - 3), 100, &out).message(),
            "a hit block does not decompress: Src size is incorrect");
  EXPECT_TRUE(out.empty());
}

TEST(HitBlocksTest, ReadsAsRowsDoWithEveryFilter) {
  TempDir dir;
  const std::string blocks = dir.File("blocks.kwdb");
  const std::string rows = dir.File("rows.kwdb");
  const auto batches = InOrderBatches();
  Write(blocks, batches, EventStorage::kBlocks);
  Write(rows, batches, EventStorage::kRows);
  EXPECT_EQ(Sql(blocks, "SELECT hit_blocks, hits_in_order, hit_count FROM session"), "1 1 30000");
  EXPECT_EQ(Sql(blocks, "SELECT count(*) FROM hits"), "0");
  // Batches of 1000 merge with the small block before them: 15 blocks of 2000.
  EXPECT_EQ(Sql(blocks, "SELECT count(*), min(count), max(count), sum(count) FROM hit_blocks"),
            "15 2000 2000 30000");
  std::vector<HitRecord> all;
  for (const auto& b : batches) {
    all.insert(all.end(), b.begin(), b.end());
  }
  ExpectSameHits(ReadAll(blocks), all);
  ExpectSameHits(ReadAll(rows), all);
  std::vector<HitFilter> filters(5);
  filters[0].from_ns = kStart + 4'000'000;
  filters[1].to_ns = kStart + 1'000'000;
  filters[2].from_ns = kStart + 7'777'000;
  filters[2].to_ns = kStart + 9'123'000;
  filters[3].tid = 4243;
  filters[4].probe_id = 1;
  filters[4].from_ns = kStart + 20'000'000;
  for (size_t i = 0; i < filters.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("filter ", i));
    const std::vector<HitRecord> want = ReadAll(rows, filters[i]);
    EXPECT_FALSE(want.empty());
    ExpectSameHits(ReadAll(blocks, filters[i]), want);
    auto rb = TraceReader::Open(blocks);
    ASSERT_TRUE(rb.ok());
    EXPECT_EQ(*(*rb)->CountHits(filters[i]), want.size());
  }
  auto rb = TraceReader::Open(blocks);
  ASSERT_TRUE(rb.ok());
  EXPECT_EQ(*(*rb)->CountHits(), 30000U);
}

TEST(HitBlocksTest, OverlappingBatchesMergeInTimeOrderAndBigArgumentsSplitBlocks) {
  TempDir dir;
  const std::string blocks = dir.File("blocks.kwdb");
  const std::string rows = dir.File("rows.kwdb");
  std::vector<std::vector<HitRecord>> batches(3);
  uint64_t i = 0;
  for (uint64_t k = 0; k < 3000; ++k, ++i) {
    batches[0].push_back(MakeHit(i, kStart + 1000 + k * 3));
  }
  for (uint64_t k = 0; k < 2000; ++k, ++i) {
    batches[1].push_back(MakeHit(i, kStart + k * 4));
  }
  // 5000 hits of 1 KiB of arguments: blocks of at most 4 MiB before compression.
  for (uint64_t k = 0; k < 5000; ++k, ++i) {
    HitRecord h = MakeHit(i, kStart + 500 + (k * 37) % 20000);
    h.args.emplace_back("buf", std::string(1000, static_cast<char>('a' + k % 26)));
    batches[2].push_back(h);
  }
  Write(blocks, batches, EventStorage::kBlocks);
  Write(rows, batches, EventStorage::kRows);
  EXPECT_EQ(Sql(blocks, "SELECT hits_in_order FROM session"), "0");
  EXPECT_EQ(Sql(blocks, "SELECT count(*) > 3, sum(count) FROM hit_blocks"), "1 10000");
  EXPECT_EQ(Sql(blocks, "SELECT max(count) < 5000 FROM hit_blocks WHERE first_index > 5000"), "1");
  ExpectSameHits(ReadAll(blocks), ReadAll(rows));
  HitFilter f;
  f.from_ns = kStart + 3000;
  f.to_ns = kStart + 9000;
  f.tid = 4242;
  ExpectSameHits(ReadAll(blocks, f), ReadAll(rows, f));
}

TEST(HitBlocksTest, ExportGivesOneRowPerHit) {
  TempDir dir;
  const std::string blocks = dir.File("blocks.kwdb");
  const std::string out = dir.File("rows.kwdb");
  Write(blocks, InOrderBatches(), EventStorage::kBlocks);
  auto r = TraceReader::Open(blocks);
  ASSERT_TRUE(r.ok());
  auto n = ExportEventRows(**r, out);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 0U);  // events written as rows: this recording has hits only
  EXPECT_EQ(Sql(out, "SELECT count(*), min(rowid), max(rowid) FROM hits"), "30000 1 30000");
  EXPECT_EQ(Sql(out, "SELECT hit_blocks, (SELECT count(*) FROM hit_blocks) FROM session"), "0 0");
  // Today's columns: args as JSON that SQLite reads, NULL for an unknown cpu and no stack.
  EXPECT_EQ(Sql(out,
                "SELECT json_extract(args, '$.i'), json_extract(args, '$.\"r->len\"'), "
                "cpu IS NULL, stack_id IS NULL, is_return, json_extract(args, '$.\"$retval\"') "
                "FROM hits WHERE rowid = 10"),
            "9 101 1 1 1 -9");
  ExpectSameHits(ReadAll(out), ReadAll(blocks));
}

TEST(HitBlocksTest, DamagedBlockInARecordingIsAClearError) {
  TempDir dir;
  const std::string path = dir.File("damaged.kwdb");
  Write(path, InOrderBatches(), EventStorage::kBlocks);
  Sql(path, "UPDATE hit_blocks SET data = x'28b52ffd00' WHERE first_index = 4001");
  auto r = TraceReader::Open(path);
  ASSERT_TRUE(r.ok());
  uint64_t seen = 0;
  const absl::Status s = (*r)->ForEachHit({}, [&](const HitRecord&) {
    ++seen;
    return true;
  });
  EXPECT_EQ(seen, 4000U);  // the blocks before the damage
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(s.message(), absl::StrCat("not a kwatch recording or corrupted: ", path,
                                      ": a hit block is not zstd data"));
}

}  // namespace
}  // namespace kwatch::core::store
