#include "drmgr/range_cover.h"

#include <algorithm>
#include <array>
#include <limits>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "drmgr/debug_regs.h"

namespace kwatch::drmgr {
namespace {

constexpr std::array<uint64_t, 4> kSizes = {8, 4, 2, 1};  // largest first

// Chunks of [s, end) reached by the fewest aligned chunks, when at most max_chunks.
struct Run {
  uint64_t start = 0;
  uint64_t end = 0;
  std::vector<Chunk> chunks;
};

// Fewest-chunk tilings from `start` of every end in (start, start + 8 * max_chunks]: returns
// for each end the run, or an empty run when unreachable within max_chunks.
std::vector<Run> TilingsFrom(uint64_t start, int max_chunks, uint64_t min_end) {
  const uint64_t span = 8 * static_cast<uint64_t>(max_chunks);
  std::vector<int> count(span + 1, std::numeric_limits<int>::max());
  std::vector<uint64_t> parent(span + 1, 0);
  count[0] = 0;
  std::vector<Run> runs;
  for (uint64_t off = 0; off <= span; ++off) {
    if (count[off] == std::numeric_limits<int>::max()) {
      continue;
    }
    const uint64_t pos = start + off;
    if (pos >= min_end && off > 0) {
      Run run{start, pos, {}};
      for (uint64_t o = off; o > 0; o = parent[o]) {
        run.chunks.push_back(Chunk{core::RemoteAddr{start + parent[o]}, o - parent[o]});
      }
      std::reverse(run.chunks.begin(), run.chunks.end());
      runs.push_back(std::move(run));
      continue;  // more chunks past the end only add bytes outside
    }
    if (count[off] >= max_chunks) {
      continue;
    }
    for (uint64_t size : kSizes) {
      if (pos % size != 0 || off + size > span) {
        continue;
      }
      if (count[off] + 1 < count[off + size]) {
        count[off + size] = count[off] + 1;
        parent[off + size] = off;
      }
    }
  }
  return runs;
}

std::string Plural(int n, absl::string_view word) {
  return absl::StrCat(n, " ", word, n == 1 ? "" : "s");
}

std::string DescribeExact(core::RemoteAddr addr, uint64_t len, const std::vector<Chunk>& chunks,
                          int new_slots) {
  std::string out = absl::StrFormat("%d bytes at 0x%x: ", len, addr.value);
  const int n = static_cast<int>(chunks.size());
  const bool same = std::all_of(chunks.begin(), chunks.end(),
                                [&](const Chunk& c) { return c.len == chunks.front().len; });
  if (same) {
    absl::StrAppend(&out, n, " exact ", chunks.front().len, "-byte slot", n == 1 ? "" : "s");
  } else {
    absl::StrAppend(
        &out, n, " exact slots (",
        absl::StrJoin(chunks, "+",
                      [](std::string* o, const Chunk& c) { absl::StrAppend(o, c.len); }),
        " bytes)");
  }
  if (new_slots < n) {
    absl::StrAppend(&out, ", ", n - new_slots, " shared with another request");
  }
  return out;
}

}  // namespace

std::vector<Chunk> MinimalCover(core::RemoteAddr addr, uint64_t len) {
  std::vector<Chunk> out;
  uint64_t a = addr.value;
  uint64_t left = len;  // counted down, so that a range ending at 2^64 works too
  while (left > 0) {
    for (uint64_t size : kSizes) {
      if (a % size == 0 && size <= left) {
        out.push_back(Chunk{core::RemoteAddr{a}, size});
        a += size;
        left -= size;
        break;
      }
    }
  }
  return out;
}

uint64_t MinimalCoverSize(core::RemoteAddr addr, uint64_t len) {
  uint64_t n = 0;
  uint64_t a = addr.value;
  uint64_t left = len;
  while (left > 0) {
    if (a % 8 == 0 && left >= 8) {  // the middle: whole 8-byte chunks at once
      n += left / 8;
      a += left / 8 * 8;
      left %= 8;
      continue;
    }
    for (uint64_t size : kSizes) {
      if (a % size == 0 && size <= left) {
        ++n;
        a += size;
        left -= size;
        break;
      }
    }
  }
  return n;
}

std::vector<Chunk> WideCover(core::RemoteAddr addr, uint64_t len, int max_chunks) {
  if (max_chunks <= 0 || len == 0 || len > 8 * static_cast<uint64_t>(max_chunks)) {
    return {};
  }
  std::vector<Chunk> exact = MinimalCover(addr, len);
  if (exact.size() <= static_cast<size_t>(max_chunks)) {
    return exact;  // nothing outside, fewest chunks
  }
  const uint64_t end = addr.value + len;
  // An optimal cover is a run of adjacent aligned chunks from some s <= addr to some end >=
  // addr+len (chunks not touching the range are useless, nested ones redundant). The first
  // chunk starts on its own alignment, so s is addr rounded down to 1, 2, 4 or 8.
  std::vector<Chunk> best;
  std::tuple<uint64_t, size_t, uint64_t> best_key{std::numeric_limits<uint64_t>::max(), 0, 0};
  for (uint64_t align : {1, 2, 4, 8}) {
    const uint64_t start = addr.value & ~(align - 1);
    if (align > 1 && start == (addr.value & ~(align / 2 - 1))) {
      continue;  // same start as the smaller alignment
    }
    for (Run& run : TilingsFrom(start, max_chunks, end)) {
      const std::tuple<uint64_t, size_t, uint64_t> key{(run.end - run.start) - len,
                                                       run.chunks.size(), run.start};
      if (key < best_key) {
        best_key = key;
        best = std::move(run.chunks);
      }
    }
  }
  return best;
}

uint64_t BytesOutside(const std::vector<Chunk>& chunks, core::RemoteAddr addr, uint64_t len) {
  uint64_t total = 0;
  const uint64_t begin = addr.value;
  const uint64_t end = addr.value + len;
  for (const Chunk& c : chunks) {
    const uint64_t lo = std::max(begin, c.addr.value);
    const uint64_t hi = std::min(end, c.end().value);
    total += c.len - (hi > lo ? hi - lo : 0);
  }
  return total;
}

CoverChoice ChooseCover(core::RemoteAddr addr, uint64_t len, int free_slots) {
  return ChooseCover(addr, len, free_slots, [](const Chunk&) { return false; });
}

CoverChoice ChooseCover(core::RemoteAddr addr, uint64_t len, int free_slots,
                        absl::FunctionRef<bool(const Chunk&)> already_held) {
  const auto new_slots = [&](const std::vector<Chunk>& chunks) {
    return static_cast<int>(std::count_if(chunks.begin(), chunks.end(),
                                          [&](const Chunk& c) { return !already_held(c); }));
  };
  CoverChoice choice;
  // Every cover needs len/8 chunks or more, and at most kNumDebugRegisters of them can be
  // shared: beyond that, say so without building a cover (a 1 MiB range has 131072 chunks).
  if (len > 8 * static_cast<uint64_t>(std::max(0, free_slots) + kNumDebugRegisters)) {
    choice.explanation =
        absl::StrFormat("%d bytes at 0x%x need %d slots, %d free: no aligned cover fits%s", len,
                        addr.value, MinimalCoverSize(addr, len), free_slots,
                        free_slots > 0 ? absl::StrCat(" in ", Plural(free_slots, "slot")) : "");
    return choice;
  }
  std::vector<Chunk> exact = MinimalCover(addr, len);
  const int exact_new = new_slots(exact);
  if (!exact.empty() && exact_new <= free_slots) {
    choice.kind = CoverChoice::Kind::kExact;
    choice.new_slots = exact_new;
    choice.explanation = DescribeExact(addr, len, exact, exact_new);
    choice.chunks = std::move(exact);
    return choice;
  }
  // Wide covers with fewer chunks than the exact one. A chunk can only be shared with a slot
  // of the same scope, so at most kNumDebugRegisters chunks of a cover cost nothing.
  const int max_k = std::min(static_cast<int>(exact.size()) - 1, free_slots + kNumDebugRegisters);
  std::tuple<uint64_t, int, size_t> best_key{std::numeric_limits<uint64_t>::max(), 0, 0};
  for (int k = 1; k <= max_k; ++k) {
    std::vector<Chunk> wide = WideCover(addr, len, k);
    if (wide.empty()) {
      continue;
    }
    const int n = new_slots(wide);
    if (n > free_slots) {
      continue;
    }
    const std::tuple<uint64_t, int, size_t> key{BytesOutside(wide, addr, len), n, wide.size()};
    if (key < best_key) {
      best_key = key;
      choice.chunks = std::move(wide);
      choice.new_slots = n;
    }
  }
  const std::string need = absl::StrFormat("%d bytes at 0x%x need %s, %d free", len, addr.value,
                                           Plural(exact_new, "slot"), free_slots);
  if (choice.chunks.empty()) {
    choice.kind = CoverChoice::Kind::kNone;
    choice.explanation =
        absl::StrCat(need, ": no aligned cover fits",
                     free_slots > 0 ? absl::StrCat(" in ", Plural(free_slots, "slot")) : "");
    return choice;
  }
  choice.kind = CoverChoice::Kind::kWide;
  choice.bytes_outside = std::get<0>(best_key);
  const uint64_t covered = choice.chunks.back().end() - choice.chunks.front().addr;
  choice.explanation =
      absl::StrFormat("%s: watching %d aligned bytes at 0x%x in %s, %d bytes filtered in software",
                      need, covered, choice.chunks.front().addr.value,
                      Plural(static_cast<int>(choice.chunks.size()), "slot"), choice.bytes_outside);
  if (choice.new_slots < static_cast<int>(choice.chunks.size())) {
    absl::StrAppend(&choice.explanation, " (",
                    static_cast<int>(choice.chunks.size()) - choice.new_slots,
                    " shared with another request)");
  }
  return choice;
}

}  // namespace kwatch::drmgr
