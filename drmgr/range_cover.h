#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "core/base/remote_addr.h"

namespace kwatch::drmgr {

// One debug register's worth of memory: `len` is 1, 2, 4 or 8 and `addr` is aligned to it.
struct Chunk {
  core::RemoteAddr addr;
  uint64_t len = 0;

  core::RemoteAddr end() const { return addr + len; }
  bool Contains(core::RemoteAddr a) const { return a >= addr && a < end(); }
  // NOLINTNEXTLINE(modernize-use-nullptr): clang-tidy 14 bug (llvm-project#53961)
  auto operator<=>(const Chunk&) const = default;
};

// The smallest set of aligned 1/2/4/8-byte chunks whose union is exactly [addr, addr+len),
// in address order (greedy: at each position the largest aligned chunk that fits; optimal
// because aligned power-of-two chunks are either nested or disjoint). Empty for len 0.
// A range may end at 2^64; the functions below need addr+len < 2^64.
std::vector<Chunk> MinimalCover(core::RemoteAddr addr, uint64_t len);

// MinimalCover(addr, len).size(), in constant time.
uint64_t MinimalCoverSize(core::RemoteAddr addr, uint64_t len);

// A cover of [addr, addr+len) by at most `max_chunks` aligned chunks that may extend beyond
// the range (hits on those extra bytes are filtered in software). Minimises the bytes outside
// the range, then the number of chunks, then prefers the lowest start. Adjacent chunks in
// address order. Empty when no such cover exists (len > 8 * max_chunks, or max_chunks 0).
std::vector<Chunk> WideCover(core::RemoteAddr addr, uint64_t len, int max_chunks);

// Total bytes of `chunks` outside [addr, addr+len) (chunks are disjoint).
uint64_t BytesOutside(const std::vector<Chunk>& chunks, core::RemoteAddr addr, uint64_t len);

struct CoverChoice {
  enum class Kind : uint8_t {
    kExact,  // MinimalCover: no byte outside the range
    kWide,   // WideCover: fewer slots, hits outside the range filtered in software
    kNone,   // nothing fits in the free slots
  };
  Kind kind = Kind::kNone;
  std::vector<Chunk> chunks;
  int new_slots = 0;           // chunks that need a slot of their own (not already held)
  uint64_t bytes_outside = 0;  // bytes watched in hardware but not requested
  std::string explanation;     // one sentence for people, e.g.
  // "24 bytes at 0x1000: 3 exact 8-byte slots"
  // "12 bytes at 0x1001 need 4 slots, 2 free: watching 16 aligned bytes at 0x1000 in 2
  //  slots, 4 bytes filtered in software"
};

// The cost model: the exact cover when its chunks fit in `free_slots`, else the wide cover
// with the fewest bytes outside the range among those that fit (extra traps cost a debug
// exception each, ~13.5 us here, so fewer stray bytes beat fewer slots), else kNone.
CoverChoice ChooseCover(core::RemoteAddr addr, uint64_t len, int free_slots);

// As above, where chunks for which `already_held` returns true cost no slot (they can share
// a slot another request holds).
CoverChoice ChooseCover(core::RemoteAddr addr, uint64_t len, int free_slots,
                        absl::FunctionRef<bool(const Chunk&)> already_held);

}  // namespace kwatch::drmgr
