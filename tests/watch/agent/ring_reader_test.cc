#include "watch/agent/ring_reader.h"

#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "agent/abi.h"
#include "core/base/clock.h"
#include "watch/agent/tsc_clock.h"

namespace kwatch::watch::agent {
namespace {

namespace ka = kwatch::agent;

constexpr uint32_t kRingBytes = 4096;

// A ring and a producer that writes as agent/abi.h says the agent does: records 8-aligned,
// sizes multiples of 8, never across the end (a pad of which only 8 bytes are written fills
// it), head published after the record; a record that does not fit is counted in `lost`.
class TestRing {
 public:
  TestRing() : mem_((sizeof(ka::KwRing) + kRingBytes) / 8, 0) {}
  ka::KwRing& ring() { return *reinterpret_cast<ka::KwRing*>(mem_.data()); }
  uint8_t* data() { return reinterpret_cast<uint8_t*>(mem_.data()) + sizeof(ka::KwRing); }

  // A hit record of probe `probe` with one argument of `arg_bytes` bytes (value `fill`).
  bool Produce(uint32_t probe, uint32_t arg_bytes, uint8_t fill) {
    const uint32_t size = static_cast<uint32_t>(sizeof(ka::KwRecord) + sizeof(ka::KwArgHeader) +
                                                ((arg_bytes + 7) & ~7u));
    uint64_t head = ring().head.load(std::memory_order_relaxed);
    const uint64_t tail = ring().tail.load(std::memory_order_acquire);
    const uint64_t at = head & (kRingBytes - 1);
    const uint64_t pad = kRingBytes - at < size ? kRingBytes - at : 0;
    if (head + pad + size - tail > kRingBytes) {
      ring().lost.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    if (pad != 0) {
      const uint16_t type = ka::kKwRecordPad;
      const auto pad_size = static_cast<uint32_t>(pad);
      std::memcpy(data() + at, &type, 2);
      std::memset(data() + at + 2, 0, 2);
      std::memcpy(data() + at + 4, &pad_size, 4);
      std::memset(data() + at + 8, 0xee, pad - 8);  // garbage the reader must not look at
      head += pad;
    }
    uint8_t* p = data() + (head & (kRingBytes - 1));
    ka::KwRecord r{};
    r.type = ka::kKwRecordHit;
    r.size = size;
    r.probe_index = probe;
    r.tid = 42;
    r.tsc = 1000 + probe;
    r.ip = 0x401000 + probe;
    std::memcpy(p, &r, sizeof(r));
    ka::KwArgHeader h{.arg = 0, .status = 0, .len = arg_bytes};
    std::memcpy(p + sizeof(r), &h, sizeof(h));
    std::memset(p + sizeof(r) + sizeof(h), fill, arg_bytes);
    ring().head.store(head + size, std::memory_order_release);
    return true;
  }

 private:
  std::vector<uint64_t> mem_;
};

struct Seen {
  uint32_t probe;
  uint64_t ip;
  std::vector<uint8_t> arg;
};

absl::StatusOr<DrainStats> DrainAll(TestRing& t, uint64_t& last_lost, std::vector<Seen>& seen) {
  return DrainRing(t.ring(), kRingBytes, last_lost,
                   [&](const ka::KwRecord& r, std::span<const uint8_t> payload) {
                     auto args = ParseArgs(payload);
                     ASSERT_TRUE(args.ok()) << args.status();
                     ASSERT_EQ(args->size(), 1u);
                     seen.push_back(Seen{
                         r.probe_index, r.ip,
                         std::vector<uint8_t>((*args)[0].bytes.begin(), (*args)[0].bytes.end())});
                   });
}

TEST(DrainRing, ReadsRecordsInOrderAcrossTheWrapSkippingPads) {
  TestRing t;
  uint64_t last_lost = 0;
  std::vector<Seen> seen;
  uint32_t produced = 0;
  uint64_t pads = 0;
  // Records of 72 bytes (40 + 8 + 24): 4096 is no multiple of 72, so every pass of the ring
  // ends in a pad. Drain every 10 records, 20 times: many wraps.
  for (int round = 0; round < 20; ++round) {
    for (int i = 0; i < 10; ++i) {
      ASSERT_TRUE(t.Produce(produced, 20, static_cast<uint8_t>(produced)));
      ++produced;
    }
    auto stats = DrainAll(t, last_lost, seen);
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_EQ(stats->records, 10u);
    EXPECT_EQ(stats->lost, 0u);
    pads += stats->pads;
  }
  EXPECT_GT(pads, 0u);
  ASSERT_EQ(seen.size(), produced);
  for (uint32_t i = 0; i < produced; ++i) {
    EXPECT_EQ(seen[i].probe, i);
    EXPECT_EQ(seen[i].ip, 0x401000u + i);
    EXPECT_EQ(seen[i].arg, std::vector<uint8_t>(20, static_cast<uint8_t>(i)));
  }
  EXPECT_EQ(t.ring().tail.load(), t.ring().head.load());
}

TEST(DrainRing, AFullRingCountsLostRecordsAndTheReaderSaysHowMany) {
  TestRing t;
  uint64_t last_lost = 0;
  std::vector<Seen> seen;
  uint32_t kept = 0;
  uint32_t dropped = 0;
  for (uint32_t i = 0; i < 100; ++i) {
    (t.Produce(i, 20, 1) ? kept : dropped) += 1;
  }
  EXPECT_EQ(kept, 4096u / 72);  // 56 fit before the pad would be needed
  EXPECT_EQ(dropped, 100u - kept);
  auto stats = DrainAll(t, last_lost, seen);
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->records, kept);
  EXPECT_EQ(stats->lost, dropped);
  // Room again; the count is not reported twice.
  ASSERT_TRUE(t.Produce(500, 20, 2));
  stats = DrainAll(t, last_lost, seen);
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->records, 1u);
  EXPECT_EQ(stats->pads, 1u);  // 56 x 72 = 4032: 64 bytes of pad before it
  EXPECT_EQ(stats->lost, 0u);
  EXPECT_EQ(seen.back().probe, 500u);
}

TEST(DrainRing, GarbageIsReportedAndSkipped) {
  TestRing t;
  uint64_t last_lost = 0;
  std::vector<Seen> seen;
  ASSERT_TRUE(t.Produce(1, 8, 1));
  // A second record whose size is not a multiple of 8.
  const uint64_t head = t.ring().head.load();
  ASSERT_TRUE(t.Produce(2, 8, 2));
  const uint32_t bad = 41;
  std::memcpy(t.data() + head + 4, &bad, 4);
  auto stats = DrainAll(t, last_lost, seen);
  ASSERT_FALSE(stats.ok());
  EXPECT_EQ(stats.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(std::string(stats.status().message()).find("a record of 41 bytes"), std::string::npos);
  EXPECT_EQ(seen.size(), 1u);
  EXPECT_EQ(t.ring().tail.load(), t.ring().head.load());  // skipped: the next drain is clean
  ASSERT_TRUE(t.Produce(3, 8, 3));
  stats = DrainAll(t, last_lost, seen);
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(seen.back().probe, 3u);
  // A head behind the tail.
  t.ring().head.store(t.ring().tail.load() - 8);
  EXPECT_EQ(DrainAll(t, last_lost, seen).status().code(), absl::StatusCode::kDataLoss);
}

TEST(ParseArgs, ArgumentsArePaddedToEightBytes) {
  std::vector<uint8_t> payload;
  const auto add = [&](uint16_t arg, uint16_t status, std::vector<uint8_t> bytes) {
    ka::KwArgHeader h{.arg = arg, .status = status, .len = static_cast<uint32_t>(bytes.size())};
    const auto* hp = reinterpret_cast<const uint8_t*>(&h);
    payload.insert(payload.end(), hp, hp + sizeof(h));
    bytes.resize((bytes.size() + 7) & ~size_t{7}, 0);
    payload.insert(payload.end(), bytes.begin(), bytes.end());
  };
  add(0, 0, {1, 2, 3});
  add(1, 1, {});
  add(2, 2, {9, 9, 9, 9, 9, 9, 9, 9, 9});
  auto args = ParseArgs(payload);
  ASSERT_TRUE(args.ok()) << args.status();
  ASSERT_EQ(args->size(), 3u);
  EXPECT_EQ((*args)[0].bytes.size(), 3u);
  EXPECT_EQ((*args)[0].bytes[2], 3);
  EXPECT_EQ((*args)[1].status, 1);
  EXPECT_TRUE((*args)[1].bytes.empty());
  EXPECT_EQ((*args)[2].arg, 2);
  EXPECT_EQ((*args)[2].bytes.size(), 9u);
  payload.resize(payload.size() - 16);
  EXPECT_EQ(ParseArgs(payload).status().code(), absl::StatusCode::kDataLoss);
}

TEST(TscClock, ConvertsOnTheLineThroughItsSamples) {
  // 3 ticks a nanosecond.
  TscClock clock(TscSample{.tsc = 3'000'000, .mono_ns = 1'000'000},
                 TscSample{.tsc = 6'000'000, .mono_ns = 2'000'000});
  EXPECT_EQ(clock.ToMonotonicNs(6'000'000), 2'000'000u);
  EXPECT_EQ(clock.ToMonotonicNs(6'000'300), 2'000'100u);
  EXPECT_EQ(clock.ToMonotonicNs(4'500'000), 1'500'000u);
  EXPECT_DOUBLE_EQ(clock.ticks_per_us(), 3000.0);
  clock.AddSample(TscSample{.tsc = 9'000'000, .mono_ns = 3'000'000});
  EXPECT_EQ(clock.ToMonotonicNs(9'000'030), 3'000'010u);
}

TEST(TscClock, AgreesWithClockMonotonicHere) {
  TscClock clock;
  const uint64_t before = core::MonotonicNs();
  const uint64_t tsc = ReadTsc();
  const uint64_t after = core::MonotonicNs();
  const uint64_t at = clock.ToMonotonicNs(tsc);
  // The conversion of a TSC read between two clock reads lands between them, give or take
  // the calibration's error over a millisecond's baseline (a few microseconds).
  EXPECT_GE(at + 50'000, before);
  EXPECT_LE(at, after + 50'000);
}

}  // namespace
}  // namespace kwatch::watch::agent
