#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/string_view.h"
#include "core/base/target_files.h"
#include "core/event.h"
#include "core/ptrace/process.h"
#include "watch/access_sink.h"
#include "watch/bitfield_value.h"
#include "watch/profile/report_render.h"
#include "watch/profile/storage_profile.h"
#include "watch/session.h"
#include "watch/summary.h"

namespace kwatch::cli {

// JSON string literal for `s` (quotes included).
std::string JsonString(absl::string_view s);

// A watched value as kwatch prints it: the low `len` bytes of `raw`, sign-extended.
int64_t ValueOf(uint64_t raw, uint32_t len);

// An event's value as printed: a decoded bitfield as is, else ValueOf over the raw width.
std::string ValueText(const watch::EventValues& v, uint64_t raw);

// What the session ended with, for the summary.
using watch::RunInfo;

// The live output of a process watch session: events and the summary on stdout (text, or JSON
// lines), notes on stderr in both forms. -q prints no events (and no "following child" notes),
// only the summary. Start once the session is created. Not thread-safe.
class AccessPrinter : public watch::AccessSink {
 public:
  AccessPrinter(FILE* out, bool quiet) : out_(out), quiet_(quiet) {}

  // The session's clock (events' times are printed from it), the target's pid (events of
  // other processes, followed children, show PID/TID in text), then the header unless quiet.
  // The watches it shows are the session's at Start (not those other kwatch commands add by
  // joining it), or those of ShowOnly called before Start.
  void Start(const watch::WatchSession& session, uint64_t start_ns, pid_t main_pid);
  // A joined kwatch's output (cli/join_server.h): only watches `ids` of the session.
  void ShowOnly(std::vector<uint32_t> ids) { shown_ = std::move(ids); }

  void BeforeWait() override { std::fflush(out_); }
  void OnNote(const watch::AccessNote& note) override;

 protected:
  virtual void PrintHeader(const watch::WatchSession& session) = 0;
  // A per-call watch's call ended (AccessNote::kCallEnded): on the event stream.
  virtual void PrintCallEnd(const watch::CallRecord& r, const std::string& expr,
                            const std::string& function) = 0;
  // --follow: a watch moved (in the event stream, unless quiet).
  virtual void PrintMove(const watch::AccessNote& note) = 0;
  // Where both summaries start: the events flushed, the profile's rendering fit to `out_`.
  watch::profile::ReportRenderOptions SummaryStart();
  // Seconds from the session's start to an event's time.
  double Seconds(uint64_t time_ns) const {
    return static_cast<double>(time_ns - std::min(time_ns, start_ns_)) / 1e9;
  }

  bool Shown(uint32_t id) const {
    return std::find(shown_.begin(), shown_.end(), id) != shown_.end();
  }

  FILE* out_;
  bool quiet_;
  std::vector<uint32_t> shown_;  // watch ids
  uint64_t start_ns_ = 0;
  pid_t main_pid_ = 0;
};

// Text: a column header, one line per event (and its backtrace), then the summary's counts
// line, each watch's kind and backend, and the storage profile (the same report `kwatch report`
// prints from a recording: fields, heatmap, sites, threads, false sharing).
class AccessTextPrinter final : public AccessPrinter {
 public:
  using AccessPrinter::AccessPrinter;

  absl::Status OnEvent(watch::WatchSession& session, watch::Summary& summary,
                       const core::AccessEvent& ev, const core::AccessEvent& as_counted) override;
  void OnSummary(const watch::AccessSummary& all) override;

 private:
  void PrintHeader(const watch::WatchSession& session) override;
  void PrintCallEnd(const watch::CallRecord& r, const std::string& expr,
                    const std::string& function) override;
  void PrintMove(const watch::AccessNote& note) override;
};

// JSON lines: one object per watch, one per event, then one summary object (per watch: fields,
// threads, sites) whose "profile" key holds the profile as `kwatch report --format json` gives.
class AccessJsonPrinter final : public AccessPrinter {
 public:
  using AccessPrinter::AccessPrinter;

  absl::Status OnEvent(watch::WatchSession& session, watch::Summary& summary,
                       const core::AccessEvent& ev, const core::AccessEvent& as_counted) override;
  void OnSummary(const watch::AccessSummary& all) override;

 private:
  void PrintHeader(const watch::WatchSession& session) override;
  void PrintCallEnd(const watch::CallRecord& r, const std::string& expr,
                    const std::string& function) override;
  void PrintMove(const watch::AccessNote& note) override;

  core::NsPidField ns_pid_;
};

}  // namespace kwatch::cli
