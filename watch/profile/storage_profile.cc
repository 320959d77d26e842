#include "watch/profile/storage_profile.h"

#include <algorithm>
#include <tuple>

#include "core/base/status_macros.h"
#include "watch/session.h"

namespace kwatch::watch::profile {
namespace {

constexpr size_t kMaxShapes = 65536;
constexpr RwCounts kNoCounts{};  // what a thread that never touched a field did to it

uint64_t LowBits(uint64_t v, uint32_t bits) {
  return bits >= 64 ? v : v & ((uint64_t{1} << bits) - 1);
}

}  // namespace

WatchedObject ObjectForWatch(const Watch& w) {
  WatchedObject o;
  o.id = w.id;
  o.expr = w.target.display;
  o.addr = w.target.addr;
  o.length = w.target.length;
  o.type_name = w.target.type_name;
  if (w.target.layout.has_value()) {
    o.fields = w.target.layout->fields;
  }
  return o;
}

StorageProfile::StorageProfile(std::vector<WatchedObject> objects, const ProfileOptions& opts)
    : opts_(opts),
      objects_(std::move(objects)),
      bins_(opts.start_ns, opts.bucket_ns, opts.initial_bucket_ns, opts.max_buckets) {
  const size_t n = objects_.size();
  uint32_t max_id = 0;
  for (const WatchedObject& o : objects_) {
    max_id = std::max(max_id, o.id);
  }
  KW_CHECK(max_id < (1U << 24));  // watch ids are small session indices
  object_by_id_.assign(n == 0 ? 0 : max_id + 1, kNone);
  object_stats_.resize(n);
  object_sites_.assign(n, SiteTable(opts_.max_sites_per_object));
  byte_reads_.resize(n);
  byte_writes_.resize(n);
  field_begin_.push_back(0);
  uint64_t tracked_total = 0;
  for (uint32_t i = 0; i < n; ++i) {
    const WatchedObject& o = objects_[i];
    KW_CHECK(object_by_id_[o.id] == kNone);  // ids are unique
    object_by_id_[o.id] = i;
    for (const size_t c : core::symbols::CountedFields(o.fields)) {
      const core::symbols::FieldLayout& f = o.fields[c];
      FieldInfo fi{i,          o.expr + f.path, f.type_name,
                   f.offset,   f.size,          f.bit_offset,
                   f.bit_size, f.offset,        f.offset + std::max<uint64_t>(f.size, 1)};
      if (f.bit_size > 0) {
        fi.begin = f.offset + f.bit_offset / 8;
        fi.end = f.offset + (f.bit_offset + f.bit_size + 7) / 8;
      }
      fields_.push_back(std::move(fi));
    }
    if (fields_.size() == field_begin_.back()) {  // no leaf: the object is one field
      fields_.push_back(
          FieldInfo{i, o.expr, o.type_name, 0, o.length, 0, 0, 0, std::max<uint64_t>(o.length, 1)});
    }
    field_begin_.push_back(static_cast<uint32_t>(fields_.size()));
    const uint64_t tracked =
        std::min({o.length, opts_.max_tracked_bytes, opts_.max_tracked_total - tracked_total});
    tracked_total += tracked;
    byte_reads_[i].assign(tracked, 0);
    byte_writes_[i].assign(tracked, 0);
  }
  const size_t nf = fields_.size();
  field_counts_.resize(nf);
  field_threads_.assign(nf, 0);
  field_sites_.assign(nf, SiteTable(opts_.max_sites_per_field));
  values_.assign(nf, ValueRing(opts_.value_history));
  for (size_t f = 0; f < 2 * nf; ++f) {
    bins_.AddRow();
  }

  // Cache lines: every line holding tracked effective bytes of a field.
  std::vector<std::tuple<uint64_t, uint64_t, uint32_t>> members;  // line, field address, field
  for (uint32_t f = 0; f < nf; ++f) {
    const FieldInfo& fi = fields_[f];
    const WatchedObject& o = objects_[fi.object];
    const uint64_t hi = std::min(fi.end, byte_reads_[fi.object].size());
    if (fi.begin >= hi) {
      continue;
    }
    const uint64_t abs_lo = o.addr.value + fi.begin;
    const uint64_t abs_hi = o.addr.value + hi;
    const uint64_t first_line = abs_lo / kCacheLineBytes;
    const uint64_t last_line = (abs_hi - 1) / kCacheLineBytes;
    if (members.size() + (last_line - first_line + 1) > opts_.max_line_members) {
      break;  // this field and the later ones stay out of the lines
    }
    for (uint64_t l = first_line; l <= last_line; ++l) {
      members.emplace_back(l * kCacheLineBytes, abs_lo, f);
    }
  }
  std::sort(members.begin(), members.end());
  for (const auto& [line, field_addr, field] : members) {
    if (lines_.empty() || lines_.back().addr.value != line) {
      line_index_.emplace(line, static_cast<uint32_t>(lines_.size()));
      lines_.emplace_back().addr = core::RemoteAddr{line};
    }
    lines_.back().fields.push_back(field);
  }
}

void StorageProfile::BuildShape(uint32_t obj, uint64_t start, uint64_t size) {
  const WatchedObject& o = objects_[obj];
  Shape s{static_cast<uint32_t>(field_hits_.size()),
          0,
          static_cast<uint32_t>(line_hits_.size()),
          0,
          0,
          0};
  const uint64_t a_lo = std::max(start, o.addr.value);
  const uint64_t a_hi = std::min(start + size, o.addr.value + o.length);
  if (a_lo < a_hi) {
    const uint64_t lo = a_lo - o.addr.value;
    const uint64_t hi = a_hi - o.addr.value;
    const uint64_t tracked = byte_reads_[obj].size();
    s.byte_begin = std::min(lo, tracked);
    s.byte_end = std::min(hi, tracked);
    // The value covers min(size, 8) bytes from `start`.
    const uint64_t value_bits = std::min<uint64_t>(size, 8) * 8;
    const auto [fbegin, fend] = FieldRange(obj);
    for (uint32_t f = fbegin; f < fend; ++f) {
      const FieldInfo& fi = fields_[f];
      if (fi.begin >= hi || fi.end <= lo) {
        continue;
      }
      FieldHit h{f, 0, 0};
      const uint64_t field_addr = o.addr.value + fi.offset;
      const uint64_t nbits = fi.bit_size > 0 ? fi.bit_size : (fi.size <= 8 ? fi.size * 8 : 0);
      if (field_addr >= start && nbits > 0) {
        const uint64_t shift = (field_addr - start) * 8 + fi.bit_offset;
        if (shift + nbits <= value_bits) {
          h.value_shift = static_cast<uint8_t>(shift);
          h.value_bits = static_cast<uint8_t>(nbits);
        }
      }
      field_hits_.push_back(h);
    }
    s.n_fields = static_cast<uint32_t>(field_hits_.size()) - s.field_begin;
    // Lines: the accessed tracked bytes, line by line, with the touched fields in each.
    const uint64_t t_hi = o.addr.value + s.byte_end;
    for (uint64_t la = a_lo / kCacheLineBytes * kCacheLineBytes; la < t_hi && s.n_fields > 0;
         la += kCacheLineBytes) {
      const auto it = line_index_.find(la);
      if (it == line_index_.end()) {
        continue;
      }
      const CacheLine& line = lines_[it->second];
      const uint64_t seg_lo = std::max(a_lo, la);
      const uint64_t seg_hi = std::min(t_hi, la + kCacheLineBytes);
      LineHit lh{it->second, static_cast<uint32_t>(line_pos_.size()), 0, 0};
      for (uint32_t p = 0; p < line.fields.size(); ++p) {
        const FieldInfo& fi = fields_[line.fields[p]];
        if (fi.object == obj && o.addr.value + fi.begin < seg_hi &&
            o.addr.value + fi.end > seg_lo) {
          line_pos_.push_back(p);
        }
      }
      lh.n_pos = static_cast<uint32_t>(line_pos_.size()) - lh.pos_begin;
      if (lh.n_pos == 0) {
        continue;
      }
      const uint64_t b0 = seg_lo - la;
      const uint64_t nb = seg_hi - seg_lo;
      lh.mask = (nb >= 64 ? ~uint64_t{0} : ((uint64_t{1} << nb) - 1)) << b0;
      line_hits_.push_back(lh);
    }
    s.n_lines = static_cast<uint32_t>(line_hits_.size()) - s.line_begin;
  }
  shapes_.push_back(s);
}

uint32_t StorageProfile::ThreadFor(const core::AccessEvent& ev) {
  ThreadSlot& slot = thread_cache_[static_cast<uint32_t>(ev.tid) % thread_cache_.size()];
  uint32_t idx = slot.index;
  if (idx == kNone || slot.tid != ev.tid) {
    const auto [it, inserted] =
        thread_index_.try_emplace(ev.tid, static_cast<uint32_t>(threads_.size()));
    if (inserted) {
      threads_.push_back(ThreadInfo{ev.tid, ev.pid, ev.time_ns, ev.time_ns, {}, 0});
      thread_fields_.emplace_back();
    }
    idx = it->second;
    slot = ThreadSlot{ev.tid, idx};
  }
  ThreadInfo& ti = threads_[idx];
  ti.first_ns = std::min(ti.first_ns, ev.time_ns);
  ti.last_ns = std::max(ti.last_ns, ev.time_ns);
  return idx;
}

template <bool kCollect>
void StorageProfile::AddImpl(const core::AccessEvent& ev, std::vector<uint32_t>* touched) {
  ++events_;
  const uint32_t obj = ev.watch_id < object_by_id_.size() ? object_by_id_[ev.watch_id] : kNone;
  if (obj == kNone) {
    ++ignored_;
    return;
  }
  const uint64_t t = ev.time_ns;
  if (events_ - ignored_ == 1) {
    first_ns_ = t;
    last_ns_ = t;
  } else {
    first_ns_ = std::min(first_ns_, t);
    last_ns_ = std::max(last_ns_, t);
  }
  const uint32_t th = ThreadFor(ev);
  ThreadInfo& ti = threads_[th];
  ObjectStats& os = object_stats_[obj];
  if (ev.kind == core::AccessKind::kExec) {
    ++os.execs;
    ++ti.execs;
    return;
  }
  const bool w = ev.kind == core::AccessKind::kWrite;
  os.total.Add(w);
  ti.total.Add(w);
  object_sites_[obj].Add(ev.ip, w);

  // The shape of this access: cached, or built at the end of the pools for this event only.
  const uint64_t start = ev.access_size > 0 ? ev.access_addr.value : ev.addr.value;
  const uint32_t size = ev.access_size > 0 ? ev.access_size : ev.len;
  const ShapeKey key{obj, size, start - objects_[obj].addr.value};
  ShapeSlot& slot = shape_cache_[ShapeSlotFor(key)];
  uint32_t si = slot.shape;
  bool scratch = false;
  if (si == kNone || !(slot.key == key)) {
    const auto it = shape_index_.find(key);
    if (it != shape_index_.end()) {
      si = it->second;
    } else {
      BuildShape(obj, start, size);
      si = static_cast<uint32_t>(shapes_.size() - 1);
      if (shape_index_.size() < kMaxShapes) {
        shape_index_.emplace(key, si);
      } else {
        scratch = true;
      }
    }
    if (!scratch) {
      slot = ShapeSlot{key, si};
    }
  }
  const Shape s = shapes_[si];  // a copy: the loops below must not re-read it through aliases
  if (s.n_fields == 0) {
    ++os.unattributed;
  }
  uint64_t* const bytes = (w ? byte_writes_ : byte_reads_)[obj].data();
  for (uint64_t b = s.byte_begin, e = s.byte_end; b < e; ++b) {
    ++bytes[b];
  }
  const uint32_t col = bins_.ColumnFor(t);
  if (col == TimeBins::kLate) {
    ++late_events_;
  }
  std::vector<ThreadField>& tfields = thread_fields_[th];
  const uint32_t wi = w ? 1 : 0;
  for (uint32_t i = 0; i < s.n_fields; ++i) {
    const FieldHit h = field_hits_[s.field_begin + i];
    field_counts_[h.field].Add(w);
    const uint64_t key = ThreadFieldKey(th, h.field);
    PairSlot& pair = pair_cache_[PairSlotFor(key)];
    if (pair.key != key) {
      const auto [pos, first] =
          thread_field_index_.try_emplace(key, static_cast<uint32_t>(tfields.size()));
      if (first) {
        tfields.push_back(ThreadField{h.field, kNone, {}});
        ++field_threads_[h.field];
      }
      pair = PairSlot{key, pos->second};
    }
    ThreadField& tf = tfields[pair.pos];
    tf.counts.Add(w);
    field_sites_[h.field].Add(ev.ip, w);
    if (col != TimeBins::kLate) {
      if constexpr (kCollect) {
        touched->push_back(h.field);
      }
      bins_.Increment(2 * h.field + wi, col);
      if (tf.row == kNone) {  // sparse: most threads touch a field in a few columns
        tf.row = bins_.AddSparseRow();
        bins_.AddSparseRow();
      }
      bins_.Increment(tf.row + wi, col);
    }
    if (h.value_bits != 0 && ev.value.has_value()) {
      const bool has_old = ev.old_value.has_value();
      values_[h.field].Push(t, ev.tid, ev.ip, ev.kind, ev.value_exact,
                            LowBits(*ev.value >> h.value_shift, h.value_bits), has_old,
                            has_old ? LowBits(*ev.old_value >> h.value_shift, h.value_bits) : 0);
    }
  }
  if (w) {
    for (uint32_t i = 0; i < s.n_lines; ++i) {
      const LineHit& lh = line_hits_[s.line_begin + i];
      RecordLineWrite(lines_[lh.line], th, lh.mask, line_pos_.data() + lh.pos_begin, lh.n_pos,
                      ev.ip, t, opts_.false_sharing_window_ns, opts_.max_sites_per_line_thread);
    }
  }
  if (scratch) {  // drop this event's uncached shape (capacity stays: no allocation next time)
    field_hits_.resize(s.field_begin);
    line_pos_.resize(s.n_lines > 0 ? line_hits_[s.line_begin].pos_begin : line_pos_.size());
    line_hits_.resize(s.line_begin);
    shapes_.pop_back();
  }
}

template void StorageProfile::AddImpl<false>(const core::AccessEvent&, std::vector<uint32_t>*);
template void StorageProfile::AddImpl<true>(const core::AccessEvent&, std::vector<uint32_t>*);

const RwCounts& StorageProfile::ThreadFieldCounts(uint32_t thread, uint32_t field) const {
  const auto it = thread_field_index_.find(ThreadFieldKey(thread, field));
  return it == thread_field_index_.end() ? kNoCounts : thread_fields_[thread][it->second].counts;
}

std::vector<std::pair<uint32_t, RwCounts>> StorageProfile::ThreadFields(uint32_t thread) const {
  std::vector<std::pair<uint32_t, RwCounts>> out;
  out.reserve(thread_fields_[thread].size());
  for (const ThreadField& tf : thread_fields_[thread]) {
    out.emplace_back(tf.field, tf.counts);
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return out;
}

std::vector<uint64_t> StorageProfile::ThreadFieldBins(uint32_t thread, uint32_t field,
                                                      bool writes) const {
  const auto it = thread_field_index_.find(ThreadFieldKey(thread, field));
  const uint32_t row =
      it == thread_field_index_.end() ? kNone : thread_fields_[thread][it->second].row;
  if (row == kNone) {
    std::vector<uint64_t> zeros(bins_.columns(), 0);
    return zeros;
  }
  return bins_.RowCopy(row + (writes ? 1 : 0));
}

uint32_t StorageProfile::ThreadIndex(pid_t tid) const {
  const auto it = thread_index_.find(tid);
  return it == thread_index_.end() ? kNone : it->second;
}

std::vector<FalseSharingFinding> StorageProfile::FalseSharing(size_t top_sites) const {
  std::vector<FalseSharingFinding> out =
      FindFalseSharing(lines_, opts_.false_sharing_min_transfers, top_sites);
  for (FalseSharingFinding& f : out) {
    for (auto& tw : f.threads) {
      tw.tid = threads_[tw.thread].tid;
    }
  }
  return out;
}

}  // namespace kwatch::watch::profile
