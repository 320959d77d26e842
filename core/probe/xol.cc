#include "core/probe/xol.h"

#include <sys/mman.h>

#include <algorithm>
#include <vector>

#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"
#include "core/ptrace/process.h"
#include "core/ptrace/remote_exec.h"

namespace kwatch::core::probe {

namespace {

constexpr uint64_t kPage = 4096;
constexpr uint64_t kLowest = 1ULL << 20;          // above mmap_min_addr, with margin
constexpr uint64_t kHighest = 0x7ffffffff000ULL;  // end of the 47-bit user space
constexpr uint64_t kStackGap = 256ULL << 20;      // room left for [stack] to grow down
constexpr uint64_t kHeapGap = 1ULL << 30;         // room left for [heap] to grow up

uint64_t Distance(uint64_t a, uint64_t b) {
  return a > b ? a - b : b - a;
}

}  // namespace

std::optional<RemoteAddr> FindXolGap(const std::vector<ptrace::MapEntry>& maps, RemoteAddr near,
                                     uint64_t size, uint64_t max_distance) {
  std::vector<ptrace::MapEntry> sorted = maps;
  std::sort(sorted.begin(), sorted.end(),
            [](const ptrace::MapEntry& a, const ptrace::MapEntry& b) { return a.start < b.start; });
  std::optional<RemoteAddr> best;
  uint64_t best_distance = 0;
  auto consider = [&](uint64_t start) {
    // Every byte of the area within max_distance of `near`.
    const uint64_t far = std::max(Distance(start, near.value), Distance(start + size, near.value));
    if (far > max_distance) {
      return;
    }
    const uint64_t d = Distance(start, near.value);
    if (!best.has_value() || d < best_distance) {
      best = RemoteAddr{start};
      best_distance = d;
    }
  };
  uint64_t prev_end = kLowest;
  bool prev_heap = false;
  for (size_t i = 0; i <= sorted.size(); ++i) {
    const bool last = i == sorted.size();
    const uint64_t next_start = last ? kHighest : sorted[i].start.value;
    const bool next_stack = !last && sorted[i].path == "[stack]";
    uint64_t lo = prev_end + kPage;  // a guard page after the lower neighbour
    if (prev_heap) {
      lo = prev_end + kHeapGap;
    }
    uint64_t hi = next_start >= kPage ? next_start - kPage : 0;  // and before the upper one
    if (next_stack) {
      hi = next_start > kStackGap ? next_start - kStackGap : 0;
    }
    if (hi > lo && hi - lo >= size) {
      consider(hi - size);  // the top of the gap, just below the upper neighbour
      consider(lo);         // the bottom, just above the lower one
    }
    if (!last) {
      prev_end = std::max(prev_end, sorted[i].end.value);
      prev_heap = sorted[i].path == "[heap]";
    }
  }
  return best;
}

absl::StatusOr<XolAreas::Area*> XolAreas::MapArea(ptrace::Process& proc, pid_t tid,
                                                  RemoteAddr near) {
  // A few tries: the maps may change between reading them and mapping (another mapping wins).
  for (int attempt = 0; attempt < 4; ++attempt) {
    KW_ASSIGN_OR_RETURN(const std::vector<ptrace::MapEntry> maps, proc.Maps());
    const std::optional<RemoteAddr> at = FindXolGap(maps, near, kXolAreaSize, kXolMaxDistance);
    if (!at.has_value()) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "no free address range of %d KiB within 1 GiB of 0x%x in pid %d for kwatch's "
          "out-of-line area",
          kXolAreaSize / 1024, near.value, proc.pid()));
    }
    const absl::StatusOr<RemoteAddr> mapped = ptrace::RemoteMmap(
        proc, tid,
        ptrace::RemoteMapping{at->value, kXolAreaSize, PROT_READ | PROT_EXEC, MAP_FIXED_NOREPLACE},
        absl::StrFormat("mmap(0x%x, %d, r-x) in pid %d for kwatch's out-of-line area", at->value,
                        kXolAreaSize, proc.pid()));
    if (mapped.status().code() == absl::StatusCode::kAlreadyExists) {
      continue;  // EEXIST: something was mapped there meanwhile
    }
    if (!mapped.ok()) {
      return mapped.status();
    }
    if (*mapped != *at) {
      // A kernel without MAP_FIXED_NOREPLACE (before 4.17) takes it as a hint.
      (void)ptrace::RemoteMunmap(proc, tid, *mapped, kXolAreaSize);
      return absl::FailedPreconditionError(
          absl::StrFormat("the kernel placed kwatch's out-of-line area at 0x%x instead of 0x%x "
                          "(MAP_FIXED_NOREPLACE needs Linux 4.17)",
                          mapped->value, at->value));
    }
    // INT3 everywhere: a stray jump into the area traps instead of running zeros.
    const std::vector<uint8_t> fill(kXolAreaSize, 0xcc);
    KW_RETURN_IF_ERROR(proc.WriteMemory(*at, fill));
    areas_.push_back(Area{*at, kXolSlotSize});  // the trampoline slot is taken
    return &areas_.back();
  }
  return absl::UnavailableError(absl::StrFormat(
      "could not map kwatch's out-of-line area near 0x%x in pid %d (the address space kept "
      "changing)",
      near.value, proc.pid()));
}

absl::StatusOr<RemoteAddr> XolAreas::AllocateSlot(ptrace::Process& proc, pid_t tid, RemoteAddr near,
                                                  const std::function<bool(RemoteAddr)>& fits) {
  for (Area& a : areas_) {
    if (a.used + kXolSlotSize <= kXolAreaSize && fits(a.start + a.used)) {
      const RemoteAddr slot = a.start + a.used;
      a.used += kXolSlotSize;
      return slot;
    }
  }
  KW_ASSIGN_OR_RETURN(Area * a, MapArea(proc, tid, near));
  const RemoteAddr slot = a->start + a->used;
  if (!fits(slot)) {
    return absl::OutOfRangeError(absl::StrFormat(
        "no out-of-line slot of pid %d reaches what the instruction at 0x%x refers to", proc.pid(),
        near.value));
  }
  a->used += kXolSlotSize;
  return slot;
}

absl::StatusOr<RemoteAddr> XolAreas::Trampoline(ptrace::Process& proc, pid_t tid, RemoteAddr near) {
  if (areas_.empty()) {
    KW_RETURN_IF_ERROR(MapArea(proc, tid, near).status());
  }
  return areas_.front().start;
}

bool XolAreas::Contains(RemoteAddr addr) const {
  return std::any_of(areas_.begin(), areas_.end(), [addr](const Area& a) {
    return addr >= a.start && addr.value < a.start.value + kXolAreaSize;
  });
}

bool XolAreas::IsTrampoline(RemoteAddr addr) const {
  return std::any_of(areas_.begin(), areas_.end(),
                     [addr](const Area& a) { return a.start == addr; });
}

}  // namespace kwatch::core::probe
