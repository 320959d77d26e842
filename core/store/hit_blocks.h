#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/store/trace_records.h"

// Probe hits stored in blocks (schema 8, table hit_blocks; docs/recording.md, "Hits in
// blocks"): a block holds consecutive hits of one commit, in time order, column by column
// (times, processes, sites as deltas from the previous hit, threads from their process, probe,
// flags and stack ids as varints, argument names interned in the block, values as their bytes),
// compressed with zstd: a hit of a probe with two integer arguments takes a few bytes, where a
// row of `hits` took about 60.

namespace kwatch::core::store {

// The most hits a block holds, and the most bytes they decompress to; the writer makes blocks
// of up to kBlockEvents hits (event_blocks.h) and kHitBlockBytes bytes of arguments.
inline constexpr size_t kMaxBlockHits = 65536;
inline constexpr size_t kMaxHitBlockBytes = size_t{64} << 20;
inline constexpr size_t kHitBlockBytes = size_t{4} << 20;

// About the bytes `h` takes in a block before compression (its arguments and fixed columns).
size_t HitBlockBytes(const HitRecord& h);

// The block of `hits` (1 to kMaxBlockHits of them, any order; times are stored as given).
std::string EncodeHitBlock(absl::Span<const HitRecord> hits);

// Appends the `count` hits of block `data` to `out`. InvalidArgument saying what is wrong for
// anything that is not a block of `count` hits EncodeHitBlock made (never allocates beyond
// kMaxHitBlockBytes of decompressed data and the hits it holds).
absl::Status DecodeHitBlock(absl::string_view data, uint64_t count, std::vector<HitRecord>* out);

}  // namespace kwatch::core::store
