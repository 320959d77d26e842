#pragma once

// What a probe session tells its user besides hits, as data: a kind and the facts it needs. The
// printers word it (the CLI: one sentence on stderr while the session runs, "note: ..." lines in
// the summary); a GUI or a daemon acts on the kind. Notes come to HitSink::OnNote while the
// session runs, and in ProbeRunInfo::notes for the summary.

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "core/ptrace/process.h"

namespace kwatch::watch::probe {

struct ProbeDef;

// The value of an argument whose memory was not in the uprobe backend's sample.
inline constexpr absl::string_view kNotSampled = "(not sampled)";

struct ProbeNote {
  enum class Kind : uint8_t {
    // While the session runs.
    kArmed,              // `count` probes of `path` are live on `pid` (0: every process running
                         // the file) with the `backend` backend; hw: armed in `ms`
    kHwPlacement,        // hw: `probe` is in debug register `reg`, an execute breakpoint at
                         // `address`, sharing it with the probes `shared_with` (same address);
                         // also in the summary
    kExternalRegisters,  // hw: `count` debug registers of `pid` are held outside kwatch; also in
                         // the summary
    kNotPublished,       // hw: `kwatch slots` will not see the session (`why`)
    kExec,               // `pid` (a followed child when `child`) called exec: the probes of the
                         // old image ended there; `rearm` says what came after; also in the
                         // summary
    kGroupStop,          // `pid` (a followed child when `child`) was stopped by `signal` (job
                         // control); probing goes on
    kChildFollowed,      // -f: child `pid` of `parent` is probed, its probes adopted in `us`
                         // (`guardian_us` of it starting its guardian); `backend` "agent":
                         // the agent in the child kept them
    kChildExited,        // -f: followed child `pid` ended (`exit`; none when its parent reaped
                         // it before kwatch could read it: agent)
    kStopping,           // ptrace: the session stops (`why`) while the target hits probes back to
                         // back: they are disabled, and come out when it pauses between hits
    kChildrenReleased,   // at the end: the probes are out of `count` followed children, let go
                         // and still running
    kReleased,           // at the end: the probes are out of the target `pid` (the `backend`
                         // says how), which keeps running
    kParked,             // --stop-on: target `pid` is left stopped (SIGSTOP) with its code
                         // restored, thread `count` at `why` (where the hit stopped it); also
                         // in the summary
    // In the summary only.
    kChildUnguarded,    // -f: child `pid` is not guarded: its guardian did not start (`why`)
    kForksNotFollowed,  // the target forked `count` children, not followed: they run the
                        // original code (`backend` says how it was given back)
    kChildrenFollowed,  // -f: the children `pids` were followed; their hits are in the counts
    kSpuriousTraps,     // `count` SIGTRAPs nothing explains were absorbed
    kStrayTraps,        // hw: `count` debug traps named no probe's register (dropped)
    kUprobeSampling,    // uprobe: arguments come from the registers and `count` bytes of stack
    kNotSampled,        // uprobe: `count` argument values showed kNotSampled
    kOtherProcesses,    // uprobe: `count` hits of other processes running `path` were left out
    kSamplesDropped,    // uprobe: the kernel dropped `count` samples of `probe` (ring full)
    kAgentDropped,      // agent: `count` hits were dropped (`why`)
    kAggregateShort,    // agent: the aggregation `path` ("EVENT: AGG") was made by kwatch from
                        // the hits it received (the target could not: `why`), and `count`
                        // records of its probe were lost in full rings
  };
  // kExec: what became of the probes in the new image.
  enum class Rearm : uint8_t {
    kNone,       // nothing was tried (no -f, or the session was stopping)
    kDone,       // -f: `count` probes re-armed in the new image (`at_entry`: at its entry point)
    kNotMapped,  // -f: not re-armed: `path` is not mapped in the new image (`why`)
    kFailed,     // -f: not re-armed (`why`)
  };

  Kind kind = Kind::kArmed;
  std::string backend;  // "ptrace", "uprobe", "hw": kArmed, kReleased, kForksNotFollowed
  pid_t pid = 0;
  pid_t parent = 0;
  bool child = false;
  int signal = 0;
  std::optional<core::ptrace::ExitInfo> exit;
  uint64_t count = 0;
  std::string path;
  std::string why;
  const ProbeDef* probe = nullptr;  // the session's probe set outlives its notes
  int reg = -1;
  uint64_t address = 0;
  std::vector<uint32_t> shared_with;  // probe ids
  std::vector<pid_t> pids;
  std::optional<double> ms;
  double us = 0;
  double guardian_us = 0;
  Rearm rearm = Rearm::kNone;
  bool at_entry = false;
};

}  // namespace kwatch::watch::probe
