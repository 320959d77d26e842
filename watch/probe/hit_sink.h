#pragma once

// What a probe session gives its user: hits as they come, and at the end the counters of each
// probe and how the session ended. Backend-independent.

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/base/remote_addr.h"
#include "core/event.h"
#include "core/ptrace/process.h"
#include "core/store/args_json.h"
#include "watch/probe/probe_note.h"
#include "watch/probe/probe_set.h"

namespace kwatch::watch::probe {

// One hit as a backend saw it.
struct ProbeHit {
  uint64_t time_ns = 0;  // CLOCK_MONOTONIC
  pid_t pid = 0;
  pid_t tid = 0;
  uint32_t cpu = core::kUnknownCpu;
  const ProbeDef* probe = nullptr;
  core::RemoteAddr ip;              // the probed instruction (absolute)
  core::RemoteAddr return_address;  // return probes: where the function returned to
  core::store::ProbeArgs args;      // name -> value as perf formats it
  // --stack: the user stack, innermost first (frame 0: the probed instruction, or for return
  // probes where the function returned to; the others are return addresses). Empty without.
  std::vector<core::RemoteAddr> stack;
};

// Counters a backend knows about a probe at the end of the session.
struct ProbeEndStats {
  uint64_t misses = 0;     // ptrace: reached while disabled (after --count)
  uint64_t nmissed = 0;    // ptrace return probes: calls not tracked (maxactive)
  uint64_t abandoned = 0;  // ptrace return probes: calls that never returned (longjmp...)
  uint64_t faults = 0;     // ptrace: signals raised by the displaced instruction
  uint64_t lost = 0;       // uprobe: samples the kernel dropped; agent: records (ring full)
  std::optional<uint64_t> kernel_count;  // uprobe: hits the kernel counted
  // agent: the hits the agent itself counted while the session took them (KwProbe::hits),
  // those whose records were lost in a full ring included. When set, the summary's HITS; else
  // HITS is the hits delivered.
  std::optional<uint64_t> counted;
  // agent: the probe's `if COND` ran in the target (watch/probe/agent_filter.h), before the
  // records were written: the hits it rejected there (those it took are `counted`). Nullopt
  // when kwatch evaluated it on the hits it received; then `condition_in_kwatch_why` says why
  // the target could not (agent backend only).
  struct TargetFilter {
    uint64_t rejected = 0;          // the condition was false
    uint64_t no_value = 0;          // a value it reads faulted (not matched)
    uint64_t division_by_zero = 0;  // not matched
  };
  std::optional<TargetFilter> target_filter;
  std::string condition_in_kwatch_why;
};

// How the session ended, for the summary.
struct ProbeRunInfo {
  std::string backend;
  std::string stop_reason;  // "target exited", "--count 10 reached", "interrupted by INT"
  double seconds = 0;
  pid_t pid = 0;  // 0: every process (uprobe, global)
  std::optional<core::ptrace::ExitInfo> exit;
  std::vector<ProbeNote> notes;  // what the user should know (uprobe limits, exec...)
};

// Where a probe session's hits go: a text or JSON printer, the recorder, the tally, or a fan-out
// to several of them (watch/probe/hit_fanout.h). Called on the session's thread only: Add for
// each hit in time order, Flush about every 50 ms, status() after each Flush, OnNote as things
// happen. Implementations need not be thread-safe.
class HitSink {
 public:
  virtual ~HitSink() = default;

  // The probes are live: called once, before the first note (a printer prints its column
  // header). Hits may come earlier, while the probes are being armed.
  virtual void OnStart() {}

  // Takes a hit unless the session's hit limit (--count) is reached. Returns whether it was
  // taken. A sink without a limit takes every hit.
  virtual bool Add(const ProbeHit& hit) = 0;
  // The hit limit is reached: later hits are not taken (the session stops).
  virtual bool done() const { return false; }
  // Why done() ("--stop-on: tick hit by thread 12"); "" for the session's own "--count N
  // reached".
  virtual std::string done_reason() const { return ""; }
  // Writes what is pending (lines, recorded hits).
  virtual void Flush() {}
  // OK while the sink can go on; otherwise the session stops with the error's message as its
  // stop reason ("recording failed: ...", "output closed").
  virtual absl::Status status() const { return absl::OkStatus(); }
  // Something the user should know now (armed, a followed child, the target let go).
  virtual void OnNote(const ProbeNote& /*note*/) {}

 protected:
  // Copied and moved only as part of an implementation (no slicing through the interface).
  HitSink() = default;
  HitSink(const HitSink&) = default;
  HitSink& operator=(const HitSink&) = default;
  HitSink(HitSink&&) = default;
  HitSink& operator=(HitSink&&) = default;
};

}  // namespace kwatch::watch::probe
