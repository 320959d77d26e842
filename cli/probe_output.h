#pragma once

// What `kwatch probe` shows and records: live hit lines (text or JSON lines), per-probe
// tallies, the recording (-o), and the end-of-session summary. Backend-independent.

#include <sys/types.h>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/base/remote_addr.h"
#include "core/event.h"
#include "core/ptrace/process.h"
#include "core/store/args_json.h"
#include "core/store/trace_writer.h"
#include "watch/probe/hit_sink.h"
#include "watch/probe/probe_set.h"

namespace kwatch::cli {

using watch::probe::ProbeDef;
using watch::probe::ProbeEndStats;
using watch::probe::ProbeHit;
using watch::probe::ProbeRunInfo;
using watch::probe::ProbeSet;

struct SinkOptions {
  bool json = false;
  bool quiet = false;
  uint64_t count = 0;     // > 0: take this many hits, ignore the rest
  uint64_t start_ns = 0;  // CLOCK_MONOTONIC origin of the TIME column
  std::string backend;    // "ptrace", "uprobe"
  // The target's pid: text lines of other processes (children followed with -f) show
  // PID/TID in the TID column. 0: never.
  pid_t main_pid = 0;
};

// Takes hits from a session: prints, tallies, records. Not thread-safe.
//
// Lines go to `out_fd` in batches, each write(2) at most PIPE_BUF bytes and ending at a line
// end: a launched target sharing the pipe or terminal cannot split one of kwatch's lines,
// nor kwatch one of its lines (written once). Batches go out every Flush() and when 64 KiB
// are pending.
class HitPrinter : public watch::probe::HitSink {
 public:
  // `writer` (may be null) must already hold the probes (AddProbes). `caller` names a return
  // address ("run+0x2a"), or is null.
  HitPrinter(int out_fd, SinkOptions opts, const std::vector<ProbeDef>& probes,
             core::TraceWriter* writer, std::function<std::string(core::RemoteAddr)> caller);

  // Prints the column header (text mode, unless quiet).
  void PrintHeader();
  void OnStart() override { PrintHeader(); }
  // Takes a hit unless --count is reached. Returns whether it was taken.
  bool Add(const ProbeHit& hit) override;
  // --count reached: later hits are ignored.
  bool done() const override { return opts_.count > 0 && taken_ >= opts_.count; }
  uint64_t taken() const { return taken_; }
  uint64_t hits(uint32_t probe_id) const;
  // Writes pending lines and commits pending recorded hits (call about every 100 ms); a
  // recording failure is sticky.
  void Flush() override;
  // The recording failure, else the closed output, as the session's stop reason.
  absl::Status status() const override;
  // Writes "kwatch: <sentence>" to stderr (cli/probe_notes.h).
  void OnNote(const watch::probe::ProbeNote& note) override;
  // The first recording failure (the session should stop), OK otherwise.
  const absl::Status& record_error() const { return record_error_; }
  // The output was closed (a pipe whose reader went away): lines are dropped since.
  bool output_failed() const { return output_failed_; }

  struct ArgTally {
    std::string name;
    std::map<std::string, uint64_t> values;  // at most kMaxValues distinct
    uint64_t other = 0;                      // hits whose value was beyond kMaxValues
  };
  static constexpr size_t kMaxValues = 1024;
  const std::vector<ArgTally>& tallies(uint32_t probe_id) const;

 private:
  struct PerProbe {
    uint64_t hits = 0;
    std::vector<ArgTally> args;
  };
  void PrintText(const ProbeHit& hit);
  void PrintJson(const ProbeHit& hit);
  void Record(const ProbeHit& hit);
  void WriteLines();

  int out_fd_;
  std::string pending_;  // whole lines not written yet
  bool output_failed_ = false;
  SinkOptions opts_;
  const std::vector<ProbeDef>& probes_;
  core::TraceWriter* writer_;
  std::function<std::string(core::RemoteAddr)> caller_;
  std::map<uint32_t, PerProbe> per_probe_;
  uint64_t taken_ = 0;
  absl::Status record_error_;
};

// Stores the probes in a recording (ProbeRecord per ProbeDef; addresses absolute when
// `load_bias` is known, link-time otherwise).
absl::Status AddProbes(core::TraceWriter& writer, const std::vector<ProbeDef>& probes,
                       uint64_t load_bias);

// The summary: text (a table of probes, the top values of each argument, the exit) or one
// JSON object {"type":"summary",...}.
void PrintProbeSummary(FILE* out, bool json, const std::vector<ProbeDef>& probes,
                       const HitPrinter& sink, const std::map<uint32_t, ProbeEndStats>& stats,
                       const ProbeRunInfo& info);

// The value of an argument as JSON: a number for decimal integers and finite floats, the
// string itself for quoted strings, the text otherwise ("0x64", "(fault)").
std::string ArgValueJson(const std::string& formatted);

}  // namespace kwatch::cli
