#include "gui/snapshot.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "core/base/status_macros.h"
#include "core/base/unique_fd.h"
#include "core/store/trace_reader.h"

namespace kwatch::gui {

namespace {

constexpr uint64_t kMaxSourceBytes = 8 << 20;
constexpr size_t kMaxSnippets = 4096;
constexpr uint64_t kMaxSourceTotal = 256 << 20;  // bytes of source files read per load
constexpr size_t kMaxSnippetLine = 1000;         // bytes kept of one source line
constexpr int kSnippetContext = 3;

// Seconds for RecordingSlice such that ProfileFromRecording's truncation to nanoseconds gives
// back exactly `ns` (the half nanosecond absorbs the binary rounding of ns / 1e9).
double SliceSeconds(uint64_t ns) {
  return (static_cast<double>(ns) + 0.5) / 1e9;
}

// Whole lines of a readable source file (cached per file by the caller). The name comes from
// the recording: only a regular file, opened without blocking (not /proc/kmsg waiting for the
// kernel), and never more than kMaxSourceBytes read (a /proc file says size 0 and may be
// endless, like /proc/self/pagemap).
std::optional<std::vector<std::string>> ReadLines(const std::string& file,
                                                  uint64_t* read_bytes = nullptr) {
  if (file.empty()) {
    return std::nullopt;
  }
  const core::UniqueFd fd(::open(file.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY));
  struct stat st {};
  if (!fd.valid() || ::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) ||
      static_cast<uint64_t>(st.st_size) > kMaxSourceBytes) {
    return std::nullopt;
  }
  std::string text;
  std::array<char, 65536> buf{};
  for (;;) {
    const ssize_t n = ::read(fd.get(), buf.data(), buf.size());
    if (n < 0) {
      return std::nullopt;  // EAGAIN included: not a file to read now
    }
    if (n == 0) {
      break;
    }
    text.append(buf.data(), static_cast<size_t>(n));
    if (read_bytes != nullptr) {
      *read_bytes += static_cast<uint64_t>(n);
    }
    if (text.size() > kMaxSourceBytes) {
      return std::nullopt;
    }
  }
  std::vector<std::string> lines = absl::StrSplit(text, '\n');
  if (!lines.empty() && lines.back().empty()) {
    lines.pop_back();  // the newline ending the last line
  }
  return lines;
}

std::optional<SourceSnippet> SnippetFrom(const std::vector<std::string>& lines,
                                         const std::string& file, int line, int context) {
  if (line < 1 || static_cast<size_t>(line) > lines.size()) {
    return std::nullopt;
  }
  SourceSnippet s;
  s.file = file;
  s.line = line;
  s.first_line = std::max(1, line - context);
  const int last = std::min(static_cast<int>(lines.size()), line + context);
  for (int l = s.first_line; l <= last; ++l) {
    const std::string& text = lines[static_cast<size_t>(l - 1)];
    s.lines.push_back(text.size() <= kMaxSnippetLine
                          ? text
                          : absl::StrCat(text.substr(0, kMaxSnippetLine), " [...]"));
  }
  return s;
}

// The smallest of 1, 2 or 5 x 10^k ns that is >= max(ns, 1000).
uint64_t NiceWidth(uint64_t ns) {
  for (uint64_t decade = 1000;; decade *= 10) {
    for (uint64_t m : {1, 2, 5}) {
      if (decade * m >= ns) {
        return decade * m;
      }
    }
  }
}

// Reads the source lines around `sites` (but those `known` has already) into snap.sources: file
// by file, one in memory at a time, at most kMaxSourceTotal bytes read in all (the recording
// names the files and how many), at most kMaxSnippets kept.
void ReadSources(const std::vector<core::store::SiteRecord>& sites, const Snapshot* known,
                 Snapshot& snap) {
  std::vector<size_t> order;
  for (size_t i = 0; i < sites.size(); ++i) {
    if (!sites[i].file.empty() && sites[i].line > 0 &&
        (known == nullptr || !known->sites.contains(sites[i].ip.value))) {
      order.push_back(i);
    }
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return sites[a].file < sites[b].file; });
  uint64_t read_bytes = 0;
  for (size_t g = 0; g < order.size() && read_bytes < kMaxSourceTotal;) {
    const std::string& file = sites[order[g]].file;
    size_t end = g;
    while (end < order.size() && sites[order[end]].file == file) {
      ++end;
    }
    const std::optional<std::vector<std::string>> lines = ReadLines(file, &read_bytes);
    for (; g < end; ++g) {
      const core::store::SiteRecord& s = sites[order[g]];
      std::optional<SourceSnippet> snippet =
          lines.has_value() ? SnippetFrom(*lines, s.file, s.line, kSnippetContext) : std::nullopt;
      if (snippet.has_value()) {
        snap.sources.emplace(s.ip.value, std::move(*snippet));
      }
    }
  }
  if (snap.sources.size() > kMaxSnippets) {  // keep the first ones by address
    std::vector<uint64_t> ips;
    ips.reserve(snap.sources.size());
    for (const auto& [ip, snippet] : snap.sources) {
      ips.push_back(ip);
    }
    std::nth_element(ips.begin(), ips.begin() + kMaxSnippets, ips.end());
    const uint64_t cut = ips[kMaxSnippets];
    absl::erase_if(snap.sources, [cut](const auto& kv) { return kv.first >= cut; });
  }
}

// Follow mode: whether `req.base` can be extended with the events committed since (the same
// file, still being written then and now, the whole recording at the same resolution).
bool CanExtend(const LoadRequest& req, const Snapshot& now) {
  const Snapshot* base = req.base.get();
  return base != nullptr && base->profile.has_value() && !base->unchanged &&
         base->request.path == req.path && !base->complete && !now.complete &&
         !req.from_ns.has_value() && !req.to_ns.has_value() && !req.tid.has_value() &&
         !base->request.from_ns.has_value() && !base->request.to_ns.has_value() &&
         !base->request.tid.has_value() && base->request.columns == req.columns &&
         now.recorded_events >= base->recorded_events &&
         base->session.start_mono_ns == now.session.start_mono_ns;
}

}  // namespace

uint64_t Snapshot::SpanNs() const {
  if (end.has_value() && end->end_mono_ns > session.start_mono_ns) {
    return end->end_mono_ns - session.start_mono_ns;
  }
  if (profile.has_value() && profile->last_ns() > session.start_mono_ns) {
    return profile->last_ns() - session.start_mono_ns;
  }
  return 0;
}

std::optional<SourceSnippet> ReadSourceSnippet(const std::string& file, int line, int context) {
  const std::optional<std::vector<std::string>> lines = ReadLines(file);
  if (!lines.has_value()) {
    return std::nullopt;
  }
  return SnippetFrom(*lines, file, line, context);
}

absl::StatusOr<SnapshotPtr> LoadSnapshot(const LoadRequest& req) {
  const auto t0 = std::chrono::steady_clock::now();
  KW_ASSIGN_OR_RETURN(std::unique_ptr<core::store::TraceReader> reader,
                      core::store::TraceReader::Open(req.path));
  auto snap = std::make_shared<Snapshot>();
  snap->request = req;
  snap->session = reader->session();
  snap->complete = reader->complete();
  snap->end = reader->end();
  {
    // The count and, when following, the events after base's as of one moment.
    KW_ASSIGN_OR_RETURN(core::store::TraceReader::ReadSnapshot hold, reader->HoldSnapshot());
    KW_ASSIGN_OR_RETURN(snap->recorded_events, reader->CountEvents());
    if (req.known_events.has_value() && *req.known_events == snap->recorded_events &&
        req.known_complete == snap->complete) {
      snap->unchanged = true;
      return snap;
    }
    if (CanExtend(req, *snap) && reader->watches().size() == req.base->watches.size()) {
      const Snapshot& base = *req.base;
      snap->incremental = true;
      snap->request.base.reset();  // no chain of snapshots kept alive
      snap->watches = base.watches;
      snap->aggregates = reader->aggregates();
      for (const core::store::SiteRecord& s : reader->sites()) {
        snap->sites.emplace(s.ip.value, s);
      }
      snap->profile = *base.profile;
      core::store::EventFilter newer;
      newer.first_index = base.recorded_events + 1;
      newer.last_index = snap->recorded_events;
      KW_RETURN_IF_ERROR(reader->ForEachEvent(newer, [&](const core::AccessEvent& ev) {
        snap->profile->Add(ev);
        ++snap->events_read;
        return true;
      }));
      snap->sources = base.sources;
      if (req.read_sources) {
        ReadSources(reader->sites(), &base, *snap);
      }
      snap->load_seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      return snap;
    }
  }
  snap->request.base.reset();
  snap->watches = reader->watches();
  snap->aggregates = reader->aggregates();
  snap->sites.reserve(reader->sites().size());
  for (const core::store::SiteRecord& s : reader->sites()) {
    snap->sites.emplace(s.ip.value, s);
  }

  watch::RecordingSlice slice;
  if (req.from_ns.has_value()) {
    slice.from_s = SliceSeconds(*req.from_ns);
  }
  if (req.to_ns.has_value()) {
    // The slice's bound is inclusive; ours is exclusive.
    slice.to_s = *req.to_ns == 0 ? -1.0 : SliceSeconds(*req.to_ns - 1);
  }
  slice.tid = req.tid;
  watch::profile::ProfileOptions opts;
  opts.max_buckets = std::max<uint32_t>(req.columns, 2);
  if (snap->end.has_value() && snap->end->end_mono_ns > snap->session.start_mono_ns) {
    // A finished recording: about `columns` columns over its whole length, each a round width
    // (1, 2 or 5 x 10^k ns, at least 1 us).
    const uint64_t span = snap->end->end_mono_ns - snap->session.start_mono_ns;
    opts.initial_bucket_ns = NiceWidth(span / opts.max_buckets + 1);
  }
  if (slice.to_s.has_value() && *slice.to_s < 0) {
    // An empty range [.., 0): no event qualifies; keep the layout.
    std::vector<watch::profile::WatchedObject> objects;
    for (const core::store::WatchRecord& w : snap->watches) {
      objects.push_back(watch::ObjectFromRecord(w));
    }
    opts.start_ns = snap->session.start_mono_ns;
    snap->profile.emplace(std::move(objects), opts);
  } else {
    KW_ASSIGN_OR_RETURN(watch::profile::StorageProfile profile,
                        watch::ProfileFromRecording(*reader, slice, opts));
    snap->profile.emplace(std::move(profile));
  }

  if (req.read_sources) {
    ReadSources(reader->sites(), nullptr, *snap);
  }
  snap->load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return snap;
}

absl::StatusOr<ZoomPtr> LoadZoom(const LoadRequest& req) {
  const auto t0 = std::chrono::steady_clock::now();
  if (!req.from_ns.has_value() || !req.to_ns.has_value()) {
    return absl::InvalidArgumentError("a zoom needs a time window");
  }
  KW_ASSIGN_OR_RETURN(std::unique_ptr<core::store::TraceReader> reader,
                      core::store::TraceReader::Open(req.path));
  auto zoom = std::make_shared<ZoomGrid>();
  zoom->request = req;
  zoom->request.base.reset();
  KW_ASSIGN_OR_RETURN(zoom->recorded_events, reader->CountEvents());
  KW_ASSIGN_OR_RETURN(zoom->heat, watch::HeatInWindow(*reader, *req.from_ns, *req.to_ns,
                                                      std::max<uint32_t>(req.columns, 1), req.tid));
  zoom->load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return zoom;
}

}  // namespace kwatch::gui
