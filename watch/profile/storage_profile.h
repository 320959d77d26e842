#pragma once

#include <sys/types.h>

#include <array>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"
#include "core/base/remote_addr.h"
#include "core/event.h"
#include "watch/profile/false_sharing.h"
#include "watch/profile/profile_types.h"
#include "watch/profile/site_table.h"
#include "watch/profile/time_bins.h"
#include "watch/profile/value_history.h"

namespace kwatch::watch::profile {

// Storage profile of a set of watched objects, fed one AccessEvent at a time: which fields
// and bytes are read and written, when (time columns), by which instructions and threads,
// with which values, and which cache lines the threads write at the same time (false
// sharing). Add is amortized O(1): the fields and cache lines an access touches are computed
// once per distinct (watch, first byte, size) and cached; no allocation or string work per
// event after warm-up. Memory is bounded by fields, bytes (max_tracked_bytes,
// max_tracked_total), sites (the max_sites_* caps), threads, distinct access shapes (a cache of
// at most 65536 shapes; further shapes are recomputed per event), and per field and per
// (thread, field) pair that was accessed, one row of time columns (only for what was accessed:
// a field or thread nobody touched costs no time columns), never by the number of events.
//
// An event touches the bytes [access_addr, +access_size) when access_size > 0, else the
// watched range [addr, +len), clipped to the object; a field is touched when its effective
// bytes overlap them. Execute events count only in ObjectStats/ThreadInfo::execs; events of
// an unknown watch_id only in ignored_events().
//
// Field indices are global (all objects' fields, object by object, in layout order); thread
// indices follow first appearance. The class is a value: copy it to take an immutable
// snapshot (e.g. std::make_shared<const StorageProfile>(profile)). Not thread-safe.
class StorageProfile {
 public:
  StorageProfile(std::vector<WatchedObject> objects, const ProfileOptions& opts);

  void Add(const core::AccessEvent& ev) { AddImpl<false>(ev, nullptr); }
  // Add, and appends the global indices of the fields the event was counted in (binned) to
  // `touched` (none for execute events and events of unknown watches).
  void AddCollect(const core::AccessEvent& ev, std::vector<uint32_t>* touched) {
    AddImpl<true>(ev, touched);
  }
  friend class ProfileCodec;

  const ProfileOptions& options() const { return opts_; }

  // Objects and their fields.
  const std::vector<WatchedObject>& objects() const { return objects_; }
  const ObjectStats& object_stats(uint32_t obj) const { return object_stats_[obj]; }
  const std::vector<FieldInfo>& fields() const { return fields_; }
  // Global indices of `obj`'s fields: [first, second).
  std::pair<uint32_t, uint32_t> FieldRange(uint32_t obj) const {
    return {field_begin_[obj], field_begin_[obj + 1]};
  }
  // Sites of all of `obj`'s read/write events, ranked; other_sites: beyond the cap.
  std::vector<SiteCount> ObjectSites(uint32_t obj) const { return object_sites_[obj].Ranked(); }
  const RwCounts& ObjectOtherSites(uint32_t obj) const { return object_sites_[obj].other(); }
  // Per-byte counts of the object's first min(length, max_tracked_bytes) bytes.
  absl::Span<const uint64_t> ByteReads(uint32_t obj) const { return byte_reads_[obj]; }
  absl::Span<const uint64_t> ByteWrites(uint32_t obj) const { return byte_writes_[obj]; }

  // Per field (global index).
  const RwCounts& field_counts(uint32_t field) const { return field_counts_[field]; }
  // Threads that touched it.
  uint32_t FieldThreadCount(uint32_t field) const { return field_threads_[field]; }
  std::vector<SiteCount> FieldSites(uint32_t field) const { return field_sites_[field].Ranked(); }
  const RwCounts& FieldOtherSites(uint32_t field) const { return field_sites_[field].other(); }
  // Values seen in the field (oldest first, at most value_history): only from events whose
  // value covers all of the field's bits (at most 8 bytes from the first accessed byte).
  std::vector<ValueSample> FieldValues(uint32_t field) const { return values_[field].Samples(); }

  // Time columns (shared axis, see TimeBins): per field, reads or writes per column.
  const TimeBins& bins() const { return bins_; }
  absl::Span<const uint64_t> FieldBins(uint32_t field, bool writes) const {
    return bins_.Row(2 * field + (writes ? 1 : 0));
  }
  // The same for one thread's accesses (all zeros if the thread never touched the field).
  std::vector<uint64_t> ThreadFieldBins(uint32_t thread, uint32_t field, bool writes) const;
  // Events binned nowhere: before a fixed-width window (TimeBins::kLate).
  uint64_t late_events() const { return late_events_; }

  // Threads, in order of first appearance.
  const std::vector<ThreadInfo>& threads() const { return threads_; }
  // One thread's accesses to one field (zeros when it never touched it). O(1) expected.
  const RwCounts& ThreadFieldCounts(uint32_t thread, uint32_t field) const;
  // The fields `thread` touched with its counts, by field index. O(k log k) for its k fields.
  std::vector<std::pair<uint32_t, RwCounts>> ThreadFields(uint32_t thread) const;
  // (thread, field) pairs with accesses: what the per-thread views hold.
  size_t thread_field_pairs() const { return thread_field_index_.size(); }
  // Index of `tid` in threads(), or kNone.
  uint32_t ThreadIndex(pid_t tid) const;

  // Cache lines holding watched fields (tracked bytes only), by address, and the findings.
  const std::vector<CacheLine>& lines() const { return lines_; }
  std::vector<FalseSharingFinding> FalseSharing(size_t top_sites = 5) const;

  // Totals.
  uint64_t events() const { return events_; }  // every event passed to Add
  uint64_t ignored_events() const { return ignored_; }
  uint64_t first_ns() const { return first_ns_; }  // 0 before any event
  uint64_t last_ns() const { return last_ns_; }

  static constexpr uint32_t kNone = ~0U;

 private:
  struct FieldHit {
    uint32_t field;
    uint8_t value_shift;  // the field's bits in AccessEvent::value: shift and width
    uint8_t value_bits;   // 0: the value does not cover the field
  };
  struct LineHit {
    uint32_t line;
    uint32_t pos_begin;  // into line_pos_
    uint32_t n_pos;
    uint64_t mask;  // accessed bytes of the line
  };
  struct Shape {  // what an access of one (watch, first byte, size) touches
    uint32_t field_begin, n_fields, line_begin, n_lines;
    uint64_t byte_begin, byte_end;  // tracked bytes, from the object's start
  };
  struct ShapeKey {
    uint32_t object;
    uint32_t size;
    uint64_t rel;  // first accessed byte - object address (mod 2^64)
    bool operator==(const ShapeKey&) const = default;
    template <typename H>
    friend H AbslHashValue(H h, const ShapeKey& k) {
      return H::combine(std::move(h), k.object, k.size, k.rel);
    }
  };

  // Direct-mapped caches in front of the hash maps (threads, shapes).
  struct ThreadSlot {
    pid_t tid = 0;
    uint32_t index = kNone;
  };
  struct ShapeSlot {
    ShapeKey key{kNone, 0, 0};
    uint32_t shape = kNone;
  };
  static size_t ShapeSlotFor(const ShapeKey& k) {
    const uint64_t mix = k.rel + (uint64_t{k.size} << 32) + (uint64_t{k.object} << 48);
    return static_cast<size_t>((mix * 0x9E3779B97F4A7C15ULL) >> 56);
  }

  // One thread's accesses to one field.
  struct ThreadField {
    uint32_t field = 0;
    uint32_t row = kNone;  // its reads row in bins_ (writes: row + 1), kNone before any
    RwCounts counts;
  };
  static uint64_t ThreadFieldKey(uint32_t thread, uint32_t field) {
    return (uint64_t{thread} << 32) | field;
  }
  struct PairSlot {  // a direct-mapped cache in front of thread_field_index_
    uint64_t key = ~uint64_t{0};
    uint32_t pos = 0;
  };
  static size_t PairSlotFor(uint64_t key) {
    return static_cast<size_t>((key * 0x9E3779B97F4A7C15ULL) >> 56);
  }

  template <bool kCollect>
  void AddImpl(const core::AccessEvent& ev, std::vector<uint32_t>* touched);
  uint32_t ThreadFor(const core::AccessEvent& ev);
  void BuildShape(uint32_t obj, uint64_t start, uint64_t size);

  ProfileOptions opts_;
  std::vector<WatchedObject> objects_;
  std::vector<uint32_t> object_by_id_;  // watch id -> object index or kNone
  std::vector<ObjectStats> object_stats_;
  std::vector<SiteTable> object_sites_;
  std::vector<std::vector<uint64_t>> byte_reads_, byte_writes_;
  std::vector<FieldInfo> fields_;
  std::vector<uint32_t> field_begin_;  // per object, plus one past the end
  std::vector<RwCounts> field_counts_;
  std::vector<SiteTable> field_sites_;
  std::vector<ValueRing> values_;
  TimeBins bins_;  // rows 2f, 2f+1: field f reads, writes; then per-thread rows
  uint64_t late_events_ = 0;
  std::vector<ThreadInfo> threads_;
  absl::flat_hash_map<pid_t, uint32_t> thread_index_;
  // Per thread, the fields it touched (in order of first access), found by ThreadFieldKey.
  std::vector<std::vector<ThreadField>> thread_fields_;
  absl::flat_hash_map<uint64_t, uint32_t> thread_field_index_;  // -> position in its vector
  std::vector<uint32_t> field_threads_;                         // per field
  std::vector<CacheLine> lines_;
  absl::flat_hash_map<uint64_t, uint32_t> line_index_;  // line address -> index
  // Access shapes: the cache, the pools their hits live in, and the previous lookup.
  absl::flat_hash_map<ShapeKey, uint32_t> shape_index_;
  std::vector<Shape> shapes_;
  std::vector<FieldHit> field_hits_;
  std::vector<LineHit> line_hits_;
  std::vector<uint32_t> line_pos_;
  std::array<ShapeSlot, 256> shape_cache_{};
  std::array<ThreadSlot, 16> thread_cache_{};
  std::array<PairSlot, 256> pair_cache_{};
  uint64_t events_ = 0, ignored_ = 0, first_ns_ = 0, last_ns_ = 0;
};

}  // namespace kwatch::watch::profile
