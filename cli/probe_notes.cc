#include "cli/probe_notes.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/base/target_files.h"
#include "watch/probe/hw_probes.h"
#include "watch/probe/probe_set.h"

namespace kwatch::cli {

namespace {

using watch::probe::ProbeNote;
using Kind = ProbeNote::Kind;

const char* Plural(uint64_t n, const char* many) {
  return n == 1 ? "" : many;
}

const char* Who(const ProbeNote& n) {
  return n.child ? "followed child" : "target";
}

// "probe #1 tick (tick): debug register DR0, execute breakpoint at 0x401136 in every thread".
std::string Placement(const ProbeNote& n) {
  std::string line = absl::StrFormat(
      "probe %s (%s): debug register DR%d, execute breakpoint at 0x%x in every thread",
      watch::probe::HwProbeName(*n.probe), n.probe->Location(), n.reg, n.address);
  if (!n.shared_with.empty()) {
    absl::StrAppend(&line, " (shared with probe", n.shared_with.size() == 1 ? " " : "s ",
                    watch::probe::HwIdList(n.shared_with), ": same address)");
  }
  return line;
}

std::string Exec(const ProbeNote& n) {
  std::string s =
      absl::StrFormat("%s %d called exec: the probes of the old image ended there", Who(n), n.pid);
  switch (n.rearm) {
    case ProbeNote::Rearm::kNone:
      break;
    case ProbeNote::Rearm::kDone:
      absl::StrAppendFormat(&s, "; %d probe%s re-armed in the new image%s (-f)", n.count,
                            Plural(n.count, "s"), n.at_entry ? " at its entry point" : "");
      break;
    case ProbeNote::Rearm::kNotMapped:
      absl::StrAppendFormat(&s, "; not re-armed: %s is not mapped in the new image (%s)", n.path,
                            n.why);
      break;
    case ProbeNote::Rearm::kFailed:
      absl::StrAppend(&s, "; not re-armed: ", n.why);
      break;
  }
  return s;
}

}  // namespace

std::string ProbeNoteText(const ProbeNote& n) {
  switch (n.kind) {
    case Kind::kArmed: {
      std::string s = absl::StrFormat(
          "armed %d probe%s on %s (%s), %s backend", n.count, Plural(n.count, "s"),
          n.pid > 0 ? core::PidText(n.pid) : "every process running it", n.path, n.backend);
      if (!n.why.empty()) {
        absl::StrAppend(&s, "; ", n.why);
      }
      if (n.backend == "hw") {
        absl::StrAppendFormat(&s,
                              ": execute breakpoints in debug registers through ptrace, the code "
                              "is not modified (%.2f ms)",
                              n.ms.value_or(0));
      }
      return s;
    }
    case Kind::kHwPlacement:
      return absl::StrCat("  ", Placement(n));
    case Kind::kExternalRegisters:
      return absl::StrFormat(
          "%d debug register%s of pid %d %s held outside kwatch (a debugger's hardware "
          "breakpoints, or another tool); the probes use the rest (`kwatch slots -p %d` shows "
          "them)",
          n.count, Plural(n.count, "s"), n.pid, n.count == 1 ? "is" : "are", n.pid);
    case Kind::kNotPublished:
      return absl::StrCat("note: `kwatch slots` will not see this session: ", n.why);
    case Kind::kExec:
      return Exec(n);
    case Kind::kGroupStop:
      return absl::StrFormat("%s %d stopped by %s (job control); still probing", Who(n), n.pid,
                             sigabbrev_np(n.signal));
    case Kind::kChildFollowed:
      if (n.backend == "agent") {
        return absl::StrFormat(
            "following child %d of %d (the agent in it kept the probes, with a watchdog of its "
            "own)",
            n.pid, n.parent);
      }
      return absl::StrFormat(
          "following child %d of %d (probes adopted in %.0f us, %.0f us of it starting its "
          "guardian)",
          n.pid, n.parent, n.us, n.guardian_us);
    case Kind::kChildExited: {
      if (!n.exit.has_value()) {
        return absl::StrFormat("followed child %d ended", n.pid);
      }
      const core::ptrace::ExitInfo e = n.exit.value_or(core::ptrace::ExitInfo{});
      return absl::StrFormat("followed child %d %s %d", n.pid,
                             e.signaled ? "killed by signal" : "exited with status",
                             e.signaled ? e.signal : e.code);
    }
    case Kind::kStopping:
      return absl::StrFormat(
          "stopping (%s): the probes are disabled and come out as soon as the target pauses "
          "between hits",
          n.why);
    case Kind::kChildrenReleased:
      return absl::StrFormat("probes removed from %d followed child%s, detached; %s running",
                             n.count, Plural(n.count, "ren"),
                             n.count == 1 ? "it keeps" : "they keep");
    case Kind::kReleased:
      if (n.backend == "hw") {
        return absl::StrFormat("debug registers cleared, detached; target %d keeps running", n.pid);
      }
      if (n.backend == "uprobe") {
        return absl::StrFormat("probes removed; target %d keeps running", n.pid);
      }
      return absl::StrFormat("probes removed, detached; target %d keeps running", n.pid);
    case Kind::kParked:
      return absl::StrFormat(
          "--stop-on: target %d is stopped (SIGSTOP) with its code restored, thread %d at %s; "
          "take over with `gdb -p %d` (its first `continue` reports that SIGSTOP: `handle "
          "SIGSTOP nostop noprint` passes it), or let it go on with `kill -CONT %d`",
          n.pid, n.count, n.why, n.pid, n.pid);
    case Kind::kChildUnguarded:
      return absl::StrFormat("child %d is not guarded (the guardian did not start: %s)", n.pid,
                             n.why);
    case Kind::kForksNotFollowed:
      return absl::StrFormat("the target forked %d child%s: not followed, %s", n.count,
                             Plural(n.count, "ren"),
                             n.backend == "hw" ? "their debug registers were cleared"
                                               : "their copy of the code was restored");
    case Kind::kChildrenFollowed:
      return absl::StrFormat(
          "followed %d forked child%s (-f; pids %s): their hits are counted above and labelled "
          "with their pid",
          n.pids.size(), Plural(n.pids.size(), "ren"), absl::StrJoin(n.pids, " "));
    case Kind::kSpuriousTraps:
      return absl::StrFormat(
          "absorbed %d spurious debug trap%s (SIGTRAP with no cause: no debug-register bit, no "
          "icebp) that would have killed a target without a SIGTRAP handler",
          n.count, Plural(n.count, "s"));
    case Kind::kStrayTraps:
      return absl::StrFormat("hw: %d debug trap%s named no probe's register (dropped)", n.count,
                             Plural(n.count, "s"));
    case Kind::kUprobeSampling:
      return absl::StrFormat(
          "uprobe backend: arguments come from the registers and the %d bytes of stack above "
          "%%sp that the kernel sampled at each hit; memory elsewhere (heap, globals, strings "
          "not on the stack) and %%xmm registers are not sampled",
          n.count);
    case Kind::kNotSampled:
      return absl::StrFormat(
          "%d argument value%s showed %s: the memory was outside the sampled stack (raise "
          "--stack-bytes, or use --backend ptrace, which reads the target's memory at the hit)",
          n.count, Plural(n.count, "s"), watch::probe::kNotSampled);
    case Kind::kOtherProcesses:
      return absl::StrFormat("%d hits of other processes running %s were left out", n.count,
                             n.path);
    case Kind::kAgentDropped:
      return absl::StrFormat("the agent dropped %d hit%s (%s)", n.count, Plural(n.count, "s"),
                             n.why);
    case Kind::kAggregateShort:
      return absl::StrFormat(
          "%s was aggregated by kwatch from the records it received (not in the target: %s): "
          "the %d hit%s whose records were lost in full rings are not in it",
          n.path, n.why, n.count, Plural(n.count, "s"));
    case Kind::kSamplesDropped:
      return absl::StrFormat(
          "the kernel dropped %d samples of probe %d (ring full): counts are short", n.count,
          n.probe->id);
  }
  return "";
}

std::string SummaryNoteText(const ProbeNote& n) {
  switch (n.kind) {
    case Kind::kHwPlacement:
      return absl::StrCat("hw: ", Placement(n));
    case Kind::kExternalRegisters:
      return absl::StrFormat("hw: %d debug register%s held outside kwatch", n.count,
                             n.count == 1 ? " was" : "s were");
    default:
      return ProbeNoteText(n);
  }
}

}  // namespace kwatch::cli
