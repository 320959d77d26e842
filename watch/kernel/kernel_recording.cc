#include "watch/kernel/kernel_recording.h"

#include <string>
#include <utility>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/base/status_macros.h"
#include "watch/recording_sink.h"
#include "watch/recording_summary.h"

namespace kwatch::watch::kernel {

absl::StatusOr<std::unique_ptr<core::store::TraceWriter>> CreateKernelRecording(
    const RecordingSpec& spec, pid_t pid, std::span<const KernelWatch> watches) {
  core::store::SessionRecord rec = core::store::SessionRecordForThisHost();
  rec.command_line = spec.command_line;
  rec.pid = pid;
  rec.kwatch_version = spec.kwatch_version;
  rec.mode = pid == 0 ? "kernel" : "kernel-accesses";
  rec.backend = "perf";
  KW_ASSIGN_OR_RETURN(auto writer, core::store::TraceWriter::Create(spec.path, rec));
  writer->SetSummarySource(MakeProfileSummarySource(rec.start_mono_ns));
  for (size_t i = 0; i < watches.size(); ++i) {
    const KernelWatch& w = watches[i];
    core::store::WatchRecord wr;
    wr.id = static_cast<uint32_t>(i);
    wr.expr = w.display;
    wr.address = core::RemoteAddr{w.addr};
    wr.length = w.len;
    wr.kind = "w";
    wr.backend = "perf";
    wr.coverage =
        pid == 0 ? absl::StrFormat("%d bytes (hardware breakpoint on CPUs %s)", w.len,
                                   absl::StrJoin(w.cpus, ","))
                 : absl::StrFormat("%d bytes (hardware breakpoint, kernel accesses only)", w.len);
    wr.type_name = w.type_name;
    KW_RETURN_IF_ERROR(writer->AddWatch(wr));
  }
  return writer;
}

absl::StatusOr<core::AccessEvent> KernelEventForRecording(
    core::store::TraceWriter& writer, core::kernel::KernelSymbolResolver& symbols, TaskNames& names,
    const KernelWatch& w, const KernelEvent& ev) {
  const core::RemoteAddr ip{ev.s.ip};
  if (!writer.HasSite(ip)) {
    core::kernel::KernelSymbolResolver::CodeSite site = symbols.Locate(ev.s.ip);
    core::store::SiteRecord rec;
    rec.ip = ip;
    rec.function = std::move(site.function);
    rec.offset = site.offset;
    rec.file = std::move(site.file);
    rec.line = site.line;
    KW_RETURN_IF_ERROR(writer.AddSite(rec));
  }
  KW_RETURN_IF_ERROR(writer.AddTask(
      core::store::TaskRecord{static_cast<pid_t>(ev.s.pid), static_cast<pid_t>(ev.s.tid),
                              names.Get(static_cast<pid_t>(ev.s.tid), ev.s.cpu)}));
  core::AccessEvent e;
  e.time_ns = ev.s.time;
  e.pid = static_cast<pid_t>(ev.s.pid);
  e.tid = static_cast<pid_t>(ev.s.tid);
  e.cpu = ev.s.cpu;
  e.watch_id = static_cast<uint32_t>(ev.watch);
  e.trap_ip = ip;
  e.ip = ip;
  e.addr = core::RemoteAddr{w.addr};
  e.len = w.len;
  e.access_addr = core::RemoteAddr{w.addr};
  e.access_size = 0;                  // the watched range is all a breakpoint tells
  e.kind = core::AccessKind::kWrite;  // -o takes --write kernel watches only
  e.value = ev.value;                 // at the access (BPF), at drain time (DrainValues), or none
  e.value_exact = ev.value_at_access;
  return e;
}

absl::Status KernelRecordingSink::OnEvent(const KernelEvent& ev, const KernelWatch& w) {
  absl::Status out;
  if (error_.ok()) {
    absl::StatusOr<core::AccessEvent> e = KernelEventForRecording(writer_, symbols_, names_, w, ev);
    if (e.ok()) {
      order_.Add(*e);
    } else {
      error_ = e.status();
    }
    out = RecordingFailed(error_);
  }
  (void)next_.OnEvent(ev, w);
  return out;
}

absl::Status KernelRecordingSink::OnStepEnd() {
  if (error_.ok()) {
    error_ = order_.EndRound([&](const core::AccessEvent& e) { return writer_.Append(e); });
  }
  if (error_.ok()) {
    error_ = writer_.Flush();
    KW_RETURN_IF_ERROR(RecordingFailed(error_));
  }
  return next_.OnStepEnd();
}

RecordingOutcome KernelRecordingSink::Finish(const KernelSessionEnd& end) {
  core::store::SessionEnd record;
  record.exit_status = end.exit_status;
  record.exit_reason = end.stop_reason;
  record.lost_count = end.lost;
  if (error_.ok()) {
    error_ = order_.TakeAll([&](const core::AccessEvent& e) { return writer_.Append(e); });
  }
  return FinishRecording(writer_, error_, record);
}

}  // namespace kwatch::watch::kernel
