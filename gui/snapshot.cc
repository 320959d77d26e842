#include "gui/snapshot.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <utility>

#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"
#include "core/store/trace_reader.h"

namespace kwatch::gui {

namespace {

constexpr uint64_t kMaxSourceBytes = 8 << 20;
constexpr size_t kMaxSnippets = 4096;
constexpr int kSnippetContext = 3;

// Seconds for RecordingSlice such that ProfileFromRecording's truncation to nanoseconds gives
// back exactly `ns` (the half nanosecond absorbs the binary rounding of ns / 1e9).
double SliceSeconds(uint64_t ns) {
  return (static_cast<double>(ns) + 0.5) / 1e9;
}

// Whole lines of a readable source file (cached per file by the caller).
std::optional<std::vector<std::string>> ReadLines(const std::string& file) {
  struct stat st {};
  if (file.empty() || stat(file.c_str(), &st) != 0 || !S_ISREG(st.st_mode) ||
      static_cast<uint64_t>(st.st_size) > kMaxSourceBytes) {
    return std::nullopt;
  }
  std::ifstream in(file);
  if (!in) {
    return std::nullopt;
  }
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(in, line)) {
    lines.push_back(std::move(line));
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
    s.lines.push_back(lines[static_cast<size_t>(l - 1)]);
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
  KW_ASSIGN_OR_RETURN(snap->recorded_events, reader->CountEvents());
  if (req.known_events.has_value() && *req.known_events == snap->recorded_events &&
      req.known_complete == snap->complete) {
    snap->unchanged = true;
    return snap;
  }
  snap->watches = reader->watches();
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
    absl::flat_hash_map<std::string, std::optional<std::vector<std::string>>> files;
    for (const core::store::SiteRecord& s : reader->sites()) {
      if (snap->sources.size() >= kMaxSnippets) {
        break;
      }
      if (s.file.empty() || s.line <= 0) {
        continue;
      }
      auto it = files.find(s.file);
      if (it == files.end()) {
        it = files.emplace(s.file, ReadLines(s.file)).first;
      }
      if (!it->second.has_value()) {
        continue;
      }
      std::optional<SourceSnippet> snippet =
          SnippetFrom(*it->second, s.file, s.line, kSnippetContext);
      if (snippet.has_value()) {
        snap->sources.emplace(s.ip.value, std::move(*snippet));
      }
    }
  }
  snap->load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return snap;
}

}  // namespace kwatch::gui
