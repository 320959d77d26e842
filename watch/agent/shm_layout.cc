#include "watch/agent/shm_layout.h"

#include <bit>
#include <cstring>
#include <new>

#include "absl/strings/str_cat.h"
#include "agent/abi.h"

namespace kwatch::watch::agent {

namespace {

using kwatch::agent::KwCallWatch;
using kwatch::agent::KwControl;
using kwatch::agent::KwFetchOp;
using kwatch::agent::KwPatch;
using kwatch::agent::KwProbe;
using kwatch::agent::KwProbeSlot;
using kwatch::agent::KwProcess;
using kwatch::agent::KwRing;
using kwatch::agent::KwThread;

constexpr uint64_t kAlign = 64;
constexpr uint64_t kPage = 4096;
constexpr uint64_t kMaxTotal = uint64_t{1} << 32;

uint64_t AlignUp(uint64_t v, uint64_t a) {
  return (v + a - 1) & ~(a - 1);
}

}  // namespace

uint64_t ShmLayout::ring_stride() const {
  return sizeof(KwRing) + ring_bytes;
}

absl::StatusOr<ShmLayout> ComputeLayout(const ShmConfig& config) {
  ShmLayout l;
  l.probe_capacity = config.probe_capacity;
  if (l.probe_capacity == 0) {
    return absl::InvalidArgumentError("the probe table needs room for at least one probe");
  }
  l.hash_capacity = config.hash_capacity;
  if (l.hash_capacity == 0) {
    l.hash_capacity = std::bit_ceil(std::max<uint32_t>(16, 2 * l.probe_capacity));
  }
  if (!std::has_single_bit(l.hash_capacity) || l.hash_capacity < l.probe_capacity + 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("hash capacity ", l.hash_capacity,
                     " must be a power of two above the probe capacity ", l.probe_capacity));
  }
  l.code_capacity = config.code_capacity;
  l.patch_capacity = config.patch_capacity == 0 ? l.probe_capacity : config.patch_capacity;
  l.thread_capacity = config.thread_capacity;
  if (l.code_capacity == 0 || l.thread_capacity == 0) {
    return absl::InvalidArgumentError("the fetch code pool and the thread table need room");
  }
  l.ring_bytes = config.ring_bytes;
  if (!std::has_single_bit(l.ring_bytes) || l.ring_bytes < kPage) {
    return absl::InvalidArgumentError(
        absl::StrCat("ring size ", l.ring_bytes, " must be a power of two of at least 4096"));
  }
  uint64_t at = AlignUp(sizeof(KwControl), kAlign);
  l.probes_offset = at;
  at = AlignUp(at + uint64_t{l.probe_capacity} * sizeof(KwProbe), kAlign);
  l.hash_offset = at;
  at = AlignUp(at + uint64_t{l.hash_capacity} * sizeof(KwProbeSlot), kAlign);
  l.code_offset = at;
  at = AlignUp(at + uint64_t{l.code_capacity} * sizeof(KwFetchOp), kAlign);
  l.patches_offset = at;
  at = AlignUp(at + uint64_t{l.patch_capacity} * sizeof(KwPatch), kAlign);
  l.process_capacity = config.process_capacity;
  l.processes_offset = at;
  at = AlignUp(at + uint64_t{l.process_capacity} * sizeof(KwProcess), kAlign);
  l.threads_offset = at;
  at = AlignUp(at + uint64_t{l.thread_capacity} * sizeof(KwThread), kAlign);
  l.rings_offset = at;
  at += uint64_t{l.thread_capacity} * l.ring_stride();
  l.aggs_bytes = AlignUp(config.aggs_bytes, kAlign);
  l.aggs_offset = l.aggs_bytes > 0 ? AlignUp(at, kPage) : 0;
  if (l.aggs_bytes > 0) {
    at = l.aggs_offset + l.aggs_bytes;
  }
  if (config.call_watch_capacity > 0) {
    if (!std::has_single_bit(config.call_ring_pages)) {
      return absl::InvalidArgumentError(
          absl::StrCat("per-call ring pages ", config.call_ring_pages, " must be a power of two"));
    }
    l.call_watch_capacity = config.call_watch_capacity;
    l.call_ring_pages = config.call_ring_pages;
    l.call_sample_type = config.call_sample_type;
    l.call_sample_regs = config.call_sample_regs;
    l.call_watches_offset = AlignUp(at, kAlign);
    at = l.call_watches_offset + uint64_t{l.call_watch_capacity} * sizeof(KwCallWatch);
  }
  l.total_size = AlignUp(at, kPage);
  if (l.total_size > kMaxTotal) {
    return absl::InvalidArgumentError(
        absl::StrCat("the shared memory would take ", l.total_size,
                     " bytes (over 4 GiB): fewer threads or smaller rings"));
  }
  return l;
}

void InitControl(std::span<uint8_t> shm, const ShmLayout& layout, uint32_t flags,
                 pid_t controller_pid, pid_t target_pid) {
  auto* c = new (shm.data()) KwControl{};
  c->magic = kwatch::agent::kKwMagic;
  c->abi_version = kwatch::agent::kKwAbiVersion;
  c->flags = flags;
  c->total_size = layout.total_size;
  c->controller_pid = controller_pid;
  c->target_pid = target_pid;
  c->probes_offset = layout.probes_offset;
  c->probe_capacity = layout.probe_capacity;
  c->hash_capacity = layout.hash_capacity;
  c->hash_offset = layout.hash_offset;
  c->code_offset = layout.code_offset;
  c->code_capacity = layout.code_capacity;
  c->thread_capacity = layout.thread_capacity;
  c->threads_offset = layout.threads_offset;
  c->rings_offset = layout.rings_offset;
  c->ring_count = layout.thread_capacity;
  c->ring_bytes = layout.ring_bytes;
  c->patches_offset = layout.patches_offset;
  c->patch_capacity = layout.patch_capacity;
  c->processes_offset = layout.processes_offset;
  c->process_capacity = layout.process_capacity;
  c->aggs_offset = layout.aggs_offset;
  c->aggs_bytes = layout.aggs_bytes;
  c->call_watches_offset = layout.call_watches_offset;
  c->call_watch_capacity = layout.call_watch_capacity;
  c->call_ring_pages = layout.call_ring_pages;
  c->call_sample_type = layout.call_sample_type;
  c->call_sample_regs = layout.call_sample_regs;
  c->state.store(kwatch::agent::kKwStateInit, std::memory_order_release);
  c->generation.store(0, std::memory_order_release);
}

}  // namespace kwatch::watch::agent
