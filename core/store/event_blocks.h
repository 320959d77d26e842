#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/event.h"

// Events stored in blocks (schema 7, table event_blocks; docs/recording.md, "Events in
// blocks"): a block holds up to kMaxBlockEvents consecutive events of one batch, in time order,
// column by column (times as deltas, threads from their pid, addresses as deltas from the
// previous event or from the watched range, values from the previous value, all as varints),
// compressed with zstd.

namespace kwatch::core::store {

// The most events a block holds; the writer makes blocks of up to kBlockEvents.
inline constexpr size_t kMaxBlockEvents = 65536;
inline constexpr size_t kBlockEvents = 8192;

// The block of `events` (1 to kMaxBlockEvents of them, any order; times are stored as given).
std::string EncodeEventBlock(absl::Span<const AccessEvent> events);

// Appends the `count` events of block `data` to `out`. InvalidArgument saying what is wrong
// for anything that is not a block of `count` events EncodeEventBlock made (never reads or
// allocates beyond count x 160 bytes of decompressed data).
absl::Status DecodeEventBlock(absl::string_view data, uint64_t count,
                              std::vector<AccessEvent>* out);

}  // namespace kwatch::core::store
