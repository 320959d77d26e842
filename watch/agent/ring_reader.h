#pragma once

// Reading the agent's per-thread record rings (agent/abi.h KwRing): single producer (the
// owning thread of the target), single consumer (kwatch). Like the perf ring: the producer
// publishes `head` (release) after a record, kwatch reads from `tail` to `head` and publishes
// `tail` (release) after reading. A record never straddles the ring's end: a kKwRecordPad
// (only its first 8 bytes written) fills what is left there. A full ring drops records and
// counts them in KwRing::lost: the target never waits.

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/abi.h"

namespace kwatch::watch::agent {

// One argument of a record's payload (KwArgHeader and its bytes).
struct RecordArg {
  uint16_t arg = 0;
  uint16_t status = 0;  // 0 ok, 1 fault, 2 cut
  std::span<const uint8_t> bytes{};
};

// Called for each record: the header (a copy) and the payload (valid during the call only).
using RecordFn =
    std::function<void(const kwatch::agent::KwRecord& record, std::span<const uint8_t> payload)>;

struct DrainStats {
  uint64_t records = 0;  // hit and return records passed to the callback
  uint64_t pads = 0;     // pad records skipped
  uint64_t bytes = 0;    // bytes consumed
  // Records the producer dropped since the previous drain of this ring (KwRing::lost moved).
  uint64_t lost = 0;
};

// Reads every record published in `ring` (its `ring_bytes` of data follow the header), calls
// `fn` for each hit or return record, and releases the space. `last_lost` is the
// KwRing::lost value seen by the previous drain (updated). DataLoss when the ring holds
// something no producer writes (a size of 0 or not a multiple of 8, a record past the end,
// head behind tail or more than ring_bytes ahead): the unread part is then skipped (tail :=
// head), so the next drain starts clean, and the error says how many bytes were lost.
absl::StatusOr<DrainStats> DrainRing(kwatch::agent::KwRing& ring, uint32_t ring_bytes,
                                     uint64_t& last_lost, const RecordFn& fn);

// The arguments of a record's payload, in order. DataLoss when a header's length runs past
// the payload.
absl::StatusOr<std::vector<RecordArg>> ParseArgs(std::span<const uint8_t> payload);

}  // namespace kwatch::watch::agent
