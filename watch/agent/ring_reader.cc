#include "watch/agent/ring_reader.h"

#include <atomic>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace kwatch::watch::agent {

namespace ka = kwatch::agent;

namespace {

constexpr uint32_t kPadHeader = 8;  // type, flags, size: all a pad record has

uint8_t* DataOf(ka::KwRing& ring) {
  return reinterpret_cast<uint8_t*>(&ring) + sizeof(ka::KwRing);
}

}  // namespace

absl::StatusOr<DrainStats> DrainRing(ka::KwRing& ring, uint32_t ring_bytes, uint64_t& last_lost,
                                     const RecordFn& fn) {
  DrainStats stats;
  const uint64_t lost = ring.lost.load(std::memory_order_relaxed);
  stats.lost = lost - last_lost;
  last_lost = lost;
  const uint64_t head = ring.head.load(std::memory_order_acquire);
  uint64_t tail = ring.tail.load(std::memory_order_relaxed);
  const uint8_t* data = DataOf(ring);
  const uint64_t mask = ring_bytes - 1;
  const auto corrupt = [&](const std::string& what) -> absl::Status {
    const uint64_t skipped = head > tail ? head - tail : 0;
    ring.tail.store(head, std::memory_order_release);
    return absl::DataLossError(
        absl::StrCat("agent ring of thread ", ring.tid.load(std::memory_order_relaxed), ": ", what,
                     " at byte ", tail, "; ", skipped, " unread bytes skipped"));
  };
  if (head < tail || head - tail > ring_bytes) {
    return corrupt(absl::StrCat("head ", head, " and tail ", tail, " are out of step"));
  }
  while (tail < head) {
    const uint64_t at = tail & mask;
    const uint64_t to_end = ring_bytes - at;
    if ((tail & 7) != 0 || head - tail < kPadHeader) {
      return corrupt("a record not on an 8-byte boundary");
    }
    uint16_t type = 0;
    uint32_t size = 0;
    std::memcpy(&type, data + at + offsetof(ka::KwRecord, type), sizeof(type));
    std::memcpy(&size, data + at + offsetof(ka::KwRecord, size), sizeof(size));
    if (size == 0 || (size & 7) != 0 || size > to_end || size > head - tail) {
      return corrupt(absl::StrCat("a record of ", size, " bytes"));
    }
    if (type == ka::kKwRecordPad) {
      ++stats.pads;
    } else {
      if (size < sizeof(ka::KwRecord)) {
        return corrupt(absl::StrCat("a record of ", size, " bytes"));
      }
      ka::KwRecord record{};
      std::memcpy(&record, data + at, sizeof(record));
      fn(record, std::span<const uint8_t>(data + at + sizeof(record), size - sizeof(record)));
      ++stats.records;
    }
    tail += size;
    stats.bytes += size;
  }
  ring.tail.store(tail, std::memory_order_release);
  return stats;
}

absl::StatusOr<std::vector<RecordArg>> ParseArgs(std::span<const uint8_t> payload) {
  std::vector<RecordArg> args;
  size_t at = 0;
  while (at < payload.size()) {
    if (payload.size() - at < sizeof(ka::KwArgHeader)) {
      return absl::DataLossError(
          absl::StrCat("a record's payload ends inside an argument header at byte ", at));
    }
    ka::KwArgHeader h{};
    std::memcpy(&h, payload.data() + at, sizeof(h));
    at += sizeof(h);
    if (h.len > payload.size() - at) {
      return absl::DataLossError(absl::StrCat("argument ", h.arg, " claims ", h.len,
                                              " bytes where ", payload.size() - at, " remain"));
    }
    args.push_back(
        RecordArg{.arg = h.arg, .status = h.status, .bytes = payload.subspan(at, h.len)});
    at += (h.len + 7) & ~size_t{7};
  }
  return args;
}

}  // namespace kwatch::watch::agent
