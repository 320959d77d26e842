#pragma once

// What `kwatch probe` shows: a line per hit on stdout (text columns, or JSON lines), notes on
// stderr, and the summary at the end. One interface, ProbePrinter (a HitSink with a summary), and
// two printers, text and JSON; the command picks one when the session starts. Counting and
// recording are not theirs: the tally and the recorder (watch/probe/) take the same hits
// through a fan-out, and the summary reads the tally.

#include <sys/types.h>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/base/remote_addr.h"
#include "core/base/target_files.h"
#include "watch/probe/aggregation.h"
#include "watch/probe/hit_filter.h"
#include "watch/probe/hit_sink.h"
#include "watch/probe/hit_tally.h"
#include "watch/probe/probe_note.h"
#include "watch/probe/probe_session.h"
#include "watch/probe/probe_set.h"

namespace kwatch::cli {

using watch::probe::ProbeDef;
using watch::probe::ProbeEndStats;
using watch::probe::ProbeHit;
using watch::probe::ProbeRunInfo;
using watch::probe::ProbeSet;

struct PrinterOptions {
  bool quiet = false;     // no hit lines (no column header either); notes and the summary come
  uint64_t start_ns = 0;  // CLOCK_MONOTONIC origin of the times printed
  // The target's pid: text lines of other processes (children followed with -f) show PID/TID
  // in the TID column. 0: never.
  pid_t main_pid = 0;
  // Names a return address ("run+0x2a"); null: printed as hex (text) or left out (JSON).
  std::function<std::string(core::RemoteAddr)> caller;
  // Where a code address is, for --stack frames; null: frames print as hex.
  std::function<core::symbols::CodeLocation(core::RemoteAddr)> locate;
  bool show_stack = false;  // --stack: each hit's frames follow it
};

// What a summary shows: the probes, what the tally counted and how the session ended.
struct ProbeSummary {
  const std::vector<ProbeDef>& probes;
  const watch::probe::HitTally& tally;
  const watch::probe::ProbeSessionEnd& end;
  const watch::probe::HitFilter* filter = nullptr;  // conditions, --skip, -c EVENT:N
};

// Prints a probe session. Takes every hit (the hit limit is the tally's). Not thread-safe.
//
// Lines go to `out_fd` in batches, each write(2) at most PIPE_BUF bytes and ending at a line
// end: a launched target sharing the pipe or terminal cannot split one of kwatch's lines, nor
// kwatch one of its lines (written once). Batches go out every Flush() and when 64 KiB are
// pending. Notes go to stderr as "kwatch: <sentence>" (cli/probe_notes.h), in both forms.
class ProbePrinter : public watch::probe::HitSink {
 public:
  ProbePrinter(int out_fd, PrinterOptions opts) : out_fd_(out_fd), opts_(std::move(opts)) {}

  // The column header, if the form has one (unless quiet).
  void OnStart() override;
  bool Add(const ProbeHit& hit) override;
  // Writes the pending lines.
  void Flush() override;
  // "output closed" once the output failed (a pipe whose reader went away): lines are dropped
  // since.
  absl::Status status() const override;
  void OnNote(const watch::probe::ProbeNote& note) override;

  // The summary, on `out`.
  virtual void PrintSummary(FILE* out, const ProbeSummary& summary) const = 0;

 protected:
  // The column header line ("" for none) and the line of one hit, '\n' included.
  virtual std::string Header() const = 0;
  virtual std::string Line(const ProbeHit& hit) const = 0;

  const PrinterOptions& opts() const { return opts_; }
  // Seconds from the session's start to `time_ns`.
  double Seconds(uint64_t time_ns) const;

  // JSON's `,"ns_pid":N` for `pid` ("" when it is in kwatch's pid namespace), learnt from each
  // note's pid while the process is there.
  const std::string& NsPidOf(pid_t pid) const { return ns_pid_.Of(pid); }

 private:
  void Emit(const std::string& line);
  void WriteLines();

  int out_fd_;
  PrinterOptions opts_;
  std::string pending_;  // whole lines not written yet
  bool output_failed_ = false;
  mutable core::NsPidField ns_pid_;
};

// Text: a column header, "TIME(s) TID EVENT LOCATION ARGS" per hit; the summary is a table of
// the probes with the top values of each argument, the notes and the target's exit.
class ProbeTextPrinter final : public ProbePrinter {
 public:
  using ProbePrinter::ProbePrinter;
  void PrintSummary(FILE* out, const ProbeSummary& summary) const override;

 protected:
  std::string Header() const override;
  std::string Line(const ProbeHit& hit) const override;
};

// JSON lines: one {"type":"hit",...} object per hit, then one {"type":"summary",...} (with each
// probe's debug register under --hw).
class ProbeJsonPrinter final : public ProbePrinter {
 public:
  using ProbePrinter::ProbePrinter;
  void PrintSummary(FILE* out, const ProbeSummary& summary) const override;

 protected:
  std::string Header() const override { return ""; }
  std::string Line(const ProbeHit& hit) const override;
};

// The value of an argument as JSON: a number for decimal integers and finite floats, the
// string itself for quoted strings, the text otherwise ("0x64", "(fault)").
std::string ArgValueJson(const std::string& formatted);

// --agg's results: each table under a title line, keys and values in columns, histograms as
// bpftrace draws them ("[4, 8)   3 |@@@@   |"). `elapsed`: seconds into the session (a title for
// --interval), negative at the end.
void PrintAggregatesText(FILE* out, const watch::probe::Aggregator& agg, double elapsed);
// The same as JSON lines: one {"type":"aggregate"} per key (count, sum, min, max, avg: "value";
// hist and lhist: one per bucket, "low", "high", "count").
void PrintAggregatesJson(FILE* out, const watch::probe::Aggregator& agg, double elapsed);

}  // namespace kwatch::cli
