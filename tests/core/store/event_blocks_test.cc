// core/store/event_blocks.h and the recordings that store their events in blocks (schema 7):
// every column round-trips; reads in time order, with every filter, give exactly what the same
// events stored as rows give (the reference), also when batches overlap in time; small batches
// are merged into blocks of thousands; `kwatch export --sql`'s rows read the same; a damaged
// block is a clear error.
#include "core/store/event_blocks.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <limits>
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
constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();

class TempDir : public ::kwatch::testing::ScratchDir {
 public:
  TempDir() : ScratchDir("kwatch_blocks") {}
};

// Every shape: unknown CPU, trap_ip apart from ip, values absent, present and all-ones, old
// values, every kind, kernel addresses, negative deltas everywhere, tids below their pid.
AccessEvent MakeEvent(uint64_t i, uint64_t t) {
  AccessEvent e;
  e.time_ns = t;
  e.pid = i % 29 == 0 ? 17 : 4242;
  e.tid = static_cast<pid_t>(4242 + (i % 5) - 2);
  e.cpu = i % 5 == 4 ? kUnknownCpu : static_cast<uint32_t>(i % 3);
  e.watch_id = static_cast<uint32_t>(i % 3);
  e.ip = RemoteAddr{i % 7 == 6 ? 0xffffffff81000000ULL + i : 0x555555554000ULL + (i % 11) * 0x10};
  e.trap_ip = i % 4 == 0 ? e.ip : e.ip + 3;
  e.addr = RemoteAddr{i % 11 == 10 ? 0xffffffff82a0c000ULL : 0x555555558010ULL};
  e.len = i % 2 == 0 ? 8 : 4096;
  e.access_addr = e.addr + (i % 8);
  e.access_size = static_cast<uint32_t>(i % 9);
  e.kind = static_cast<AccessKind>(i % 3);
  if (i % 6 != 5) {
    e.value = i % 13 == 0 ? kMax : (i % 3 == 0 ? i * 0x1001 : kMax - i);
  }
  if (i % 2 == 1) {
    e.old_value = i % 17 == 1 ? kMax : i;
  }
  e.value_exact = i % 2 == 1;
  return e;
}

bool Same(const AccessEvent& a, const AccessEvent& b) {
  return a.time_ns == b.time_ns && a.pid == b.pid && a.tid == b.tid && a.cpu == b.cpu &&
         a.watch_id == b.watch_id && a.ip == b.ip && a.trap_ip == b.trap_ip && a.addr == b.addr &&
         a.len == b.len && a.access_addr == b.access_addr && a.access_size == b.access_size &&
         a.kind == b.kind && a.value == b.value && a.old_value == b.old_value &&
         a.value_exact == b.value_exact;
}

void ExpectSameEvents(const std::vector<AccessEvent>& got, const std::vector<AccessEvent>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(Same(got[i], want[i]))
        << "event " << i << " time " << got[i].time_ns << " vs " << want[i].time_ns;
  }
}

void Write(const std::string& path, const std::vector<std::vector<AccessEvent>>& batches,
           EventStorage storage) {
  testing::WriteBatches(path, batches, storage);
}

std::vector<AccessEvent> ReadAll(const std::string& path, const EventFilter& f = {}) {
  return testing::ReadRecords<AccessEvent>(path, f);
}

std::string Sql(const std::string& path, const std::string& sql) {
  return ::kwatch::testing::SqlText(path, sql);
}

std::vector<std::vector<AccessEvent>> InOrderBatches() {
  return testing::InOrderBatches<AccessEvent>(MakeEvent);
}

TEST(EventBlocksTest, EncodeDecodeKeepsEveryColumn) {
  std::vector<AccessEvent> events;
  for (uint64_t i = 0; i < 5000; ++i) {
    events.push_back(MakeEvent(i, kStart + (i * 7919) % 100000));  // not in time order
  }
  const std::string block = EncodeEventBlock(events);
  std::vector<AccessEvent> back = {MakeEvent(99, 1)};  // appended after what is there
  ASSERT_TRUE(DecodeEventBlock(block, events.size(), &back).ok());
  ASSERT_EQ(back.size(), events.size() + 1);
  back.erase(back.begin());
  ExpectSameEvents(back, events);
}

TEST(EventBlocksTest, DamagedBlocksAreRefused) {
  std::vector<AccessEvent> events;
  for (uint64_t i = 0; i < 100; ++i) {
    events.push_back(MakeEvent(i, kStart + i));
  }
  const std::string block = EncodeEventBlock(events);
  std::vector<AccessEvent> out;
  EXPECT_EQ(DecodeEventBlock(block, 70000, &out).message(),
            "an event block says it holds 70000 events; a block holds 1 to 65536");
  EXPECT_EQ(DecodeEventBlock(block, 99, &out).message(), "an event block is truncated or damaged");
  EXPECT_EQ(DecodeEventBlock("not zstd at all", 100, &out).message(),
            "an event block is not zstd data");
  EXPECT_EQ(DecodeEventBlock(block.substr(0, block.size() - 3), 100, &out).message(),
            "an event block does not decompress: Src size is incorrect");
  EXPECT_TRUE(out.empty());
  // 1 event claimed, 100 inside: more than one event's bytes.
  EXPECT_EQ(DecodeEventBlock(block, 1, &out).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(out.empty());
}

TEST(EventBlocksTest, ReadsAsRowsDoWithEveryFilter) {
  TempDir dir;
  const std::string blocks = dir.File("blocks.kwdb");
  const std::string rows = dir.File("rows.kwdb");
  const auto batches = InOrderBatches();
  Write(blocks, batches, EventStorage::kBlocks);
  Write(rows, batches, EventStorage::kRows);
  EXPECT_EQ(Sql(blocks, "SELECT event_blocks, events_in_order FROM session"), "1 1");
  EXPECT_EQ(Sql(blocks, "SELECT count(*) FROM events"), "0");
  // Batches of 1000 merge with the small block before them: 15 blocks of 2000.
  EXPECT_EQ(Sql(blocks, "SELECT count(*), min(count), max(count), sum(count) FROM event_blocks"),
            "15 2000 2000 30000");
  EXPECT_EQ(Sql(blocks,
                "SELECT group_concat(first_index) FROM (SELECT first_index FROM "
                "event_blocks ORDER BY id LIMIT 3)"),
            "1,2001,4001");
  std::vector<AccessEvent> all;
  for (const auto& b : batches) {
    all.insert(all.end(), b.begin(), b.end());
  }
  ExpectSameEvents(ReadAll(blocks), all);
  std::vector<EventFilter> filters(8);
  filters[0].from_ns = kStart + 4'000'000;
  filters[1].to_ns = kStart + 1'000'000;
  filters[2].from_ns = kStart + 7'777'000;
  filters[2].to_ns = kStart + 9'123'000;
  filters[3].tid = 4243;
  filters[4].watch_id = 2;
  filters[5].first_index = 4001;
  filters[6].first_index = 1999;
  filters[6].last_index = 2002;
  filters[7].from_ns = kStart + 100'000;
  filters[7].last_index = 500;
  for (size_t i = 0; i < filters.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("filter ", i));
    const std::vector<AccessEvent> want = ReadAll(rows, filters[i]);
    EXPECT_FALSE(want.empty() && i != 7);
    ExpectSameEvents(ReadAll(blocks, filters[i]), want);
    auto rb = TraceReader::Open(blocks);
    ASSERT_TRUE(rb.ok());
    EXPECT_EQ(*(*rb)->CountEvents(filters[i]), want.size());
  }
  EXPECT_EQ(ReadAll(rows, filters[6]).size(), 4U);
  auto rb = TraceReader::Open(blocks);
  ASSERT_TRUE(rb.ok());
  EXPECT_EQ(*(*rb)->CountEvents(), 30000U);
}

TEST(EventBlocksTest, OverlappingBatchesMergeInTimeOrder) {
  TempDir dir;
  const std::string blocks = dir.File("blocks.kwdb");
  const std::string rows = dir.File("rows.kwdb");
  // Three batches whose times interleave, with equal times across batches (ties go in
  // recording order), one batch of 9000 (two blocks) and one of 10 that joins the small
  // second block of the 9000 (in time order after it).
  std::vector<std::vector<AccessEvent>> batches(4);
  uint64_t i = 0;
  for (uint64_t k = 0; k < 3000; ++k, ++i) {
    batches[0].push_back(MakeEvent(i, kStart + 1000 + k * 3));
  }
  for (uint64_t k = 0; k < 2000; ++k, ++i) {
    batches[1].push_back(MakeEvent(i, kStart + k * 4));
  }
  for (uint64_t k = 0; k < 9000; ++k, ++i) {
    batches[2].push_back(MakeEvent(i, kStart + 500 + (k * 37) % 20000));
  }
  for (uint64_t k = 0; k < 10; ++k, ++i) {
    batches[3].push_back(MakeEvent(i, kStart + 30000 + k));
  }
  Write(blocks, batches, EventStorage::kBlocks);
  Write(rows, batches, EventStorage::kRows);
  EXPECT_EQ(Sql(blocks, "SELECT events_in_order FROM session"), "0");
  EXPECT_EQ(Sql(blocks, "SELECT group_concat(count) FROM event_blocks"), "3000,2000,8192,818");
  ExpectSameEvents(ReadAll(blocks), ReadAll(rows));
  EventFilter f;
  f.from_ns = kStart + 3000;
  f.to_ns = kStart + 9000;
  f.tid = 4242;
  ExpectSameEvents(ReadAll(blocks, f), ReadAll(rows, f));
  EventFilter g;
  g.first_index = 2500;
  g.last_index = 6000;
  ExpectSameEvents(ReadAll(blocks, g), ReadAll(rows, g));
  EXPECT_EQ(ReadAll(blocks, g).size(), 3501U);
}

TEST(EventBlocksTest, ExportGivesOneRowPerEvent) {
  TempDir dir;
  const std::string blocks = dir.File("blocks.kwdb");
  const std::string out = dir.File("rows.kwdb");
  const auto batches = InOrderBatches();
  Write(blocks, batches, EventStorage::kBlocks);
  auto r = TraceReader::Open(blocks);
  ASSERT_TRUE(r.ok());
  auto n = ExportEventRows(**r, out);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 30000U);
  EXPECT_EQ(Sql(out, "SELECT count(*), min(rowid), max(rowid) FROM events"), "30000 1 30000");
  EXPECT_EQ(Sql(out, "SELECT event_blocks, (SELECT count(*) FROM event_blocks) FROM session"),
            "0 0");
  // Today's columns: kind as a letter, NULL trap_ip when it is ip, NULL for an unknown cpu.
  EXPECT_EQ(Sql(out, "SELECT kind, trap_ip IS NULL, cpu IS NULL FROM events WHERE rowid = 5"),
            "w 1 1");
  ExpectSameEvents(ReadAll(out), ReadAll(blocks));
  // The target exists now: refused, left as it is.
  auto again = ExportEventRows(**r, out);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists);
}

TEST(EventBlocksTest, DamagedBlockInARecordingIsAClearError) {
  TempDir dir;
  const std::string path = dir.File("damaged.kwdb");
  Write(path, InOrderBatches(), EventStorage::kBlocks);
  Sql(path, "UPDATE event_blocks SET data = x'28b52ffd00' WHERE first_index = 4001");
  auto r = TraceReader::Open(path);
  ASSERT_TRUE(r.ok());
  uint64_t seen = 0;
  const absl::Status s = (*r)->ForEachEvent({}, [&](const AccessEvent&) {
    ++seen;
    return true;
  });
  EXPECT_EQ(seen, 4000U);  // the blocks before the damage
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(s.message(), absl::StrCat("not a kwatch recording or corrupted: ", path,
                                      ": an event block is not zstd data"));
}

TEST(EventBlocksTest, TypicalSessionTakesFewBytesPerEvent) {
  // 200,000 events of 8 threads on 2 watches at 120,000 events/s, exact values (as
  // bench/recording_bench writes), committed every 6000 events.
  TempDir dir;
  const std::string path = dir.File("typical.kwdb");
  std::vector<std::vector<AccessEvent>> batches;
  for (uint64_t i = 0; i < 200'000; ++i) {
    if (i % 6000 == 0) {
      batches.emplace_back();
    }
    AccessEvent e;
    e.time_ns = kStart + i * 8333;
    e.pid = 4242;
    e.tid = static_cast<pid_t>(4242 + (i & 7));
    e.cpu = static_cast<uint32_t>(i & 1);
    const bool table = i % 4 == 3;
    e.watch_id = table ? 1 : 0;
    e.ip = RemoteAddr{0x555555554000ULL + ((i * 7) & 255) * 0x11};
    e.trap_ip = e.ip + 3;
    e.addr = RemoteAddr{table ? 0x555555561000ULL : 0x555555560040ULL};
    e.len = table ? 4096 : 64;
    e.access_addr = e.addr + (table ? ((i * 13) & 511) * 8 : (i & 7) * 8);
    e.access_size = 8;
    e.kind = (i & 3) == 0 ? AccessKind::kRead : AccessKind::kWrite;
    e.value = i / 8;
    e.old_value = i / 8 - 1;
    e.value_exact = true;
    batches.back().push_back(e);
  }
  Write(path, batches, EventStorage::kBlocks);
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  const double per_event = static_cast<double>(st.st_size) / 200'000;
  EXPECT_LE(per_event, 16.0);
  const double data = std::stod(Sql(path, "SELECT sum(length(data)) FROM event_blocks"));
  EXPECT_LE(data / 200'000, 8.0);
}

}  // namespace
}  // namespace kwatch::core::store
