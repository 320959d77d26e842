#include "cli/watch_recording.h"

#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "watch/recording.h"

#ifndef KWATCH_VERSION
#define KWATCH_VERSION "dev"
#endif

namespace kwatch::cli {

absl::StatusOr<std::unique_ptr<core::TraceWriter>> CreateWatchRecording(
    const WatchOptions& opts, const watch::WatchSession& session, pid_t pid) {
  core::SessionRecord rec = core::SessionRecordForThisHost();
  rec.command_line = opts.command_line;
  rec.pid = pid;
  rec.kwatch_version = KWATCH_VERSION;
  rec.mode = "watch";
  const absl::string_view backend = watch::BackendName(session.backend());
  rec.backend.assign(backend.data(), backend.size());
  auto w = core::TraceWriter::Create(opts.output, rec);
  if (!w.ok()) {
    return w.status();
  }
  for (const watch::Watch& wt : session.watches()) {
    const watch::WatchPlacement placed = session.placement(wt.id);
    core::WatchRecord watch_record = watch::WatchRecordFor(wt, placed.backend);
    if (session.allocator() != nullptr) {
      // drmgr's decision: registers, split, page protection, multiplexed.
      watch_record.coverage = placed.detail;
    }
    if (absl::Status s = (*w)->AddWatch(watch_record); !s.ok()) {
      return s;
    }
  }
  return w;
}

absl::Status AccessRecordingSink::Failed() const {
  return error_.ok()
             ? absl::OkStatus()
             : absl::Status(error_.code(), absl::StrCat("recording failed: ", error_.message()));
}

absl::Status AccessRecordingSink::OnEvent(watch::WatchSession& session, watch::Summary& summary,
                                          const core::AccessEvent& ev,
                                          const core::AccessEvent& as_counted) {
  absl::Status out;
  if (error_.ok()) {
    if (!writer_.HasSite(ev.ip)) {
      error_ = writer_.AddSite(watch::SiteRecordFor(session.symbolizer(), ev.ip));
    }
    if (error_.ok()) {
      error_ = writer_.Append(ev);
    }
    out = Failed();
  }
  (void)next_.OnEvent(session, summary, ev, as_counted);
  return out;
}

absl::Status AccessRecordingSink::OnDrained() {
  if (error_.ok()) {
    error_ = writer_.Flush();
    if (absl::Status s = Failed(); !s.ok()) {
      return s;
    }
  }
  return next_.OnDrained();
}

void AccessRecordingSink::OnSummary(const watch::AccessSummary& summary) {
  const watch::RunInfo& info = summary.info;
  if (error_.ok()) {
    core::SessionEnd end;
    if (info.exit.has_value()) {
      end.exit_status = info.exit->ShellStatus();
    }
    end.exit_reason = info.stop_reason;
    end.lost_count = info.lost;
    if (absl::Status s = writer_.Finish(end); !s.ok()) {
      absl::FPrintF(stderr, "kwatch: error: %s\n", s.message());
      failed_ = true;
    } else {
      if (!writer_.finish_warning().empty()) {
        std::fprintf(stderr, "kwatch: warning: %s\n", writer_.finish_warning().c_str());
      }
      std::fprintf(stderr, "kwatch: recorded %llu events to %s (kwatch report %s)\n",
                   static_cast<unsigned long long>(writer_.events_committed()),
                   writer_.path().c_str(), writer_.path().c_str());
    }
  } else {
    failed_ = true;
    absl::FPrintF(stderr, "kwatch: error: %s\n", error_.message());
    if (!writer_.location_lost()) {  // never claim a file that no longer exists
      const std::string& where = writer_.moved_to().empty() ? writer_.path() : writer_.moved_to();
      std::fprintf(stderr,
                   "kwatch: the recording %s holds the events committed before the failure; "
                   "`kwatch report %s` reads it\n",
                   where.c_str(), where.c_str());
    }
  }
  next_.OnSummary(summary);
}

}  // namespace kwatch::cli
