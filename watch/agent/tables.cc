#include "watch/agent/tables.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstring>
#include <iterator>
#include <new>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"

namespace kwatch::watch::agent {

namespace ka = kwatch::agent;

namespace {

constexpr uint64_t kHashMultiplier = 0x9E3779B97F4A7C15ULL;

}  // namespace

ShmTables::ShmTables(std::span<uint8_t> shm, const ShmLayout& layout) : shm_(shm), layout_(layout) {
  KW_CHECK(shm.size() >= layout.total_size);
  KW_CHECK(std::has_single_bit(layout.hash_capacity));
  hash_shift_ = 64 - static_cast<uint32_t>(std::countr_zero(layout.hash_capacity));
  free_code_[0] = layout.code_capacity;
}

uint64_t ShmTables::ProbeOffset(uint32_t index) const {
  KW_CHECK(index < layout_.probe_capacity);
  return layout_.probes_offset + uint64_t{index} * sizeof(KwProbe);
}

uint64_t ShmTables::SlotOffset(uint32_t index) const {
  KW_CHECK(index < layout_.hash_capacity);
  return layout_.hash_offset + uint64_t{index} * sizeof(KwProbeSlot);
}

uint64_t ShmTables::PatchOffset(uint32_t index) const {
  KW_CHECK(index < layout_.patch_capacity);
  return layout_.patches_offset + uint64_t{index} * sizeof(KwPatch);
}

uint64_t ShmTables::ThreadOffset(uint32_t index) const {
  KW_CHECK(index < layout_.thread_capacity);
  return layout_.threads_offset + uint64_t{index} * sizeof(KwThread);
}

uint64_t ShmTables::ProcessOffset(uint32_t index) const {
  KW_CHECK(index < layout_.process_capacity);
  return layout_.processes_offset + uint64_t{index} * sizeof(KwProcess);
}

uint64_t ShmTables::RingOffset(uint32_t index) const {
  KW_CHECK(index < layout_.thread_capacity);
  return layout_.rings_offset + uint64_t{index} * layout_.ring_stride();
}

uint32_t ShmTables::HashOf(uint64_t addr) const {
  return static_cast<uint32_t>((addr * kHashMultiplier) >> hash_shift_);
}

void ShmTables::BeginWrite() {
  std::atomic<uint32_t>& g = control().generation;
  g.store(g.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
}

void ShmTables::EndWrite() {
  std::atomic<uint32_t>& g = control().generation;
  g.store(g.load(std::memory_order_relaxed) + 1, std::memory_order_release);
}

absl::Status ShmTables::HashInsert(uint64_t addr, uint32_t index) {
  const uint32_t mask = layout_.hash_capacity - 1;
  std::optional<uint32_t> free;
  uint32_t i = HashOf(addr);
  for (uint32_t n = 0; n < layout_.hash_capacity; ++n, i = (i + 1) & mask) {
    const uint64_t a = slot(i).addr.load(std::memory_order_relaxed);
    if (a == addr) {
      return absl::AlreadyExistsError(absl::StrFormat("a probe is at 0x%x already", addr));
    }
    if (a == kSlotDeleted && !free.has_value()) {
      free = i;
    }
    if (a == kSlotEmpty) {
      if (!free.has_value()) {
        free = i;
      }
      break;
    }
  }
  if (!free.has_value()) {
    return absl::ResourceExhaustedError("the agent's probe hash is full");
  }
  KwProbeSlot& s = slot(*free);
  if (s.addr.load(std::memory_order_relaxed) == kSlotDeleted) {
    --tombstones_;
  }
  s.probe_index = index;
  s.addr.store(addr, std::memory_order_release);
  return absl::OkStatus();
}

void ShmTables::Rehash() {
  std::vector<std::pair<uint64_t, uint32_t>> live;
  for (uint32_t i = 0; i < layout_.hash_capacity; ++i) {
    KwProbeSlot& s = slot(i);
    const uint64_t a = s.addr.load(std::memory_order_relaxed);
    if (a != kSlotEmpty && a != kSlotDeleted) {
      live.emplace_back(a, s.probe_index);
    }
    s.addr.store(kSlotEmpty, std::memory_order_relaxed);
    s.probe_index = 0;
  }
  tombstones_ = 0;
  for (const auto& [a, index] : live) {
    KW_CHECK(HashInsert(a, index).ok());
  }
}

absl::StatusOr<uint32_t> ShmTables::AllocateCode(uint32_t ops) {
  for (auto it = free_code_.begin(); it != free_code_.end(); ++it) {
    if (it->second >= ops) {
      const uint32_t offset = it->first;
      const uint32_t rest = it->second - ops;
      free_code_.erase(it);
      if (rest > 0) {
        free_code_[offset + ops] = rest;
      }
      return offset;
    }
  }
  return absl::ResourceExhaustedError(absl::StrCat("the agent's fetch program pool (",
                                                   layout_.code_capacity, " ops) has no room for ",
                                                   ops, " more ops"));
}

void ShmTables::FreeCode(uint32_t offset, uint32_t ops) {
  if (ops == 0) {
    return;
  }
  auto [it, inserted] = free_code_.emplace(offset, ops);
  KW_CHECK(inserted);
  if (auto next = std::next(it); next != free_code_.end() && offset + ops == next->first) {
    it->second += next->second;
    free_code_.erase(next);
  }
  if (it != free_code_.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second == it->first) {
      prev->second += it->second;
      free_code_.erase(it);
    }
  }
}

absl::StatusOr<uint32_t> ShmTables::AddProbe(const ProbeEntry& entry) {
  const uint64_t addr = entry.addr.value;
  if (addr == kSlotEmpty || addr == kSlotDeleted) {
    return absl::InvalidArgumentError(absl::StrFormat("no probe can be at 0x%x", addr));
  }
  const std::optional<uint32_t> head = Lookup(entry.addr);
  std::optional<uint32_t> index;
  for (uint32_t i = 0; i < layout_.probe_capacity; ++i) {
    if (probe(i).flags.load(std::memory_order_relaxed) == 0) {
      index = i;
      break;
    }
  }
  if (!index.has_value()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the agent's probe table is full (", layout_.probe_capacity, " probes)"));
  }
  std::vector<KwFetchOp> program = entry.program;
  if (program.empty() || program.back().op != ka::kKwOpEnd) {
    program.push_back(KwFetchOp{.op = ka::kKwOpEnd, .a = 0, .b = 0, .imm = 0});
  }
  // The filter program right after the fetch program: one block, freed as one.
  const auto ops = static_cast<uint32_t>(program.size() + entry.filter.size());
  KW_ASSIGN_OR_RETURN(const uint32_t code_at, AllocateCode(ops));
  std::memcpy(code() + code_at, program.data(), program.size() * sizeof(KwFetchOp));
  if (!entry.filter.empty()) {
    std::memcpy(code() + code_at + program.size(), entry.filter.data(),
                entry.filter.size() * sizeof(KwFetchOp));
  }

  // Not reachable yet: no hash slot names it and its code is not patched.
  KwProbe& p = probe(*index);
  p.id = entry.id;
  p.addr = addr;
  p.xol_addr = entry.xol_addr;
  p.resume = entry.resume;
  p.insn_len = entry.insn_len;
  p.target = entry.target;
  p.cond = entry.cond;
  p.ret_imm = entry.ret_imm;
  p.ind_base = entry.ind_base;
  p.ind_index = entry.ind_index;
  p.ind_disp = entry.ind_disp;
  p.ind_scale = entry.ind_scale;
  p.ind_flags = entry.ind_flags;
  p.fetch_offset = code_at;
  p.fetch_len = static_cast<uint32_t>(program.size());
  p.filter_offset = code_at + p.fetch_len;
  p.filter_len = static_cast<uint32_t>(entry.filter.size());
  p.agg = entry.agg;
  p.record_bytes = entry.record_bytes;
  p.maxactive = entry.maxactive;
  p.call_watch = entry.call_watch;
  p.next = 0;
  p.active.store(0, std::memory_order_relaxed);
  for (std::atomic<uint64_t>* counter :
       {&p.hits, &p.missed, &p.nmissed, &p.lost, &p.faults, &p.abandoned, &p.filtered,
        &p.filter_no_value, &p.filter_div0}) {
    counter->store(0, std::memory_order_relaxed);
  }
  p.flags.store(entry.flags | ka::kKwProbeUsed, std::memory_order_release);

  BeginWrite();
  absl::Status inserted = absl::OkStatus();
  if (head.has_value()) {
    // Another probe at this address: the agent runs the chain from the hash's one.
    uint32_t last = *head;
    while (probe(last).next != 0) {
      last = probe(last).next - 1;
    }
    probe(last).next = *index + 1;
  } else {
    if (tombstones_ > layout_.hash_capacity / 4) {
      Rehash();
    }
    inserted = HashInsert(addr, *index);
  }
  EndWrite();
  if (!inserted.ok()) {
    p.flags.store(0, std::memory_order_release);
    FreeCode(code_at, ops);
    return inserted;
  }
  ++live_probes_;
  return *index;
}

absl::StatusOr<uint32_t> ShmTables::AddAggregate(const AggregateEntry& entry) {
  const AggregateEntry& h = entry;
  if (h.row_capacity == 0 || !std::has_single_bit(h.row_capacity)) {
    return absl::InvalidArgumentError(
        absl::StrCat("an aggregation of ", h.row_capacity, " rows (a power of two is needed)"));
  }
  const uint64_t row_bytes = sizeof(ka::KwAggRow) + uint64_t{h.buckets} * 8;
  const uint64_t at = (aggs_used_ + 63) & ~uint64_t{63};
  const uint64_t rows = at + sizeof(ka::KwAggregate);
  const uint64_t end = rows + uint64_t{h.row_capacity} * row_bytes;
  if (end > layout_.aggs_bytes || at + 1 > UINT32_MAX) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the agent's aggregation area (", layout_.aggs_bytes, " bytes) has no room for ",
        h.row_capacity, " more rows of ", row_bytes, " bytes"));
  }
  std::vector<KwFetchOp> programs = entry.value;
  programs.insert(programs.end(), entry.key.begin(), entry.key.end());
  uint32_t code_at = 0;
  if (!programs.empty()) {
    KW_ASSIGN_OR_RETURN(code_at, AllocateCode(static_cast<uint32_t>(programs.size())));
    std::memcpy(code() + code_at, programs.data(), programs.size() * sizeof(KwFetchOp));
  }
  auto* a = new (shm_.data() + layout_.aggs_offset + at) ka::KwAggregate{};
  a->func = h.func;
  a->flags = h.flags;
  a->next = entry.next;
  a->buckets = h.buckets;
  a->value_offset = code_at;
  a->value_len = static_cast<uint32_t>(entry.value.size());
  a->key_offset = code_at + a->value_len;
  a->key_len = static_cast<uint32_t>(entry.key.size());
  a->low = h.low;
  a->high = h.high;
  a->step = h.step;
  a->rows = rows;
  a->row_capacity = h.row_capacity;
  a->row_bytes = static_cast<uint32_t>(row_bytes);
  std::memset(shm_.data() + layout_.aggs_offset + rows, 0, end - rows);
  aggs_used_ = end;
  return static_cast<uint32_t>(at + 1);
}

const ka::KwAggregate& ShmTables::aggregate(uint32_t handle) const {
  KW_CHECK(handle != 0 && handle - 1 + sizeof(ka::KwAggregate) <= aggs_used_);
  return At<ka::KwAggregate>(layout_.aggs_offset + handle - 1);
}

std::vector<AggregateRowView> ShmTables::AggregateRows(uint32_t handle) const {
  const ka::KwAggregate& a = aggregate(handle);
  std::vector<AggregateRowView> out;
  for (uint32_t i = 0; i < a.row_capacity; ++i) {
    const uint64_t at = layout_.aggs_offset + a.rows + uint64_t{i} * a.row_bytes;
    const auto& row = At<ka::KwAggRow>(at);
    if (row.state.load(std::memory_order_acquire) != 2) {  // free, or being claimed
      continue;
    }
    AggregateRowView v;
    v.key = row.key;
    v.key_faulted = row.flags != 0;
    v.count = row.count.load(std::memory_order_relaxed);
    v.sum = row.sum.load(std::memory_order_relaxed);
    v.min = row.min.load(std::memory_order_relaxed);
    v.max = row.max.load(std::memory_order_relaxed);
    const auto* words = &At<std::atomic<uint64_t>>(at + sizeof(ka::KwAggRow));
    for (uint32_t b = 0; b < a.buckets; ++b) {
      v.buckets.push_back(words[b].load(std::memory_order_relaxed));
    }
    out.push_back(std::move(v));
  }
  return out;
}

absl::Status ShmTables::RemoveProbe(uint32_t index) {
  if (index >= layout_.probe_capacity || probe(index).flags.load(std::memory_order_relaxed) == 0) {
    return absl::NotFoundError(absl::StrCat("no probe at index ", index));
  }
  KwProbe& p = probe(index);
  const uint32_t mask = layout_.hash_capacity - 1;
  BeginWrite();
  uint32_t i = HashOf(p.addr);
  for (uint32_t n = 0; n < layout_.hash_capacity; ++n, i = (i + 1) & mask) {
    KwProbeSlot& s = slot(i);
    const uint64_t a = s.addr.load(std::memory_order_relaxed);
    if (a == kSlotEmpty) {
      break;
    }
    if (a != p.addr) {
      continue;
    }
    if (s.probe_index == index) {
      if (p.next != 0) {
        s.probe_index = p.next - 1;  // the chain's next heads it
      } else {
        s.addr.store(kSlotDeleted, std::memory_order_release);
        ++tombstones_;
      }
    } else {
      for (uint32_t prev = s.probe_index; probe(prev).next != 0; prev = probe(prev).next - 1) {
        if (probe(prev).next == index + 1) {
          probe(prev).next = p.next;
          break;
        }
      }
    }
    break;
  }
  p.flags.store(0, std::memory_order_release);
  p.next = 0;
  EndWrite();
  FreeCode(p.fetch_offset, p.fetch_len + p.filter_len);
  p.fetch_len = 0;
  p.filter_len = 0;
  --live_probes_;
  return absl::OkStatus();
}

absl::Status ShmTables::SetProbeFlags(uint32_t index, uint32_t set, uint32_t clear) {
  if (index >= layout_.probe_capacity || probe(index).flags.load(std::memory_order_relaxed) == 0) {
    return absl::NotFoundError(absl::StrCat("no probe at index ", index));
  }
  std::atomic<uint32_t>& flags = probe(index).flags;
  BeginWrite();
  flags.store(((flags.load(std::memory_order_relaxed) | set) & ~clear) | ka::kKwProbeUsed,
              std::memory_order_release);
  EndWrite();
  return absl::OkStatus();
}

std::optional<uint32_t> ShmTables::Lookup(core::RemoteAddr addr) const {
  const uint32_t mask = layout_.hash_capacity - 1;
  const std::atomic<uint32_t>& g = control().generation;
  for (;;) {
    const uint32_t before = g.load(std::memory_order_acquire);
    if ((before & 1) != 0) {
      continue;  // a write in progress (only another process's; kwatch's own never spans this)
    }
    std::optional<uint32_t> found;
    uint32_t i = HashOf(addr.value);
    for (uint32_t n = 0; n < layout_.hash_capacity; ++n, i = (i + 1) & mask) {
      const KwProbeSlot& s = slot(i);
      const uint64_t a = s.addr.load(std::memory_order_acquire);
      if (a == kSlotEmpty) {
        break;
      }
      if (a == addr.value) {
        found = s.probe_index;
        break;
      }
    }
    std::atomic_thread_fence(std::memory_order_acquire);
    if (g.load(std::memory_order_relaxed) == before) {
      return found;
    }
  }
}

absl::StatusOr<uint32_t> ShmTables::Journal(const PatchEntry& entry) {
  const size_t len = entry.original.size();
  if (len == 0 || len > sizeof(KwPatch::original) || entry.patched.size() != len) {
    return absl::InvalidArgumentError(
        absl::StrCat("a patch covers 1 to 16 bytes, original and patched alike (", len, " and ",
                     entry.patched.size(), ")"));
  }
  for (uint32_t i = 0; i < layout_.patch_capacity; ++i) {
    KwPatch& p = patch(i);
    if (p.state.load(std::memory_order_acquire) != ka::kKwPatchFree) {
      continue;
    }
    p.len = static_cast<uint32_t>(len);
    p.addr = entry.addr.value;
    p.original.fill(0);
    p.patched.fill(0);
    std::memcpy(p.original.data(), entry.original.data(), len);
    std::memcpy(p.patched.data(), entry.patched.data(), len);
    p.probe_index = entry.probe_index;
    p.state.store(entry.kind, std::memory_order_release);
    return i;
  }
  return absl::ResourceExhaustedError(
      absl::StrCat("the agent's patch journal is full (", layout_.patch_capacity, " patches)"));
}

void ShmTables::Unjournal(uint32_t index) {
  patch(index).state.store(ka::kKwPatchFree, std::memory_order_release);
}

void ShmTables::SetState(uint32_t state) {
  control().state.store(state, std::memory_order_seq_cst);
}

uint32_t ShmTables::state() const {
  return control().state.load(std::memory_order_acquire);
}

void ShmTables::FreeProcess(uint32_t index) {
  KwProcess& p = process(index);
  p.state.store(0, std::memory_order_relaxed);
  p.parent = 0;
  p.pid.store(0, std::memory_order_release);
}

void ShmTables::FreeThread(uint32_t index) {
  // Its return instances die with it: the probes' counts of live ones drop.
  KwThread& t = thread(index);
  for (uint32_t i = 0; i < std::min(t.instances, kwatch::agent::kKwMaxInstances); ++i) {
    const uint32_t p = t.instance[i].probe_index;
    if (p < layout_.probe_capacity && probe(p).flags.load(std::memory_order_relaxed) != 0) {
      probe(p).active.fetch_sub(1, std::memory_order_relaxed);
    }
  }
  KwRing& r = ring(index);
  r.head.store(0, std::memory_order_relaxed);
  r.tail.store(0, std::memory_order_relaxed);
  r.lost.store(0, std::memory_order_relaxed);
  r.tid.store(0, std::memory_order_release);
  t.instances = 0;
  t.depth.store(0, std::memory_order_relaxed);
  t.tid.store(0, std::memory_order_release);
}

}  // namespace kwatch::watch::agent
