#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

#include "absl/strings/string_view.h"
#include "core/event.h"
#include "core/ptrace/process.h"
#include "watch/profile/storage_profile.h"
#include "watch/session.h"
#include "watch/summary.h"

namespace kwatch::cli {

// JSON string literal for `s` (quotes included).
std::string JsonString(absl::string_view s);

// A watched value as kwatch prints it: the low `len` bytes of `raw`, sign-extended.
int64_t ValueOf(uint64_t raw, uint32_t len);

// What the session ended with, for the summary.
struct RunInfo {
  std::string stop_reason;  // "target exited", "count reached", "interrupted", ...
  uint64_t lost = 0;
  uint64_t filtered = 0;             // writes dropped by --read
  uint64_t unrelated = 0;            // page mode: faults that touched no watched byte
  uint64_t spurious_traps = 0;       // SIGTRAPs nothing explains, absorbed (core/trap_origin.h)
  std::string condition;             // --if, "" when none
  uint64_t condition_evaluated = 0;  // events tested
  uint64_t condition_matched = 0;    // ... reported
  uint64_t condition_undefined = 0;  // ... false for want of a value (or a division by 0)
  double seconds = 0;
  std::optional<core::ExitInfo> exit;
  pid_t pid = 0;
  // -f/--follow-forks: every process watched, the target first, with its own counts.
  struct Process {
    pid_t pid = 0;
    pid_t parent = 0;                 // 0 for the target
    uint64_t events = 0;              // events delivered from this process
    std::vector<uint64_t> per_watch;  // ... by watch id
    std::optional<core::ExitInfo> exit;
  };
  std::vector<Process> processes;  // empty without -f
  std::vector<std::string> notes;  // forks, execs and re-arms, for people
};

// Prints live events, one line each (text or JSON lines). Not thread-safe.
class EventPrinter {
 public:
  EventPrinter(FILE* out, bool json, uint64_t start_ns)
      : out_(out), json_(json), start_ns_(start_ns) {}

  void PrintHeader(const watch::WatchSession& session);
  // `session` is the one of the process that made the access; `as_counted` is the event as
  // `summary` counts it (its addresses rebased to the first image's after an exec re-arm),
  // for the field name; nullptr: `ev` itself.
  void Print(watch::WatchSession& session, watch::Summary& summary, const core::AccessEvent& ev,
             const core::AccessEvent* as_counted = nullptr);
  // Events of other processes (followed children) show PID/TID in text.
  void set_main_pid(pid_t pid) { main_pid_ = pid; }

 private:
  FILE* out_;
  bool json_;
  uint64_t start_ns_;
  pid_t main_pid_ = 0;
};

// The end-of-session summary. Text: the counts line, each watch's kind and backend, then the
// storage profile (the same report `kwatch report` prints from a recording: fields, heatmap,
// sites, threads, false sharing). JSON: one summary object (per watch: fields, threads, sites)
// whose "profile" key holds the profile as `kwatch report --format json` gives it.
void PrintSummary(FILE* out, bool json, watch::WatchSession& session, const watch::Summary& summary,
                  const watch::StorageProfile& profile, const RunInfo& info);

}  // namespace kwatch::cli
