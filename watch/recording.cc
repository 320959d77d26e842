#include "watch/recording.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"
#include "core/base/target_files.h"
#include "watch/recording_summary.h"

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

core::store::WatchRecord WatchRecordFor(const Watch& w, BackendKind backend) {
  core::store::WatchRecord r;
  r.id = w.id;
  r.expr = w.target.display;
  r.address = w.target.addr;
  r.length = w.target.length;
  r.kind = KindLetters(w.request);
  r.backend = std::string{BackendName(backend)};
  r.coverage = backend == BackendKind::kPage
                   ? absl::StrCat(w.target.length, " bytes, exact (page protection)")
                   : absl::StrCat(w.target.length, " bytes (hardware breakpoint)");
  r.type_name = w.target.type_name;
  if (w.target.layout.has_value()) {
    r.fields = w.target.layout->fields;
  }
  return r;
}

profile::WatchedObject ObjectFromRecord(const core::store::WatchRecord& w) {
  profile::WatchedObject o;
  o.id = w.id;
  o.expr = w.expr;
  o.addr = w.address;
  o.length = w.length;
  o.type_name = w.type_name;
  o.fields = w.fields;
  return o;
}

core::store::SiteRecord SiteRecordFor(core::symbols::Symbolizer& symbolizer, core::RemoteAddr ip) {
  const core::symbols::CodeLocation& loc = symbolizer.Locate(ip);
  core::store::SiteRecord s;
  s.ip = ip;
  s.function = loc.function;
  s.offset = loc.offset;
  s.file = loc.file;
  s.line = loc.line;
  s.inlined = loc.inlined_function != loc.function ? loc.inlined_function : "";
  return s;
}

absl::StatusOr<std::unique_ptr<core::store::TraceWriter>> CreateWatchRecording(
    const RecordingSpec& spec, const WatchSession& session, pid_t pid,
    std::span<const uint32_t> only) {
  core::store::SessionRecord rec = core::store::SessionRecordForThisHost();
  rec.command_line = spec.command_line;
  rec.pid = pid;
  if (const pid_t own = core::OwnPid(pid); own != pid) {
    rec.ns_pid = own;
  }
  rec.kwatch_version = spec.kwatch_version;
  rec.mode = "watch";
  rec.backend = std::string{BackendName(session.backend())};
  KW_ASSIGN_OR_RETURN(std::unique_ptr<core::store::TraceWriter> writer,
                      core::store::TraceWriter::Create(spec.path, rec));
  writer->SetSummarySource(MakeProfileSummarySource(rec.start_mono_ns));
  for (const Watch& wt : session.watches()) {
    if (!only.empty() && std::find(only.begin(), only.end(), wt.id) == only.end()) {
      continue;
    }
    const WatchPlacement placed = session.placement(wt.id);
    core::store::WatchRecord watch_record = WatchRecordFor(wt, placed.backend);
    if (session.allocator() != nullptr) {
      // drmgr's decision: registers, split, page protection, multiplexed.
      watch_record.coverage = placed.detail;
    }
    KW_RETURN_IF_ERROR(writer->AddWatch(watch_record));
  }
  return writer;
}

RecordingOutcome FinishRecording(core::store::TraceWriter& writer, const absl::Status& record_error,
                                 const core::store::SessionEnd& end) {
  RecordingOutcome out;
  out.previous = writer.replaces();
  if (!record_error.ok()) {
    out.error = record_error;
    if (!writer.location_lost()) {  // never claim a file that no longer exists
      out.kept_at = writer.moved_to().empty() ? writer.path() : writer.moved_to();
    }
    return out;
  }
  out.error = writer.Finish(end);
  if (!out.error.ok()) {
    return out;
  }
  out.complete = true;
  out.previous.clear();
  out.events = writer.events_committed();
  out.hits = writer.hits_committed();
  out.path = writer.path();
  out.warning = writer.finish_warning();
  return out;
}

absl::StatusOr<std::optional<uint64_t>> UpgradeRecording(const std::string& path) {
  KW_ASSIGN_OR_RETURN(std::unique_ptr<core::store::TraceReader> reader,
                      core::store::TraceReader::Open(path));
  const core::store::TraceReader& r = *reader;
  if (!r.complete() || !r.end().has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat(path,
                     ": was cut short; only a finished recording is upgraded (`kwatch export "
                     "--sql OUT ",
                     path, "` copies any)"));
  }
  if (r.schema() == core::store::kTraceSchemaVersion && r.event_blocks()) {
    // Current, unless its batches overlap in time with watches to profile: rewritten in time
    // order, its profile serves the report at once.
    KW_ASSIGN_OR_RETURN(const bool in_order, r.EventsInOrder());
    if (in_order || r.watches().empty()) {
      return std::nullopt;
    }
  }
  KW_ASSIGN_OR_RETURN(std::vector<core::store::StackRecord> stacks, r.Stacks());
  KW_ASSIGN_OR_RETURN(std::unique_ptr<core::store::TraceWriter> w,
                      core::store::TraceWriter::Create(path, r.session()));
  if (!r.watches().empty()) {
    w->SetSummarySource(MakeProfileSummarySource(r.session().start_mono_ns));
  }
  for (const core::store::WatchRecord& watch : r.watches()) {
    KW_RETURN_IF_ERROR(w->AddWatch(watch));
  }
  for (const core::store::ProbeRecord& p : r.probes()) {
    KW_RETURN_IF_ERROR(w->AddProbe(p));
  }
  for (const core::store::SiteRecord& s : r.sites()) {
    KW_RETURN_IF_ERROR(w->AddSite(s));
  }
  for (const core::store::TaskRecord& t : r.tasks()) {
    KW_RETURN_IF_ERROR(w->AddTask(t));
  }
  for (const core::store::StackRecord& s : stacks) {
    KW_RETURN_IF_ERROR(w->AddStack(s));
  }
  absl::Status append;
  uint64_t events = 0;
  KW_RETURN_IF_ERROR(r.ForEachEvent({}, [&](const core::AccessEvent& e) {
    append = w->Append(e);
    ++events;
    return append.ok();
  }));
  KW_RETURN_IF_ERROR(append);
  KW_RETURN_IF_ERROR(r.ForEachHit({}, [&](const core::store::HitRecord& h) {
    append = w->AppendHit(h);
    return append.ok();
  }));
  KW_RETURN_IF_ERROR(append);
  if (!r.aggregates().empty()) {
    KW_RETURN_IF_ERROR(w->AddAggregates(r.aggregates()));
  }
  KW_RETURN_IF_ERROR(w->Finish(*r.end()));
  if (!w->replaces().empty()) {
    return absl::InternalError(absl::StrCat("the upgraded recording is complete in ", w->path(),
                                            " but could not replace ", path, ": ",
                                            w->finish_warning()));
  }
  return std::optional<uint64_t>(events);
}

core::store::HitFilter HitFilterOf(const core::store::TraceReader& reader,
                                   const RecordingSlice& slice) {
  core::store::HitFilter f;
  const uint64_t start = reader.session().start_mono_ns;
  if (slice.from_s) {
    f.from_ns = start + SecondsToNs(*slice.from_s);
  }
  if (slice.to_s) {
    f.to_ns = start + SecondsToNs(*slice.to_s);
  }
  f.tid = slice.tid;
  return f;
}

profile::ProfileOptions ReportProfileOptions(const core::store::TraceReader& reader,
                                             double bucket_ms) {
  profile::ProfileOptions popts;
  if (bucket_ms > 0) {
    popts.bucket_ns = static_cast<uint64_t>(bucket_ms * 1e6);
    // A fixed width keeps the newest columns: make room for the whole session.
    if (reader.end().has_value()) {
      const uint64_t span = reader.end()->end_mono_ns - reader.session().start_mono_ns;
      popts.max_buckets =
          static_cast<uint32_t>(std::clamp<uint64_t>(span / popts.bucket_ns + 1, 2, 4096));
    }
  } else if (reader.end().has_value()) {
    // Choose the width from the session's length: about 120 columns.
    const uint64_t span = reader.end()->end_mono_ns - reader.session().start_mono_ns;
    popts.initial_bucket_ns = std::max<uint64_t>(span / 120, 1000);
  }
  return popts;
}

absl::StatusOr<profile::StorageProfile> ProfileFromRecording(const core::store::TraceReader& reader,
                                                             const RecordingSlice& slice,
                                                             profile::ProfileOptions opts) {
  std::vector<profile::WatchedObject> objects;
  objects.reserve(reader.watches().size());
  for (const core::store::WatchRecord& w : reader.watches()) {
    objects.push_back(ObjectFromRecord(w));
  }
  const uint64_t start = reader.session().start_mono_ns;
  opts.start_ns = start;
  core::store::EventFilter filter;
  if (slice.from_s.has_value()) {
    filter.from_ns = start + SecondsToNs(*slice.from_s);
  }
  if (slice.to_s.has_value()) {
    filter.to_ns = start + SecondsToNs(*slice.to_s);
  }
  filter.tid = slice.tid;
  if (!slice.from_s.has_value() && !slice.to_s.has_value() && !slice.tid.has_value()) {
    // The whole recording: from the profile it keeps, when it keeps one.
    KW_ASSIGN_OR_RETURN(std::optional<profile::StorageProfile> kept,
                        ProfileFromSummary(reader, opts));
    if (kept.has_value()) {
      return *std::move(kept);
    }
  }
  profile::StorageProfile profile(std::move(objects), opts);
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
