#include "watch/profile/profile_codec.h"

#include <algorithm>
#include <bit>
#include <tuple>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/store/varint.h"

namespace kwatch::watch::profile {
namespace {

constexpr uint64_t kMagic = 0x3150574b;  // "KWP1"
constexpr uint64_t kVersion = 1;

class Out {
 public:
  void U(uint64_t v) { core::store::PutVarint(s_, v); }
  void I(int64_t v) { core::store::PutZigzag(s_, v); }
  void Rw(const RwCounts& c) {
    U(c.reads);
    U(c.writes);
  }
  std::string Take() { return std::move(s_); }

 private:
  std::string s_;
};

}  // namespace

class ProfileCodec::In : public core::store::VarintReader {
 public:
  using VarintReader::VarintReader;
  bool I(int64_t* v) { return Zigzag(v); }
  // A count of items each taking at least `min_bytes`: refused when the rest cannot hold them.
  bool N(uint64_t* n, size_t min_bytes = 1) {
    return U(n) && *n <= remaining() / std::max<size_t>(min_bytes, 1);
  }
  bool U32(uint32_t* v) {
    uint64_t u = 0;
    if (!U(&u) || u > UINT32_MAX) {
      return false;
    }
    *v = static_cast<uint32_t>(u);
    return true;
  }
  bool Rw(RwCounts* c) { return U(&c->reads) && U(&c->writes); }
};

namespace {

absl::Status Bad(absl::string_view what) {
  return absl::DataLossError(absl::StrCat("the profile snapshot is damaged: ", what));
}

// Returns DataLoss naming `what` unless `ok`.
#define KW_CODEC_READ(ok, what) \
  do {                          \
    if (!(ok)) {                \
      return Bad(what);         \
    }                           \
  } while (false)

}  // namespace

namespace {

void EncodeSites(Out& o, const SiteTable& t);
void EncodeValues(Out& o, const ValueRing& r);

}  // namespace

std::string ProfileCodec::Encode(const StorageProfile& p) {
  Out o;
  o.U(kMagic);
  o.U(kVersion);
  const ProfileOptions& op = p.opts_;
  for (uint64_t v :
       {op.start_ns, op.false_sharing_window_ns, op.false_sharing_min_transfers,
        static_cast<uint64_t>(op.value_history), uint64_t{op.max_sites_per_field},
        uint64_t{op.max_sites_per_object}, uint64_t{op.max_sites_per_line_thread},
        op.max_tracked_bytes, op.max_tracked_total, static_cast<uint64_t>(op.max_line_members)}) {
    o.U(v);
  }
  o.U(p.objects_.size());
  o.U(p.fields_.size());
  o.U(p.lines_.size());
  o.U(p.events_);
  o.U(p.ignored_);
  o.U(p.first_ns_);
  o.U(p.last_ns_);
  o.U(p.late_events_);
  for (size_t i = 0; i < p.objects_.size(); ++i) {
    const ObjectStats& st = p.object_stats_[i];
    o.Rw(st.total);
    o.U(st.execs);
    o.U(st.unattributed);
    EncodeSites(o, p.object_sites_[i]);
    o.U(p.byte_reads_[i].size());
    for (size_t b = 0; b < p.byte_reads_[i].size(); ++b) {
      o.U(p.byte_reads_[i][b]);
      o.U(p.byte_writes_[i][b]);
    }
  }
  for (size_t f = 0; f < p.fields_.size(); ++f) {
    o.Rw(p.field_counts_[f]);
    EncodeSites(o, p.field_sites_[f]);
    EncodeValues(o, p.values_[f]);
  }
  o.U(p.threads_.size());
  for (size_t t = 0; t < p.threads_.size(); ++t) {
    const ThreadInfo& ti = p.threads_[t];
    o.I(ti.tid);
    o.I(ti.pid);
    o.U(ti.first_ns);
    o.U(ti.last_ns);
    o.Rw(ti.total);
    o.U(ti.execs);
    o.U(p.thread_fields_[t].size());
    for (const StorageProfile::ThreadField& tf : p.thread_fields_[t]) {
      o.U(tf.field);
      o.U(tf.row == StorageProfile::kNone ? 0 : uint64_t{tf.row} + 1);
      o.Rw(tf.counts);
    }
  }
  for (const CacheLine& l : p.lines_) {
    o.U(l.writes);
    o.U(l.false_transfers);
    o.U(l.true_transfers);
    o.U(l.first_false_ns);
    o.U(l.last_false_ns);
    o.U(l.last_thread == CacheLine::kNoThread ? 0 : uint64_t{l.last_thread} + 1);
    o.U(l.last_mask);
    o.U(l.last_ns);
    o.U(l.writers.size());
    for (const LineWriter& w : l.writers) {
      o.U(w.thread);
      o.U(w.writes);
      o.U(w.mask);
      o.U(w.field_writes.size());
      for (const auto& [pos, n] : w.field_writes) {
        o.U(pos);
        o.U(n);
      }
      EncodeSites(o, w.sites);
    }
  }
  return o.Take();
}

namespace {

void EncodeSites(Out& o, const SiteTable& t) {
  o.U(t.capacity());
  o.Rw(t.other());
  const std::vector<SiteCount> sites = t.Ranked();
  o.U(sites.size());
  for (const SiteCount& s : sites) {
    o.U(s.ip.value);
    o.Rw(s.counts);
  }
}

}  // namespace

namespace {

void EncodeValues(Out& o, const ValueRing& r) {
  const std::vector<ValueSample> samples = r.Samples();
  o.U(r.pushed());
  o.U(samples.size());
  for (const ValueSample& s : samples) {
    o.U(s.time_ns);
    o.I(s.tid);
    o.U(s.ip.value);
    o.U(static_cast<uint64_t>(s.kind));
    o.U((s.exact ? 1U : 0U) | (s.old_value.has_value() ? 2U : 0U));
    o.U(s.value);
    o.U(s.old_value.value_or(0));
  }
}

}  // namespace

uint32_t ProfileCodec::ThreadFieldRow(const StorageProfile& p, uint32_t thread, uint32_t field) {
  const auto it = p.thread_field_index_.find(StorageProfile::ThreadFieldKey(thread, field));
  return it == p.thread_field_index_.end() ? StorageProfile::kNone
                                           : p.thread_fields_[thread][it->second].row;
}

absl::StatusOr<StorageProfile> ProfileCodec::Decode(std::vector<WatchedObject> objects,
                                                    const ProfileOptions& opts,
                                                    absl::string_view bytes) {
  StorageProfile p(std::move(objects), opts);
  In in(bytes);
  uint64_t magic = 0;
  uint64_t version = 0;
  KW_CODEC_READ(in.U(&magic) && magic == kMagic, "no magic");
  if (!in.U(&version) || version != kVersion) {
    return absl::FailedPreconditionError(absl::StrCat("the profile snapshot has version ", version,
                                                      "; this kwatch reads ", kVersion));
  }
  const ProfileOptions& op = p.opts_;
  for (uint64_t want :
       {op.start_ns, op.false_sharing_window_ns, op.false_sharing_min_transfers,
        static_cast<uint64_t>(op.value_history), uint64_t{op.max_sites_per_field},
        uint64_t{op.max_sites_per_object}, uint64_t{op.max_sites_per_line_thread},
        op.max_tracked_bytes, op.max_tracked_total, static_cast<uint64_t>(op.max_line_members)}) {
    uint64_t v = 0;
    KW_CODEC_READ(in.U(&v), "truncated options");
    if (v != want) {
      return absl::FailedPreconditionError("the profile snapshot was made with other options");
    }
  }
  uint64_t n_objects = 0;
  uint64_t n_fields = 0;
  uint64_t n_lines = 0;
  KW_CODEC_READ(in.U(&n_objects) && in.U(&n_fields) && in.U(&n_lines), "truncated counts");
  if (n_objects != p.objects_.size() || n_fields != p.fields_.size() ||
      n_lines != p.lines_.size()) {
    return absl::FailedPreconditionError("the profile snapshot is of other watches");
  }
  KW_CODEC_READ(in.U(&p.events_) && in.U(&p.ignored_) && in.U(&p.first_ns_) && in.U(&p.last_ns_) &&
                    in.U(&p.late_events_),
                "truncated totals");
  KW_CODEC_READ(p.ignored_ <= p.events_, "more ignored events than events");
  for (size_t i = 0; i < p.objects_.size(); ++i) {
    ObjectStats& st = p.object_stats_[i];
    KW_CODEC_READ(in.Rw(&st.total) && in.U(&st.execs) && in.U(&st.unattributed),
                  "truncated object");
    KW_CODEC_READ(DecodeSites(in, p.object_sites_[i], op.max_sites_per_object), "object sites");
    uint64_t n = 0;
    KW_CODEC_READ(in.U(&n) && n == p.byte_reads_[i].size(), "byte counts of another size");
    for (size_t b = 0; b < n; ++b) {
      KW_CODEC_READ(in.U(&p.byte_reads_[i][b]) && in.U(&p.byte_writes_[i][b]), "byte counts");
    }
  }
  for (size_t f = 0; f < p.fields_.size(); ++f) {
    KW_CODEC_READ(in.Rw(&p.field_counts_[f]), "field counts");
    KW_CODEC_READ(DecodeSites(in, p.field_sites_[f], op.max_sites_per_field), "field sites");
    ValueRing& ring = p.values_[f];
    uint64_t pushed = 0;
    uint64_t n = 0;
    KW_CODEC_READ(in.U(&pushed) && in.N(&n, 7) && n <= ring.capacity_ && n <= pushed,
                  "field values");
    ring.samples_.clear();
    ring.head_ = 0;
    for (uint64_t k = 0; k < n; ++k) {
      uint64_t t = 0;
      int64_t tid = 0;
      uint64_t ip = 0;
      uint64_t kind = 0;
      uint64_t flags = 0;
      uint64_t value = 0;
      uint64_t old = 0;
      KW_CODEC_READ(in.U(&t) && in.I(&tid) && in.U(&ip) && in.U(&kind) && in.U(&flags) &&
                        in.U(&value) && in.U(&old) && kind <= 2 && flags <= 3 && tid >= INT32_MIN &&
                        tid <= INT32_MAX,
                    "a value sample");
      ring.Push(t, static_cast<pid_t>(tid), core::RemoteAddr{ip},
                static_cast<core::AccessKind>(kind), (flags & 1) != 0, value, (flags & 2) != 0,
                old);
    }
    ring.pushed_ = pushed;
  }
  uint64_t n_threads = 0;
  KW_CODEC_READ(in.N(&n_threads, 8), "thread count");
  // Time rows of (thread, field) pairs, in the order Add created them.
  std::vector<std::tuple<uint32_t, uint32_t, uint32_t>> rows;  // row, thread, position
  for (uint64_t t = 0; t < n_threads; ++t) {
    ThreadInfo ti;
    int64_t tid = 0;
    int64_t pid = 0;
    KW_CODEC_READ(in.I(&tid) && in.I(&pid) && in.U(&ti.first_ns) && in.U(&ti.last_ns) &&
                      in.Rw(&ti.total) && in.U(&ti.execs) && tid >= INT32_MIN && tid <= INT32_MAX &&
                      pid >= INT32_MIN && pid <= INT32_MAX,
                  "a thread");
    ti.tid = static_cast<pid_t>(tid);
    ti.pid = static_cast<pid_t>(pid);
    const auto index = static_cast<uint32_t>(t);
    KW_CODEC_READ(p.thread_index_.emplace(ti.tid, index).second, "a thread twice");
    p.threads_.push_back(ti);
    std::vector<StorageProfile::ThreadField>& tfs = p.thread_fields_.emplace_back();
    uint64_t n = 0;
    KW_CODEC_READ(in.N(&n, 4), "thread field count");
    for (uint64_t k = 0; k < n; ++k) {
      StorageProfile::ThreadField tf;
      uint64_t row = 0;
      KW_CODEC_READ(in.U32(&tf.field) && tf.field < p.fields_.size() && in.U(&row) &&
                        row <= UINT32_MAX && in.Rw(&tf.counts),
                    "a thread's field");
      KW_CODEC_READ(p.thread_field_index_
                        .emplace(StorageProfile::ThreadFieldKey(index, tf.field),
                                 static_cast<uint32_t>(tfs.size()))
                        .second,
                    "a thread's field twice");
      ++p.field_threads_[tf.field];
      if (row != 0) {
        rows.emplace_back(static_cast<uint32_t>(row - 1), index, static_cast<uint32_t>(tfs.size()));
      }
      tfs.push_back(tf);
    }
  }
  std::sort(rows.begin(), rows.end());
  for (const auto& [row, thread, pos] : rows) {
    KW_CODEC_READ(row == p.bins_.rows(), "time rows out of order");
    p.bins_.AddSparseRow();
    p.bins_.AddSparseRow();
    p.thread_fields_[thread][pos].row = row;
  }
  for (CacheLine& l : p.lines_) {
    uint64_t last_thread = 0;
    uint64_t n = 0;
    KW_CODEC_READ(in.U(&l.writes) && in.U(&l.false_transfers) && in.U(&l.true_transfers) &&
                      in.U(&l.first_false_ns) && in.U(&l.last_false_ns) && in.U(&last_thread) &&
                      last_thread <= n_threads && in.U(&l.last_mask) && in.U(&l.last_ns) &&
                      in.N(&n, 5) && n <= n_threads,
                  "a cache line");
    l.last_thread =
        last_thread == 0 ? CacheLine::kNoThread : static_cast<uint32_t>(last_thread - 1);
    for (uint64_t k = 0; k < n; ++k) {
      LineWriter w;
      uint64_t nf = 0;
      KW_CODEC_READ(in.U32(&w.thread) && w.thread < n_threads && in.U(&w.writes) && in.U(&w.mask) &&
                        in.N(&nf, 2) && nf <= l.fields.size(),
                    "a line's writer");
      KW_CODEC_READ(
          l.writer_index.emplace(w.thread, static_cast<uint32_t>(l.writers.size())).second,
          "a line's writer twice");
      for (uint64_t j = 0; j < nf; ++j) {
        uint32_t pos = 0;
        uint64_t count = 0;
        KW_CODEC_READ(in.U32(&pos) && pos < l.fields.size() && in.U(&count) &&
                          (w.field_writes.empty() || w.field_writes.back().first < pos),
                      "a line writer's fields");
        w.field_writes.emplace_back(pos, count);
      }
      w.sites = SiteTable(op.max_sites_per_line_thread);
      KW_CODEC_READ(DecodeSites(in, w.sites, op.max_sites_per_line_thread), "a writer's sites");
      l.writers.push_back(std::move(w));
    }
  }
  KW_CODEC_READ(in.done(), "bytes after the end");
  return p;
}

bool ProfileCodec::DecodeSites(In& in, SiteTable& t, uint32_t capacity) {
  uint64_t cap = 0;
  uint64_t n = 0;
  RwCounts other;
  if (!in.U(&cap) || cap != capacity || !in.Rw(&other) || !in.N(&n, 3) || n > capacity) {
    return false;
  }
  t = SiteTable(capacity);
  for (uint64_t k = 0; k < n; ++k) {
    uint64_t ip = 0;
    RwCounts c;
    if (!in.U(&ip) || !in.Rw(&c) || ip == ~uint64_t{0}) {
      return false;
    }
    // Insert, then set the counts (Add counts one).
    const uint32_t before = t.size();
    t.Add(core::RemoteAddr{ip}, false);
    if (t.size() != before + 1) {
      return false;  // the same site twice
    }
    for (SiteTable::Slot& s : t.slots_) {
      if (s.ip == ip) {
        s.counts = c;
        break;
      }
    }
  }
  t.other_ = other;
  return true;
}

}  // namespace kwatch::watch::profile
