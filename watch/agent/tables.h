#pragma once

// kwatch's side of the tables in an agent's shared memory (agent/abi.h): the probe table, its
// hash by address, the pool of fetch programs, the patch journal and the session state.
//
// Writers' protocol (the agent reads concurrently, from signal handlers and trampolines):
//  - a probe's fields are written while no thread can reach it (not in the hash, its code
//    not patched yet), then it is published in the hash;
//  - every change a reading thread may see (hash slots, flags of a live probe) happens inside
//    a seqlock write: KwControl::generation odd before, even after (release); the agent
//    retries a lookup that saw it move or odd;
//  - a patch is journaled (KwPatch state, release) before its bytes go into the code, and
//    its entry freed only after the original bytes are back.
//
// A view over memory someone else owns (the controller's mapping, or a test's buffer).
// Not thread-safe: one kwatch thread writes.

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/abi.h"
#include "core/base/remote_addr.h"
#include "watch/agent/shm_layout.h"

namespace kwatch::watch::agent {

using kwatch::agent::KwControl;
using kwatch::agent::KwFetchOp;
using kwatch::agent::KwPatch;
using kwatch::agent::KwProbe;
using kwatch::agent::KwProbeSlot;
using kwatch::agent::KwProcess;
using kwatch::agent::KwRing;
using kwatch::agent::KwThread;

// One probe as the controller plans it (see KwProbe for each field's meaning).
struct ProbeEntry {
  uint32_t id = 0;  // kwatch's probe id
  core::RemoteAddr addr{};
  uint32_t flags = kwatch::agent::kKwProbeEnabled;  // KwProbeFlags (Used is added)
  uint64_t xol_addr = 0;
  uint32_t resume = kwatch::agent::kKwResumeXol;
  uint32_t insn_len = 0;
  uint64_t target = 0;
  uint32_t cond = 0;
  uint32_t ret_imm = 0;
  uint32_t ind_base = 0;
  uint32_t ind_index = 0;
  int64_t ind_disp = 0;
  uint32_t ind_scale = 1;
  uint32_t ind_flags = 0;
  std::vector<KwFetchOp> program{};  // kKwOpEnd is appended when missing
  std::vector<KwFetchOp> filter{};   // the filter program (ends with kKwFilterEnd), or none
  uint32_t agg = 0;                  // its first aggregation (AddAggregate's handle), or 0
  uint32_t record_bytes = 0;
  uint32_t maxactive = 0;
  uint32_t call_watch = 0;  // KwProbe::call_watch (per-call watches): a KwCallWatch index + 1
};

// One aggregation as the controller plans it (agent/abi.h "Aggregations", KwAggregate for
// each field's meaning); AddAggregate places the programs and the rows.
struct AggregateEntry {
  uint32_t func = kwatch::agent::kKwAggCount;
  uint32_t flags = 0;
  uint32_t buckets = 0;
  int64_t low = 0;
  int64_t high = 0;
  int64_t step = 1;
  uint32_t row_capacity = 1;
  std::vector<KwFetchOp> value{};  // the value's program (ends with kKwFilterEnd), or none
  std::vector<KwFetchOp> key{};    // the key's program, or none (one row)
  uint32_t next = 0;               // the probe's next aggregation (a handle), or 0
};

// One row of an aggregation as kwatch reads it.
struct AggregateRowView {
  uint64_t key = 0;
  bool key_faulted = false;
  uint64_t count = 0;
  uint64_t sum = 0;
  uint64_t min = 0;
  uint64_t max = 0;
  std::vector<uint64_t> buckets;  // KwAggregate::buckets words
};

// One patch as kwatch is about to make it.
struct PatchEntry {
  uint32_t kind = kwatch::agent::kKwPatchInt3;  // KwPatchState
  core::RemoteAddr addr{};
  std::vector<uint8_t> original{};  // the bytes there now (1 for INT3, 5..16 for a jump)
  std::vector<uint8_t> patched{};   // what goes there (same length)
  uint32_t probe_index = 0;
};

class ShmTables {
 public:
  // `shm` holds a control block written by InitControl for `layout`.
  ShmTables(std::span<uint8_t> shm, const ShmLayout& layout);

  const ShmLayout& layout() const { return layout_; }
  // The parts of the memory (indexes checked: KW_CHECK).
  KwControl& control() { return At<KwControl>(0); }
  const KwControl& control() const { return At<KwControl>(0); }
  KwProbe& probe(uint32_t index) { return At<KwProbe>(ProbeOffset(index)); }
  // Per-call watch `index` (< layout().call_watch_capacity), written before its probes.
  kwatch::agent::KwCallWatch& call_watch(uint32_t index) {
    return At<kwatch::agent::KwCallWatch>(layout_.call_watches_offset +
                                          uint64_t{index} * sizeof(kwatch::agent::KwCallWatch));
  }
  const kwatch::agent::KwCallWatch& call_watch(uint32_t index) const {
    return At<kwatch::agent::KwCallWatch>(layout_.call_watches_offset +
                                          uint64_t{index} * sizeof(kwatch::agent::KwCallWatch));
  }
  const KwProbe& probe(uint32_t index) const { return At<KwProbe>(ProbeOffset(index)); }
  KwProbeSlot& slot(uint32_t index) { return At<KwProbeSlot>(SlotOffset(index)); }
  const KwProbeSlot& slot(uint32_t index) const { return At<KwProbeSlot>(SlotOffset(index)); }
  KwFetchOp* code() { return &At<KwFetchOp>(layout_.code_offset); }
  const KwFetchOp* code() const { return &At<KwFetchOp>(layout_.code_offset); }
  KwPatch& patch(uint32_t index) { return At<KwPatch>(PatchOffset(index)); }
  const KwPatch& patch(uint32_t index) const { return At<KwPatch>(PatchOffset(index)); }
  KwThread& thread(uint32_t index) { return At<KwThread>(ThreadOffset(index)); }
  const KwThread& thread(uint32_t index) const { return At<KwThread>(ThreadOffset(index)); }
  KwProcess& process(uint32_t index) { return At<KwProcess>(ProcessOffset(index)); }
  const KwProcess& process(uint32_t index) const { return At<KwProcess>(ProcessOffset(index)); }
  KwRing& ring(uint32_t index) { return At<KwRing>(RingOffset(index)); }
  const KwRing& ring(uint32_t index) const { return At<KwRing>(RingOffset(index)); }
  uint8_t* ring_data(uint32_t index) { return shm_.data() + RingOffset(index) + sizeof(KwRing); }

  // Writes a probe (and its fetch program into the pool) and publishes it in the hash, or at
  // the end of the chain of the probes already at its address (KwProbe::next; the agent uses
  // the first one's resume fields: give every probe of an address the same). Returns its
  // index. ResourceExhausted when the probe table, the hash or the pool is full.
  absl::StatusOr<uint32_t> AddProbe(const ProbeEntry& entry);
  // Takes a probe out of the hash or its chain and frees its slot and program. The last probe
  // of an address goes once its code is restored (a thread that still traps there finds no
  // probe and runs the original); a jump probe's trampoline names its chain's first probe.
  absl::Status RemoveProbe(uint32_t index);
  // Sets and clears KwProbeFlags of a live probe (Enabled, Removing) under the seqlock.
  absl::Status SetProbeFlags(uint32_t index, uint32_t set, uint32_t clear);
  // The probe at `addr`, looked up as the agent does (seqlock, linear probing).
  std::optional<uint32_t> Lookup(core::RemoteAddr addr) const;
  size_t live_probes() const { return live_probes_; }

  // Writes an aggregation (its programs into the pool, its header and rows into the area)
  // for a probe not published yet: returns its handle (ProbeEntry::agg, AggregateEntry::next).
  // ResourceExhausted when the area or the pool is full.
  absl::StatusOr<uint32_t> AddAggregate(const AggregateEntry& entry);
  // The aggregation of `handle`: its header and its ready rows (while the agent may be adding
  // to them: each word is read atomically, a row as a whole is not).
  const kwatch::agent::KwAggregate& aggregate(uint32_t handle) const;
  std::vector<AggregateRowView> AggregateRows(uint32_t handle) const;

  // Journals a patch before its bytes are written: returns the entry's index.
  // ResourceExhausted when the journal is full; InvalidArgument for bad lengths.
  absl::StatusOr<uint32_t> Journal(const PatchEntry& entry);
  // Frees an entry once the original bytes are back.
  void Unjournal(uint32_t index);

  // Sequentially consistent: the end reads the process table after setting Stopping
  // (agent/abi.h "Followed processes").
  void SetState(uint32_t state);
  uint32_t state() const;

  // Frees thread slot `index` (its thread is gone and its ring drained): its return
  // instances leave their probes' `active` counts, and the ring and the slot become free.
  void FreeThread(uint32_t index);
  // Frees process entry `index` (its process ended): state 0, then pid 0.
  void FreeProcess(uint32_t index);

 private:
  template <typename T>
  T& At(uint64_t offset) const {
    return *reinterpret_cast<T*>(shm_.data() + offset);
  }
  uint64_t ProbeOffset(uint32_t index) const;
  uint64_t SlotOffset(uint32_t index) const;
  uint64_t PatchOffset(uint32_t index) const;
  uint64_t ThreadOffset(uint32_t index) const;
  uint64_t ProcessOffset(uint32_t index) const;
  uint64_t RingOffset(uint32_t index) const;
  uint32_t HashOf(uint64_t addr) const;
  void BeginWrite();
  void EndWrite();
  // Inside a write: puts `addr` -> `index` in the hash. ResourceExhausted when full.
  absl::Status HashInsert(uint64_t addr, uint32_t index);
  // Inside a write: rebuilds the hash without tombstones.
  void Rehash();
  absl::StatusOr<uint32_t> AllocateCode(uint32_t ops);
  void FreeCode(uint32_t offset, uint32_t ops);

  std::span<uint8_t> shm_;
  ShmLayout layout_;
  uint32_t hash_shift_ = 0;
  size_t live_probes_ = 0;
  uint32_t tombstones_ = 0;
  std::map<uint32_t, uint32_t> free_code_;  // offset -> ops, coalesced
  uint64_t aggs_used_ = 0;                  // bytes of the aggregations' area handed out
};

// Hash slot values besides addresses.
inline constexpr uint64_t kSlotEmpty = 0;
inline constexpr uint64_t kSlotDeleted = ~uint64_t{0};

}  // namespace kwatch::watch::agent
