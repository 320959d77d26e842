#include "watch/folded_stacks.h"

#include <map>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"

namespace kwatch::watch {

namespace {

// A frame as folded lines name it: its function ("0x..." without one); ';' and blanks, which
// the format uses as separators, become '_'.
std::string FrameName(const core::store::StackFrameRecord& f) {
  std::string name = f.function.empty() ? absl::StrCat("0x", absl::Hex(f.ip.value)) : f.function;
  for (char& c : name) {
    if (c == ';' || c == ' ' || c == '\n' || c == '\t' || static_cast<unsigned char>(c) < 0x20) {
      c = '_';
    }
  }
  return name;
}

}  // namespace

absl::StatusOr<FoldedStacks> FoldStacks(const core::store::TraceReader& reader,
                                        const RecordingSlice& slice) {
  KW_ASSIGN_OR_RETURN(const std::vector<core::store::StackRecord> stacks, reader.Stacks());
  if (stacks.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(reader.path(),
                     " holds no stacks: record them with `kwatch probe --stack -o FILE ...` (or "
                     "--agg 'count() by ustack')"));
  }
  // Each stack's frames, outermost first, joined once.
  absl::flat_hash_map<uint32_t, std::string> folded;
  for (const core::store::StackRecord& s : stacks) {
    std::string line;
    for (size_t i = s.frames.size(); i-- > 0;) {
      absl::StrAppend(&line, line.empty() ? "" : ";", FrameName(s.frames[i]));
    }
    folded[s.id] = std::move(line);
  }
  std::map<uint32_t, std::string> events;
  for (const core::store::ProbeRecord& p : reader.probes()) {
    std::string e = p.event;
    for (char& c : e) {
      if (c == ';' || c == ' ') {
        c = '_';
      }
    }
    events[p.id] = std::move(e);
  }
  FoldedStacks out;
  std::map<std::pair<uint32_t, uint32_t>, uint64_t> counts;  // (probe, stack) -> hits
  KW_RETURN_IF_ERROR(reader.ForEachHit(HitFilterOf(reader, slice), [&](const auto& h) {
    if (h.stack_id == 0 || !folded.contains(h.stack_id)) {
      ++out.without;
    } else {
      ++counts[{h.probe_id, h.stack_id}];
      ++out.hits;
    }
    return true;
  }));
  std::map<std::string, uint64_t> lines;
  for (const auto& [key, n] : counts) {
    const auto e = events.find(key.first);
    const std::string root = e != events.end() ? e->second : absl::StrCat("probe", key.first);
    lines[absl::StrCat(root, ";", folded[key.second])] += n;
  }
  for (const auto& [line, n] : lines) {
    absl::StrAppend(&out.text, line, " ", n, "\n");
  }
  out.stacks = lines.size();
  return out;
}

}  // namespace kwatch::watch
