#include "watch/recording_summary.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"
#include "core/store/recording_limits.h"
#include "watch/profile/profile_codec.h"
#include "watch/recording.h"

namespace kwatch::watch {
namespace {

using core::store::kProfileBinLevels;
using core::store::ProfileBinCell;
using core::store::ProfileBinShift;
using profile::RwCounts;
using profile::StorageProfile;

constexpr uint64_t kMinEventsPerUpdate = uint64_t{1} << 17;

// The snapshot's bytes: the binned-time range (8-byte little-endian flag, first, last), then the
// profile (ProfileCodec).
constexpr size_t kHeaderBytes = 24;

void PutU64(std::string& s, uint64_t v) {
  for (int i = 0; i < 8; ++i) {
    s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
}
uint64_t GetU64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) {
    v = (v << 8) | static_cast<uint8_t>(p[i]);
  }
  return v;
}

struct CellKey {
  int64_t bin;
  pid_t tid;
  uint32_t field;
  bool operator==(const CellKey&) const = default;
  template <typename H>
  friend H AbslHashValue(H h, const CellKey& k) {
    return H::combine(std::move(h), k.bin, k.tid, k.field);
  }
};

class ProfileSummarySource final : public core::store::SummarySource {
 public:
  explicit ProfileSummarySource(uint64_t start) : start_(start) {}

  void OnWatch(const core::store::WatchRecord& w) override {
    if (profile_.has_value() || !ids_.insert(w.id).second) {
      broken_ = true;  // a watch after the first event (or twice): no profile
      return;
    }
    objects_.push_back(ObjectFromRecord(w));
  }

  void OnEvents(absl::Span<const core::AccessEvent> batch) override {
    Profile();
    for (const core::AccessEvent& ev : batch) {
      touched_.clear();
      profile_->AddCollect(ev, &touched_);
      if (ev.kind == core::AccessKind::kExec || !ids_.contains(ev.watch_id)) {
        continue;  // not binned
      }
      if (!binned_) {
        binned_ = true;
        first_binned_ = last_binned_ = ev.time_ns;
      } else {
        first_binned_ = std::min(first_binned_, ev.time_ns);
        last_binned_ = std::max(last_binned_, ev.time_ns);
      }
      const int64_t bin = ev.time_ns < start_
                              ? -1
                              : static_cast<int64_t>((ev.time_ns - start_) >> ProfileBinShift(0));
      const bool write = ev.kind == core::AccessKind::kWrite;
      for (const uint32_t f : touched_) {
        dirty_[CellKey{bin, ev.tid, f}].Add(write);
      }
    }
    pending_ += batch.size();
  }

  bool WantsUpdate() const override {
    // At least 2^17 events, and at most 4 bytes of snapshot per event written since the last
    // (a snapshot is rewritten whole; the CPU to encode it). Frequent updates keep each one's
    // commit, and so the WAL (rewritten in place in the page cache), small: what reaches the
    // disk per writeback is about the WAL's length plus the snapshot (issue 27, item 3).
    return pending_ >= std::max<uint64_t>(kMinEventsPerUpdate, last_bytes_ / 4);
  }

  core::store::ProfileSummaryUpdate TakeUpdate() override {
    core::store::ProfileSummaryUpdate u;
    pending_ = 0;
    if (!broken_) {
      Profile();
      PutU64(u.snapshot, binned_ ? 1 : 0);
      PutU64(u.snapshot, first_binned_);
      PutU64(u.snapshot, last_binned_);
      u.snapshot += profile::ProfileCodec::Encode(*profile_);
      if (u.snapshot.size() > core::store::kMaxRecordedSnapshot) {
        u.snapshot.clear();  // too large to keep: reports replay
      }
      last_bytes_ = u.snapshot.size();
    }
    for (uint32_t level = 0; level < kProfileBinLevels; ++level) {
      const uint32_t shift = ProfileBinShift(level) - ProfileBinShift(0);
      absl::flat_hash_map<CellKey, RwCounts> at_level;
      for (const auto& [k, c] : dirty_) {
        at_level[CellKey{k.bin >> shift, k.tid, k.field}] += c;  // -1 stays -1
      }
      for (const auto& [k, c] : at_level) {
        u.cells.push_back(ProfileBinCell{level, k.bin, k.tid, k.field, c.reads, c.writes});
      }
    }
    dirty_.clear();
    return u;
  }

 private:
  void Profile() {
    if (!profile_.has_value()) {
      profile::ProfileOptions opts;
      opts.start_ns = start_;
      profile_.emplace(objects_, opts);
    }
  }

  uint64_t start_;
  std::vector<profile::WatchedObject> objects_;
  absl::flat_hash_set<uint32_t> ids_;
  std::optional<StorageProfile> profile_;
  bool broken_ = false;
  std::vector<uint32_t> touched_;
  absl::flat_hash_map<CellKey, RwCounts> dirty_;
  bool binned_ = false;
  uint64_t first_binned_ = 0;
  uint64_t last_binned_ = 0;
  uint64_t pending_ = 0;
  size_t last_bytes_ = 0;
};

absl::Status Damaged(const core::store::TraceReader& reader, absl::string_view what) {
  return absl::DataLossError(
      absl::StrCat("not a kwatch recording or corrupted: ", reader.path(), ": ", what));
}

uint64_t PairKey(uint32_t thread, uint32_t field) {
  return (uint64_t{thread} << 32) | field;
}

using Counts = absl::flat_hash_map<uint64_t, RwCounts>;  // PairKey -> counts

// The (thread, field) counts of the events before `b` ns after the start (and of those before
// the start), the first `covered` events only: the bins of each level that lie wholly before
// b, then the events of the level-0 bin b cuts. `top` holds the top level's sum up to b's
// top-level bin (the caller advances it).
absl::Status CountsBefore(const core::store::TraceReader& reader, const StorageProfile& p,
                          uint64_t covered, uint64_t b, Counts& out) {
  auto add_cell = [&](const ProfileBinCell& c) -> bool {
    const uint32_t th = p.ThreadIndex(c.tid);
    if (th == StorageProfile::kNone || c.field >= p.fields().size()) {
      return false;
    }
    out[PairKey(th, c.field)] += RwCounts{c.reads, c.writes};
    return true;
  };
  bool bad = false;
  for (uint32_t level = kProfileBinLevels - 1; level-- > 0;) {
    const uint32_t up = ProfileBinShift(level + 1) - ProfileBinShift(level);
    const auto hi = static_cast<int64_t>(b >> ProfileBinShift(level));
    const int64_t lo = (hi >> up) << up;
    if (lo < hi) {
      KW_RETURN_IF_ERROR(reader.ForEachProfileBin(
          level, lo, hi, [&](const ProfileBinCell& c) { bad = bad || !add_cell(c); }));
    }
  }
  if (bad) {
    return Damaged(reader, "profile_bins names a thread or field the profile has not");
  }
  const uint64_t lo_ns = (b >> ProfileBinShift(0)) << ProfileBinShift(0);
  if (lo_ns < b) {
    std::vector<profile::WatchedObject> objects = p.objects();
    StorageProfile scratch(std::move(objects), p.options());
    core::store::EventFilter f;
    const uint64_t start = p.options().start_ns;
    f.from_ns = start + lo_ns;
    f.to_ns = start + b - 1;
    f.last_index = covered;
    KW_RETURN_IF_ERROR(reader.ForEachEvent(f, [&](const core::AccessEvent& ev) {
      scratch.Add(ev);
      return true;
    }));
    for (uint32_t t = 0; t < scratch.threads().size(); ++t) {
      const uint32_t th = p.ThreadIndex(scratch.threads()[t].tid);
      if (th == StorageProfile::kNone) {
        return Damaged(reader, "an event of a thread the profile has not");
      }
      for (const auto& [field, c] : scratch.ThreadFields(t)) {
        out[PairKey(th, field)] += c;
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::unique_ptr<core::store::SummarySource> MakeProfileSummarySource(uint64_t start_mono_ns) {
  return std::make_unique<ProfileSummarySource>(start_mono_ns);
}

absl::StatusOr<std::optional<StorageProfile>> ProfileFromSummary(
    const core::store::TraceReader& reader, profile::ProfileOptions opts) {
  // The snapshot, its bins and the events after it as of one moment (a live writer commits on).
  KW_ASSIGN_OR_RETURN(core::store::TraceReader::ReadSnapshot hold, reader.HoldSnapshot());
  KW_ASSIGN_OR_RETURN(std::optional<core::store::StoredProfileSummary> summary,
                      reader.ProfileSummary());
  if (!summary.has_value()) {
    return std::nullopt;
  }
  if (summary->snapshot.size() < kHeaderBytes) {
    return Damaged(reader, "the profile snapshot is damaged: too short");
  }
  const char* head = summary->snapshot.data();
  const bool binned = GetU64(head) != 0;
  const uint64_t first_binned = GetU64(head + 8);
  const uint64_t last_binned = GetU64(head + 16);
  std::vector<profile::WatchedObject> objects;
  objects.reserve(reader.watches().size());
  for (const core::store::WatchRecord& w : reader.watches()) {
    objects.push_back(ObjectFromRecord(w));
  }
  const uint64_t start = reader.session().start_mono_ns;
  opts.start_ns = start;
  absl::StatusOr<StorageProfile> decoded = profile::ProfileCodec::Decode(
      std::move(objects), opts, absl::string_view(summary->snapshot).substr(kHeaderBytes));
  if (!decoded.ok()) {
    if (decoded.status().code() == absl::StatusCode::kFailedPrecondition) {
      return std::nullopt;  // made otherwise: replay
    }
    return Damaged(reader, decoded.status().message());
  }
  StorageProfile& p = *decoded;
  profile::TimeBins& bins = profile::ProfileCodec::Bins(p);
  if (binned) {
    if (first_binned > last_binned) {
      return Damaged(reader, "the profile snapshot is damaged: times out of order");
    }
    bins.ColumnFor(first_binned);
    bins.ColumnFor(last_binned);
    if (bins.first_bucket() != 0) {
      return std::nullopt;  // a fixed-width window that slid: replay
    }
    // The totals per (thread, field): what the last column ends with.
    Counts total;
    for (uint32_t t = 0; t < p.threads().size(); ++t) {
      for (const auto& [field, c] : p.ThreadFields(t)) {
        total[PairKey(t, field)] = c;
      }
    }
    // The top level's bins, in order, summed as the boundaries advance.
    std::vector<ProfileBinCell> top;
    constexpr uint32_t kTop = kProfileBinLevels - 1;
    KW_RETURN_IF_ERROR(reader.ForEachProfileBin(
        kTop, -1, INT64_MAX, [&](const ProfileBinCell& c) { top.push_back(c); }));
    std::sort(top.begin(), top.end(),
              [](const ProfileBinCell& a, const ProfileBinCell& b) { return a.bin < b.bin; });
    size_t top_next = 0;
    Counts top_sum;
    const uint64_t last_rel = last_binned < start ? 0 : last_binned - start;
    const uint32_t columns = bins.columns();
    const uint64_t width = bins.width_ns();
    Counts prev;
    for (uint32_t c = 0; c < columns; ++c) {
      Counts cur;
      const uint64_t b = (uint64_t{c} + 1) * width;  // this column's end, from the start
      if (c + 1 == columns || b > last_rel) {
        cur = total;
      } else {
        const auto top_bin = static_cast<int64_t>(b >> ProfileBinShift(kTop));
        for (; top_next < top.size() && top[top_next].bin < top_bin; ++top_next) {
          const ProfileBinCell& cell = top[top_next];
          const uint32_t th = p.ThreadIndex(cell.tid);
          if (th == StorageProfile::kNone || cell.field >= p.fields().size()) {
            return Damaged(reader, "profile_bins names a thread or field the profile has not");
          }
          top_sum[PairKey(th, cell.field)] += RwCounts{cell.reads, cell.writes};
        }
        cur = top_sum;
        KW_RETURN_IF_ERROR(CountsBefore(reader, p, summary->events, b, cur));
      }
      for (const auto& [key, n] : cur) {
        RwCounts d = n;
        if (const auto it = prev.find(key); it != prev.end()) {
          if (it->second.reads > n.reads || it->second.writes > n.writes) {
            return Damaged(reader, "profile_bins disagrees with the profile");
          }
          d.reads -= it->second.reads;
          d.writes -= it->second.writes;
        }
        if (d.reads == 0 && d.writes == 0) {
          continue;
        }
        const auto thread = static_cast<uint32_t>(key >> 32);
        const auto field = static_cast<uint32_t>(key & 0xffffffffU);
        const uint32_t row = profile::ProfileCodec::ThreadFieldRow(p, thread, field);
        if (row == StorageProfile::kNone) {
          return Damaged(reader, "profile_bins counts a pair the profile has not");
        }
        bins.Add(2 * field, c, d.reads);
        bins.Add(2 * field + 1, c, d.writes);
        bins.Add(row, c, d.reads);
        bins.Add(row + 1, c, d.writes);
      }
      prev = std::move(cur);
    }
  }
  // The events committed after the snapshot.
  core::store::EventFilter tail;
  tail.first_index = summary->events + 1;
  KW_RETURN_IF_ERROR(reader.ForEachEvent(tail, [&](const core::AccessEvent& ev) {
    p.Add(ev);
    return true;
  }));
  return std::optional<StorageProfile>(std::move(p));
}

}  // namespace kwatch::watch
