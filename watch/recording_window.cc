#include "watch/recording_window.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"
#include "core/store/trace_summary.h"
#include "watch/recording.h"

namespace kwatch::watch {
namespace {

using core::store::kProfileBinLevels;
using core::store::ProfileBinShift;

uint64_t BinWidth(uint32_t level) {
  return uint64_t{1} << ProfileBinShift(level);
}

// A time range [lo, hi) (ns after the start) of column `column` read from the events.
struct EventSpan {
  uint64_t lo = 0;
  uint64_t hi = 0;
};

// A run of profile_bins of one level, [lo_bin, hi_bin), inside column `column`.
struct BinRun {
  uint32_t level = 0;
  int64_t lo_bin = 0;
  int64_t hi_bin = 0;
  uint32_t column = 0;
};

// Splits [a, b) into runs of whole bins, the largest that fit at each step (at most two runs
// per level), and the parts of 16.8 ms bins at its ends (events).
void Decompose(uint64_t a, uint64_t b, uint32_t column, std::vector<BinRun>& runs,
               std::vector<EventSpan>& spans) {
  const uint64_t w0 = BinWidth(0);
  uint64_t lo = a;
  if (const uint64_t up = (lo + w0 - 1) / w0 * w0; up != lo) {
    if (up >= b) {
      spans.push_back({a, b});
      return;
    }
    spans.push_back({lo, up});
    lo = up;
  }
  while (lo + w0 <= b) {
    uint32_t level = 0;
    while (level + 1 < kProfileBinLevels && lo % BinWidth(level + 1) == 0 &&
           lo + BinWidth(level + 1) <= b) {
      ++level;
    }
    const uint64_t w = BinWidth(level);
    uint64_t n = (b - lo) / w;
    if (level + 1 < kProfileBinLevels) {
      const uint64_t wn = BinWidth(level + 1);
      const uint64_t next = (lo / wn + 1) * wn;  // the next boundary of the level above
      n = std::min(n, (next - lo) / w);
    }
    runs.push_back({level, static_cast<int64_t>(lo / w), static_cast<int64_t>(lo / w + n), column});
    lo += n * w;
  }
  if (lo < b) {
    spans.push_back({lo, b});
  }
}

}  // namespace

absl::StatusOr<WindowHeat> HeatInWindow(const core::store::TraceReader& reader, uint64_t from_ns,
                                        uint64_t to_ns, uint32_t columns,
                                        std::optional<pid_t> tid) {
  if (columns == 0 || from_ns >= to_ns) {
    return absl::InvalidArgumentError(
        absl::StrCat("an empty window: [", from_ns, ", ", to_ns, ") ns in ", columns, " columns"));
  }
  WindowHeat out;
  out.from_ns = from_ns;
  out.to_ns = to_ns;
  out.column_ns = (to_ns - from_ns + columns - 1) / columns;
  out.columns = static_cast<uint32_t>((to_ns - from_ns + out.column_ns - 1) / out.column_ns);

  // The bins and the events after them as of one moment (a live writer commits on).
  KW_ASSIGN_OR_RETURN(core::store::TraceReader::ReadSnapshot hold, reader.HoldSnapshot());
  // Counts do not depend on the order the events were committed in: the bins serve recordings
  // whose batches overlap in time too (their snapshot does not).
  KW_ASSIGN_OR_RETURN(const uint64_t covered, reader.BinnedEvents());
  const uint64_t start = reader.session().start_mono_ns;

  // The fields an event touches, as the profile written while recording counts them.
  std::vector<profile::WatchedObject> objects;
  objects.reserve(reader.watches().size());
  for (const core::store::WatchRecord& w : reader.watches()) {
    objects.push_back(ObjectFromRecord(w));
  }
  profile::ProfileOptions opts;
  opts.start_ns = start;
  profile::StorageProfile scratch(std::move(objects), opts);
  const auto field_count = static_cast<uint32_t>(scratch.fields().size());

  auto add = [&out](uint32_t field, uint32_t column, profile::RwCounts c) {
    std::vector<profile::RwCounts>& v = out.fields[field];
    if (v.empty()) {
      v.resize(out.columns);
    }
    v[column] += c;
  };
  std::vector<uint32_t> touched;
  auto add_event = [&](const core::AccessEvent& ev) {
    ++out.events_read;
    if (ev.kind == core::AccessKind::kExec || ev.time_ns < start + from_ns ||
        ev.time_ns >= start + to_ns) {
      return true;
    }
    touched.clear();
    scratch.AddCollect(ev, &touched);
    const auto column = static_cast<uint32_t>((ev.time_ns - start - from_ns) / out.column_ns);
    const bool write = ev.kind == core::AccessKind::kWrite;
    for (const uint32_t f : touched) {
      add(f, column, write ? profile::RwCounts{0, 1} : profile::RwCounts{1, 0});
    }
    return true;
  };

  std::vector<BinRun> runs;
  std::vector<EventSpan> spans;
  for (uint32_t c = 0; c < out.columns; ++c) {
    const uint64_t a = out.ColumnStartNs(c);
    const uint64_t b = std::min(to_ns, a + out.column_ns);
    if (covered == 0) {
      spans.push_back({a, b});
    } else {
      Decompose(a, b, c, runs, spans);
    }
  }
  bool bad = false;
  for (const BinRun& run : runs) {
    ++out.bin_reads;
    out.finest_level = out.finest_level < 0
                           ? static_cast<int>(run.level)
                           : std::min(out.finest_level, static_cast<int>(run.level));
    KW_RETURN_IF_ERROR(reader.ForEachProfileBin(
        run.level, run.lo_bin, run.hi_bin, [&](const core::store::ProfileBinCell& cell) {
          if (cell.field >= field_count) {
            bad = true;
            return;
          }
          if (!tid.has_value() || cell.tid == *tid) {
            add(cell.field, run.column, profile::RwCounts{cell.reads, cell.writes});
          }
        }));
  }
  if (bad) {
    return absl::DataLossError(absl::StrCat("not a kwatch recording or corrupted: ", reader.path(),
                                            ": profile_bins names a field the watches have not"));
  }
  // Adjacent spans (narrow columns) are read in one pass.
  for (size_t i = 0; i < spans.size();) {
    size_t j = i + 1;
    while (j < spans.size() && spans[j].lo == spans[j - 1].hi) {
      ++j;
    }
    core::store::EventFilter f;
    f.from_ns = start + spans[i].lo;
    f.to_ns = start + spans[j - 1].hi - 1;
    f.tid = tid;
    if (covered > 0) {
      f.last_index = covered;
    }
    KW_RETURN_IF_ERROR(reader.ForEachEvent(f, add_event));
    i = j;
  }
  if (covered > 0) {
    // Committed after the profile was last stored: not in profile_bins yet.
    core::store::EventFilter f;
    f.from_ns = start + from_ns;
    f.to_ns = start + to_ns - 1;
    f.tid = tid;
    f.first_index = covered + 1;
    KW_RETURN_IF_ERROR(reader.ForEachEvent(f, add_event));
  }
  return out;
}

}  // namespace kwatch::watch
