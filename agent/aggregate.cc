// Aggregations in the target (agent/abi.h "Aggregations"): a hit a probe took updates each of
// its aggregations' rows with atomics, so that `kwatch probe --agg` counts every hit however
// fast the program runs. No libc call, no system call, no lock: a row is claimed with a CAS.

#include <atomic>
#include <cstdint>

#include "agent/agent.h"

namespace kwatch::agent {

namespace {

constexpr uint64_t kRowHash = 0x9E3779B97F4A7C15ULL;
constexpr uint32_t kClaimSpins = 4096;  // a row another thread is claiming: waited this long

constexpr uint32_t kRowFree = 0;
constexpr uint32_t kRowClaiming = 1;
constexpr uint32_t kRowReady = 2;

inline bool Less(uint64_t a, uint64_t b, bool is_signed) {
  return is_signed ? static_cast<int64_t>(a) < static_cast<int64_t>(b) : a < b;
}

inline uint64_t* Buckets(KwAggRow* row) {
  return reinterpret_cast<uint64_t*>(row + 1);
}

// The bucket word of `value` (abi.h KwAggFunc), or -1 for none.
int64_t BucketOf(const KwAggregate& a, uint64_t value, bool is_signed) {
  if (a.func == kKwAggHist) {
    if (is_signed && static_cast<int64_t>(value) < 0) {
      return 0;
    }
    return value == 0 ? 1 : 1 + (64 - __builtin_clzll(value));
  }
  if (a.func == kKwAggLhist && a.step > 0) {
    const auto v = static_cast<int64_t>(value);
    if (v < a.low) {
      return 0;
    }
    const auto n = static_cast<int64_t>(a.buckets) - 2;
    if (v >= a.high) {
      return n + 1;
    }
    // v - low fits in uint64 (v >= low), whatever their signs.
    const uint64_t i =
        (static_cast<uint64_t>(v) - static_cast<uint64_t>(a.low)) / static_cast<uint64_t>(a.step);
    return i < static_cast<uint64_t>(n) ? static_cast<int64_t>(i) + 1 : n + 1;
  }
  return -1;
}

// The row of (key, flags), claimed with `value` as its min and max when new; null when every
// row is taken.
KwAggRow* RowOf(const Session& s, const KwAggregate& a, uint64_t key, uint32_t flags,
                uint64_t value) {
  const uint32_t cap = a.row_capacity;
  const uint32_t shift = 64 - static_cast<uint32_t>(__builtin_ctz(cap));
  uint32_t i = cap == 1 ? 0 : static_cast<uint32_t>((key * kRowHash) >> shift);
  for (uint32_t n = 0; n < cap; ++n, i = (i + 1) & (cap - 1)) {
    auto* row = reinterpret_cast<KwAggRow*>(s.aggs + a.rows + uint64_t{i} * a.row_bytes);
    uint32_t state = row->state.load(std::memory_order_acquire);
    if (state == kRowFree) {
      uint32_t expected = kRowFree;
      if (row->state.compare_exchange_strong(expected, kRowClaiming, std::memory_order_acq_rel)) {
        row->key = key;
        row->flags = flags;
        row->min.store(value, std::memory_order_relaxed);
        row->max.store(value, std::memory_order_relaxed);
        row->state.store(kRowReady, std::memory_order_release);
        return row;
      }
      state = expected;
    }
    for (uint32_t spin = 0; state == kRowClaiming && spin < kClaimSpins; ++spin) {
      __builtin_ia32_pause();
      state = row->state.load(std::memory_order_acquire);
    }
    if (state == kRowReady && row->key == key && row->flags == flags) {
      return row;
    }
  }
  return nullptr;
}

void Update(const KwAggregate& a, KwAggRow& row, uint64_t value) {
  const bool is_signed = (a.flags & kKwAggSigned) != 0;
  row.count.fetch_add(1, std::memory_order_relaxed);
  if (a.func == kKwAggCount) {
    return;
  }
  row.sum.fetch_add(value, std::memory_order_relaxed);
  uint64_t m = row.min.load(std::memory_order_relaxed);
  while (Less(value, m, is_signed) &&
         !row.min.compare_exchange_weak(m, value, std::memory_order_relaxed)) {
  }
  m = row.max.load(std::memory_order_relaxed);
  while (Less(m, value, is_signed) &&
         !row.max.compare_exchange_weak(m, value, std::memory_order_relaxed)) {
  }
  const int64_t b = BucketOf(a, value, is_signed);
  if (b >= 0 && static_cast<uint64_t>(b) < a.buckets) {
    reinterpret_cast<std::atomic<uint64_t>*>(Buckets(&row))[b].fetch_add(1,
                                                                         std::memory_order_relaxed);
  }
}

// Whether `a` (at byte `at` of the area) and its rows lie inside the area: kwatch placed them,
// but a bad offset must not make the agent write outside it.
bool Inside(const Session& s, uint64_t at, const KwAggregate& a) {
  const uint64_t size = s.aggs_bytes;
  if (at % 64 != 0 || at > size || size - at < sizeof(KwAggregate)) {
    return false;
  }
  if (a.row_capacity == 0 || (a.row_capacity & (a.row_capacity - 1)) != 0 ||
      a.row_bytes < sizeof(KwAggRow) + uint64_t{a.buckets} * 8 || a.rows % 8 != 0 ||
      a.rows > size) {
    return false;
  }
  return uint64_t{a.row_capacity} * a.row_bytes <= size - a.rows;
}

}  // namespace

void RunAggregates(const Session& s, const KwProbe& probe, const KwRegs& regs, int32_t tid) {
  uint32_t next = probe.agg;
  for (uint32_t n = 0; next != 0 && n < 64; ++n) {  // a chain kwatch got wrong ends too
    const uint64_t at = next - 1;
    auto* a = reinterpret_cast<KwAggregate*>(s.aggs + at);
    if (s.aggs == nullptr || !Inside(s, at, *a)) {
      return;
    }
    next = a->next;
    uint64_t value = 1;
    if (a->value_len > 0 &&
        RunProgram(s, a->value_offset, a->value_len, regs, tid, value) != EvalResult::kValue) {
      a->no_value.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    uint64_t key = 0;
    uint32_t flags = 0;
    if (a->key_len > 0 &&
        RunProgram(s, a->key_offset, a->key_len, regs, tid, key) != EvalResult::kValue) {
      key = 0;
      flags = 1;  // shown as the faulted argument kwatch shows
    }
    KwAggRow* row = RowOf(s, *a, key, flags, value);
    if (row == nullptr) {
      a->no_row.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    Update(*a, *row, value);
  }
}

}  // namespace kwatch::agent
