#include "drmgr/range_cover.h"

#include <algorithm>
#include <climits>
#include <deque>
#include <unordered_map>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace kwatch::drmgr {
namespace {

using ::testing::ElementsAre;

core::RemoteAddr A(uint64_t v) {
  return core::RemoteAddr{v};
}
Chunk C(uint64_t addr, uint64_t len) {
  return Chunk{A(addr), len};
}

// Chunks are aligned 1/2/4/8-byte pieces, adjacent, in order, and exactly [addr, addr+len)
// (or, when `exact` is false, a contiguous superset of it).
void ExpectTiling(const std::vector<Chunk>& chunks, uint64_t addr, uint64_t len, bool exact) {
  ASSERT_FALSE(chunks.empty());
  for (size_t i = 0; i < chunks.size(); ++i) {
    const Chunk& c = chunks[i];
    ASSERT_TRUE(c.len == 1 || c.len == 2 || c.len == 4 || c.len == 8) << c.len;
    ASSERT_EQ(c.addr.value % c.len, 0U) << "unaligned chunk at " << c.addr.value;
    if (i > 0) {
      ASSERT_EQ(chunks[i - 1].end(), c.addr) << "gap or overlap";
    }
  }
  if (exact) {
    ASSERT_EQ(chunks.front().addr.value, addr);
    ASSERT_EQ(chunks.back().end().value, addr + len);
  } else {
    ASSERT_LE(chunks.front().addr.value, addr);
    ASSERT_GE(chunks.back().end().value, addr + len);
  }
}

// Fewest aligned chunks tiling [begin, end) exactly: dynamic programming over every choice of
// chunk at every position.
int TilingDp(uint64_t begin, uint64_t end) {
  std::vector<int> best(end - begin + 1, INT_MAX);
  best[end - begin] = 0;
  for (uint64_t p = end; p-- > begin;) {
    for (uint64_t s : {1, 2, 4, 8}) {
      if (p % s == 0 && p + s <= end && best[p + s - begin] != INT_MAX) {
        best[p - begin] = std::min(best[p - begin], 1 + best[p + s - begin]);
      }
    }
  }
  return best[0];
}

// Fewest aligned chunks (overlaps allowed) whose union is exactly [addr, addr+len): breadth
// first search over the sets of covered bytes. Independent of any structure of the chunks.
int CoverBfs(uint64_t addr, uint64_t len) {
  std::vector<uint32_t> masks;  // every aligned chunk inside the range, as a byte mask
  for (uint64_t s : {1, 2, 4, 8}) {
    for (uint64_t a = (addr / s) * s; a + s <= addr + len; a += s) {
      if (a >= addr) {
        masks.push_back(((uint32_t{1} << s) - 1) << (a - addr));
      }
    }
  }
  const uint32_t full = len == 32 ? ~uint32_t{0} : (uint32_t{1} << len) - 1;
  std::unordered_map<uint32_t, int> dist{{0, 0}};
  std::deque<uint32_t> queue{0};
  while (!queue.empty()) {
    const uint32_t m = queue.front();
    queue.pop_front();
    if (m == full) {
      return dist[m];
    }
    for (uint32_t c : masks) {
      if (dist.emplace(m | c, dist[m] + 1).second) {
        queue.push_back(m | c);
      }
    }
  }
  return -1;
}

TEST(MinimalCover, Examples) {
  EXPECT_THAT(MinimalCover(A(0x1000), 24), ElementsAre(C(0x1000, 8), C(0x1008, 8), C(0x1010, 8)));
  EXPECT_THAT(MinimalCover(A(0x1001), 12),
              ElementsAre(C(0x1001, 1), C(0x1002, 2), C(0x1004, 4), C(0x1008, 4), C(0x100c, 1)));
  EXPECT_THAT(MinimalCover(A(0x1005), 12),
              ElementsAre(C(0x1005, 1), C(0x1006, 2), C(0x1008, 8), C(0x1010, 1)));
  EXPECT_THAT(MinimalCover(A(0x100e), 8), ElementsAre(C(0x100e, 2), C(0x1010, 4), C(0x1014, 2)));
  EXPECT_THAT(MinimalCover(A(0x1000), 4), ElementsAre(C(0x1000, 4)));
  EXPECT_TRUE(MinimalCover(A(0x1000), 0).empty());
}

// Two aligned power-of-two chunks are nested or disjoint. So an optimal cover never needs
// overlapping chunks (the smaller one is redundant): the tilings the DP below enumerates
// include an optimal cover.
TEST(MinimalCover, AlignedChunksAreNestedOrDisjoint) {
  std::vector<Chunk> all;
  for (uint64_t s : {1, 2, 4, 8}) {
    for (uint64_t a = 0; a < 128; a += s) {
      all.push_back(C(a, s));
    }
  }
  for (const Chunk& x : all) {
    for (const Chunk& y : all) {
      const bool disjoint = x.end() <= y.addr || y.end() <= x.addr;
      const bool nested =
          (x.addr >= y.addr && x.end() <= y.end()) || (y.addr >= x.addr && y.end() <= x.end());
      ASSERT_TRUE(disjoint || nested);
    }
  }
}

TEST(MinimalCover, GreedyIsOptimalAgainstBruteForce) {
  for (uint64_t addr = 0; addr < 64; ++addr) {
    for (uint64_t len = 1; len <= 40; ++len) {
      const std::vector<Chunk> cover = MinimalCover(A(addr), len);
      ExpectTiling(cover, addr, len, /*exact=*/true);
      ASSERT_EQ(static_cast<int>(cover.size()), TilingDp(addr, addr + len))
          << "addr " << addr << " len " << len;
      if (len <= 12) {
        ASSERT_EQ(static_cast<int>(cover.size()), CoverBfs(addr, len))
            << "addr " << addr << " len " << len;
      }
    }
  }
}

TEST(MinimalCover, SizeInConstantTime) {
  for (uint64_t addr = 0; addr < 64; ++addr) {
    for (uint64_t len = 0; len <= 300; ++len) {
      ASSERT_EQ(MinimalCoverSize(A(addr), len), MinimalCover(A(addr), len).size());
    }
  }
  EXPECT_EQ(MinimalCoverSize(A(0x1000), uint64_t{1} << 20), 131072U);
  EXPECT_EQ(MinimalCoverSize(A(0x1001), uint64_t{1} << 20), 131075U);  // 1+2+4, ..., 1
}

TEST(MinimalCover, HighAddresses) {
  const uint64_t top = ~uint64_t{0} - 15;  // 16 bytes below the end
  const std::vector<Chunk> cover = MinimalCover(A(top), 16);
  EXPECT_THAT(cover, ElementsAre(C(top, 8), C(top + 8, 8)));
}

// Brute force for WideCover: every contiguous superset [s, t) of the range, tiled with the
// fewest chunks (TilingDp); the best has the fewest bytes outside, then the fewest chunks.
struct WideBest {
  uint64_t outside = UINT64_MAX;
  int chunks = INT_MAX;
};
WideBest WideBrute(uint64_t addr, uint64_t len, int k) {
  WideBest best;
  const uint64_t span = 8 * static_cast<uint64_t>(k);
  for (uint64_t s = addr >= span ? addr - span : 0; s <= addr; ++s) {
    for (uint64_t t = addr + len; t <= s + span; ++t) {
      const int n = TilingDp(s, t);
      if (n > k) {
        continue;
      }
      const uint64_t outside = (t - s) - len;
      if (outside < best.outside || (outside == best.outside && n < best.chunks)) {
        best = WideBest{outside, n};
      }
    }
  }
  return best;
}

TEST(WideCover, Examples) {
  // 12 bytes at an odd address need 5 exact slots; 2 slots watch 16 aligned bytes.
  EXPECT_THAT(WideCover(A(0x1001), 12, 2), ElementsAre(C(0x1000, 8), C(0x1008, 8)));
  EXPECT_THAT(WideCover(A(0x1001), 12, 1), ElementsAre());
  EXPECT_THAT(WideCover(A(0x1003), 2, 1), ElementsAre(C(0x1000, 8)));
  // Enough chunks: the exact cover.
  EXPECT_THAT(WideCover(A(0x1001), 3, 4), ElementsAre(C(0x1001, 1), C(0x1002, 2)));
  EXPECT_THAT(WideCover(A(0x1001), 3, 1), ElementsAre(C(0x1000, 4)));
  EXPECT_TRUE(WideCover(A(0x1000), 33, 4).empty());
  EXPECT_TRUE(WideCover(A(0x1000), 4, 0).empty());
}

TEST(WideCover, OptimalAgainstBruteForce) {
  for (int k = 1; k <= 4; ++k) {
    for (uint64_t addr = 0; addr < 64; ++addr) {
      for (uint64_t len = 1; len <= 40; ++len) {
        const std::vector<Chunk> wide = WideCover(A(addr), len, k);
        const WideBest best = WideBrute(addr, len, k);
        if (best.chunks == INT_MAX) {
          ASSERT_TRUE(wide.empty()) << addr << "+" << len << " k=" << k;
          continue;
        }
        ExpectTiling(wide, addr, len, /*exact=*/false);
        ASSERT_LE(static_cast<int>(wide.size()), k);
        ASSERT_EQ(BytesOutside(wide, A(addr), len), best.outside)
            << addr << "+" << len << " k=" << k;
        ASSERT_EQ(static_cast<int>(wide.size()), best.chunks) << addr << "+" << len << " k=" << k;
      }
    }
  }
}

TEST(ChooseCover, ExactWhenItFits) {
  CoverChoice c = ChooseCover(A(0x1000), 24, 4);
  EXPECT_EQ(c.kind, CoverChoice::Kind::kExact);
  EXPECT_EQ(c.chunks.size(), 3U);
  EXPECT_EQ(c.new_slots, 3);
  EXPECT_EQ(c.bytes_outside, 0U);
  EXPECT_EQ(c.explanation, "24 bytes at 0x1000: 3 exact 8-byte slots");
  EXPECT_EQ(ChooseCover(A(0x1000), 4, 1).explanation, "4 bytes at 0x1000: 1 exact 4-byte slot");
  EXPECT_EQ(ChooseCover(A(0x1005), 12, 4).explanation,
            "12 bytes at 0x1005: 4 exact slots (1+2+8+1 bytes)");
}

TEST(ChooseCover, WideWhenSlotsAreShort) {
  CoverChoice c = ChooseCover(A(0x1001), 12, 2);
  EXPECT_EQ(c.kind, CoverChoice::Kind::kWide);
  EXPECT_THAT(c.chunks, ElementsAre(C(0x1000, 8), C(0x1008, 8)));
  EXPECT_EQ(c.bytes_outside, 4U);
  EXPECT_EQ(c.explanation,
            "12 bytes at 0x1001 need 5 slots, 2 free: watching 16 aligned bytes at 0x1000 in "
            "2 slots, 4 bytes filtered in software");
  // With 3 free the wide cover wastes fewer bytes: [0x1000,0x1010) still, or better?
  CoverChoice c3 = ChooseCover(A(0x1001), 12, 3);
  EXPECT_EQ(c3.kind, CoverChoice::Kind::kWide);
  EXPECT_LE(c3.bytes_outside, 4U);
  EXPECT_LE(c3.chunks.size(), 3U);
}

TEST(ChooseCover, NoneWhenNothingFits) {
  CoverChoice c = ChooseCover(A(0x1005), 12, 2);
  EXPECT_EQ(c.kind, CoverChoice::Kind::kNone);
  EXPECT_TRUE(c.chunks.empty());
  EXPECT_EQ(c.explanation,
            "12 bytes at 0x1005 need 4 slots, 2 free: no aligned cover fits in 2 slots");
  EXPECT_EQ(ChooseCover(A(0x1000), 4, 0).explanation,
            "4 bytes at 0x1000 need 1 slot, 0 free: no aligned cover fits");
}

TEST(ChooseCover, HugeRangesAreRefusedQuickly) {
  const CoverChoice c = ChooseCover(A(0x1000), uint64_t{1} << 20, 4);
  EXPECT_EQ(c.kind, CoverChoice::Kind::kNone);
  EXPECT_EQ(c.explanation,
            "1048576 bytes at 0x1000 need 131072 slots, 4 free: no aligned cover fits in 4 slots");
  // Not too eager: at 8 * (free + 4) bytes a cover with 4 shared chunks can still exist.
  const auto held = [](const Chunk& c) { return c.addr.value < 0x1020; };
  const CoverChoice edge = ChooseCover(A(0x1000), 64, 4, held);
  EXPECT_EQ(edge.kind, CoverChoice::Kind::kExact);
  EXPECT_EQ(edge.new_slots, 4);
  EXPECT_EQ(ChooseCover(A(0x1000), 65, 4, held).kind, CoverChoice::Kind::kNone);
}

TEST(ChooseCover, SharedChunksCostNothing) {
  // Two of the three chunks are held already: one free slot is enough for the exact cover.
  const auto held = [](const Chunk& c) { return c.addr.value != 0x1010; };
  CoverChoice c = ChooseCover(A(0x1000), 24, 1, held);
  EXPECT_EQ(c.kind, CoverChoice::Kind::kExact);
  EXPECT_EQ(c.new_slots, 1);
  EXPECT_EQ(c.explanation,
            "24 bytes at 0x1000: 3 exact 8-byte slots, 2 shared with another request");
  // A wide chunk someone holds lets a request in with no free slot at all.
  const auto wide_held = [](const Chunk& c) { return c == Chunk{core::RemoteAddr{0x1000}, 8}; };
  CoverChoice w = ChooseCover(A(0x1003), 2, 0, wide_held);
  EXPECT_EQ(w.kind, CoverChoice::Kind::kWide);
  EXPECT_EQ(w.new_slots, 0);
  EXPECT_THAT(w.chunks, ElementsAre(C(0x1000, 8)));
}

TEST(BytesOutside, CountsBothSides) {
  EXPECT_EQ(BytesOutside({C(0x1000, 8), C(0x1008, 8)}, A(0x1001), 12), 4U);
  EXPECT_EQ(BytesOutside(MinimalCover(A(0x1003), 29), A(0x1003), 29), 0U);
}

}  // namespace
}  // namespace kwatch::drmgr
