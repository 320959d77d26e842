#include "watch/recording.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace kwatch::watch {

namespace {

std::string KindLetters(const WatchRequest& r) {
  if (r.reads_only) {
    return "r";
  }
  switch (r.kind) {
    case drmgr::DrKind::kExec:
      return "x";
    case drmgr::DrKind::kWrite:
      return "w";
    case drmgr::DrKind::kReadWrite:
      return "rw";
  }
  return "?";
}

uint64_t SecondsToNs(double s) {
  return s <= 0 ? 0 : static_cast<uint64_t>(s * 1e9);
}

}  // namespace

core::WatchRecord WatchRecordFor(const Watch& w, BackendKind backend) {
  core::WatchRecord r;
  r.id = w.id;
  r.expr = w.target.display;
  r.address = w.target.addr;
  r.length = w.target.length;
  r.kind = KindLetters(w.request);
  r.backend = std::string(BackendName(backend));
  r.coverage = backend == BackendKind::kPage
                   ? absl::StrCat(w.target.length, " bytes, exact (page protection)")
                   : absl::StrCat(w.target.length, " bytes (hardware breakpoint)");
  r.type_name = w.target.type_name;
  if (w.target.layout.has_value()) {
    r.fields = w.target.layout->fields;
  }
  return r;
}

WatchedObject ObjectFromRecord(const core::WatchRecord& w) {
  WatchedObject o;
  o.id = w.id;
  o.expr = w.expr;
  o.addr = w.address;
  o.length = w.length;
  o.type_name = w.type_name;
  o.fields = w.fields;
  return o;
}

core::SiteRecord SiteRecordFor(core::Symbolizer& symbolizer, core::RemoteAddr ip) {
  const core::CodeLocation& loc = symbolizer.Locate(ip);
  core::SiteRecord s;
  s.ip = ip;
  s.function = loc.function;
  s.offset = loc.offset;
  s.file = loc.file;
  s.line = loc.line;
  return s;
}

absl::StatusOr<StorageProfile> ProfileFromRecording(const core::TraceReader& reader,
                                                    const RecordingSlice& slice,
                                                    ProfileOptions opts) {
  std::vector<WatchedObject> objects;
  objects.reserve(reader.watches().size());
  for (const core::WatchRecord& w : reader.watches()) {
    objects.push_back(ObjectFromRecord(w));
  }
  const uint64_t start = reader.session().start_mono_ns;
  opts.start_ns = start;
  core::EventFilter filter;
  if (slice.from_s.has_value()) {
    filter.from_ns = start + SecondsToNs(*slice.from_s);
  }
  if (slice.to_s.has_value()) {
    filter.to_ns = start + SecondsToNs(*slice.to_s);
  }
  filter.tid = slice.tid;
  StorageProfile profile(std::move(objects), opts);
  absl::Status s = reader.ForEachEvent(filter, [&](const core::AccessEvent& ev) {
    profile.Add(ev);
    return true;
  });
  if (!s.ok()) {
    return s;
  }
  return profile;
}

}  // namespace kwatch::watch
