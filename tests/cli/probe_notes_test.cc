// Every probe note kind as `kwatch probe` words it, exactly (the sentences the sessions used to
// build themselves).

#include "cli/probe_notes.h"

#include <csignal>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "watch/probe/probe_set.h"

namespace kwatch::cli {
namespace {

using watch::probe::ProbeDef;
using watch::probe::ProbeNote;
using Kind = ProbeNote::Kind;

ProbeNote Note(Kind kind) {
  ProbeNote n;
  n.kind = kind;
  return n;
}

TEST(ProbeNoteText, Armed) {
  ProbeNote n = Note(Kind::kArmed);
  n.backend = "ptrace";
  n.count = 2;
  n.pid = 4242;
  n.path = "/bin/prog";
  EXPECT_EQ(ProbeNoteText(n), "armed 2 probes on pid 4242 (/bin/prog), ptrace backend");
  n.backend = "uprobe";
  n.count = 1;
  n.pid = 0;
  EXPECT_EQ(ProbeNoteText(n),
            "armed 1 probe on every process running it (/bin/prog), uprobe "
            "backend");
  n.backend = "hw";
  n.pid = 7;
  n.ms = 1.234;
  EXPECT_EQ(ProbeNoteText(n),
            "armed 1 probe on pid 7 (/bin/prog), hw backend: execute breakpoints in debug "
            "registers through ptrace, the code is not modified (1.23 ms)");
}

TEST(ProbeNoteText, HwPlacementLiveAndInTheSummary) {
  ProbeDef p;
  p.id = 1;
  p.point.event = "tick";
  p.point.function = "tick";
  ProbeNote n = Note(Kind::kHwPlacement);
  n.probe = &p;
  n.reg = 2;
  n.address = 0x401136;
  EXPECT_EQ(ProbeNoteText(n),
            "  probe #1 tick (tick): debug register DR2, execute breakpoint at 0x401136 in every "
            "thread");
  EXPECT_EQ(SummaryNoteText(n),
            "hw: probe #1 tick (tick): debug register DR2, execute breakpoint at 0x401136 in "
            "every thread");
  n.shared_with = {3};
  EXPECT_EQ(SummaryNoteText(n),
            "hw: probe #1 tick (tick): debug register DR2, execute breakpoint at 0x401136 in "
            "every thread (shared with probe #3: same address)");
  n.shared_with = {3, 4};
  EXPECT_EQ(ProbeNoteText(n),
            "  probe #1 tick (tick): debug register DR2, execute breakpoint at 0x401136 in every "
            "thread (shared with probes #3, #4: same address)");
}

TEST(ProbeNoteText, ExternalRegistersLiveAndInTheSummary) {
  ProbeNote n = Note(Kind::kExternalRegisters);
  n.count = 1;
  n.pid = 99;
  EXPECT_EQ(ProbeNoteText(n),
            "1 debug register of pid 99 is held outside kwatch (a debugger's hardware "
            "breakpoints, or another tool); the probes use the rest (`kwatch slots -p 99` shows "
            "them)");
  EXPECT_EQ(SummaryNoteText(n), "hw: 1 debug register was held outside kwatch");
  n.count = 2;
  EXPECT_EQ(ProbeNoteText(n),
            "2 debug registers of pid 99 are held outside kwatch (a debugger's hardware "
            "breakpoints, or another tool); the probes use the rest (`kwatch slots -p 99` shows "
            "them)");
  EXPECT_EQ(SummaryNoteText(n), "hw: 2 debug registers were held outside kwatch");
}

TEST(ProbeNoteText, Exec) {
  ProbeNote n = Note(Kind::kExec);
  n.pid = 10;
  EXPECT_EQ(ProbeNoteText(n), "target 10 called exec: the probes of the old image ended there");
  EXPECT_EQ(SummaryNoteText(n), ProbeNoteText(n));
  n.child = true;
  n.rearm = ProbeNote::Rearm::kDone;
  n.count = 1;
  EXPECT_EQ(ProbeNoteText(n),
            "followed child 10 called exec: the probes of the old image ended there; 1 probe "
            "re-armed in the new image (-f)");
  n.child = false;
  n.count = 2;
  n.at_entry = true;
  EXPECT_EQ(ProbeNoteText(n),
            "target 10 called exec: the probes of the old image ended there; 2 probes re-armed "
            "in the new image at its entry point (-f)");
  n.rearm = ProbeNote::Rearm::kNotMapped;
  n.path = "/lib/libc.so.6";
  n.why = "no mapping";
  EXPECT_EQ(ProbeNoteText(n),
            "target 10 called exec: the probes of the old image ended there; not re-armed: "
            "/lib/libc.so.6 is not mapped in the new image (no mapping)");
  n.rearm = ProbeNote::Rearm::kFailed;
  n.why = "ptrace: No such process";
  EXPECT_EQ(ProbeNoteText(n),
            "target 10 called exec: the probes of the old image ended there; not re-armed: "
            "ptrace: No such process");
}

TEST(ProbeNoteText, TheProcessesOfTheSession) {
  ProbeNote stop = Note(Kind::kGroupStop);
  stop.pid = 5;
  stop.signal = SIGTSTP;
  EXPECT_EQ(ProbeNoteText(stop), "target 5 stopped by TSTP (job control); still probing");
  stop.child = true;
  EXPECT_EQ(ProbeNoteText(stop), "followed child 5 stopped by TSTP (job control); still probing");

  ProbeNote followed = Note(Kind::kChildFollowed);
  followed.pid = 6;
  followed.parent = 5;
  followed.us = 812.4;
  followed.guardian_us = 640.6;
  EXPECT_EQ(ProbeNoteText(followed),
            "following child 6 of 5 (probes adopted in 812 us, 641 us of it starting its "
            "guardian)");
  followed.backend = "agent";
  EXPECT_EQ(ProbeNoteText(followed),
            "following child 6 of 5 (the agent in it kept the probes, with a watchdog of its "
            "own)");

  ProbeNote exited = Note(Kind::kChildExited);
  exited.pid = 6;
  exited.exit = core::ExitInfo{};
  exited.exit->code = 3;
  EXPECT_EQ(ProbeNoteText(exited), "followed child 6 exited with status 3");
  exited.exit->signaled = true;
  exited.exit->signal = SIGKILL;
  EXPECT_EQ(ProbeNoteText(exited), "followed child 6 killed by signal 9");
  exited.exit.reset();  // the agent: its parent reaped it before kwatch could read its status
  EXPECT_EQ(ProbeNoteText(exited), "followed child 6 ended");

  ProbeNote stopping = Note(Kind::kStopping);
  stopping.why = "interrupted by INT";
  EXPECT_EQ(ProbeNoteText(stopping),
            "stopping (interrupted by INT): the probes are disabled and come out as soon as the "
            "target pauses between hits");

  ProbeNote children = Note(Kind::kChildrenReleased);
  children.count = 1;
  EXPECT_EQ(ProbeNoteText(children),
            "probes removed from 1 followed child, detached; it keeps running");
  children.count = 3;
  EXPECT_EQ(ProbeNoteText(children),
            "probes removed from 3 followed children, detached; they keep running");

  ProbeNote released = Note(Kind::kReleased);
  released.pid = 5;
  released.backend = "ptrace";
  EXPECT_EQ(ProbeNoteText(released), "probes removed, detached; target 5 keeps running");
  released.backend = "hw";
  EXPECT_EQ(ProbeNoteText(released), "debug registers cleared, detached; target 5 keeps running");
  released.backend = "uprobe";
  EXPECT_EQ(ProbeNoteText(released), "probes removed; target 5 keeps running");

  ProbeNote unpublished = Note(Kind::kNotPublished);
  unpublished.why = "read-only file system";
  EXPECT_EQ(ProbeNoteText(unpublished),
            "note: `kwatch slots` will not see this session: read-only file system");
}

TEST(SummaryNoteText, TheEndOfTheSession) {
  ProbeNote unguarded = Note(Kind::kChildUnguarded);
  unguarded.pid = 8;
  unguarded.why = "fork: EAGAIN";
  EXPECT_EQ(SummaryNoteText(unguarded),
            "child 8 is not guarded (the guardian did not start: fork: EAGAIN)");

  ProbeNote forks = Note(Kind::kForksNotFollowed);
  forks.count = 1;
  forks.backend = "ptrace";
  EXPECT_EQ(SummaryNoteText(forks),
            "the target forked 1 child: not followed, their copy of the code was restored");
  forks.count = 2;
  forks.backend = "hw";
  EXPECT_EQ(SummaryNoteText(forks),
            "the target forked 2 children: not followed, their debug registers were cleared");

  ProbeNote followed = Note(Kind::kChildrenFollowed);
  followed.pids = {11, 12};
  EXPECT_EQ(SummaryNoteText(followed),
            "followed 2 forked children (-f; pids 11 12): their hits are counted above and "
            "labelled with their pid");
  followed.pids = {11};
  EXPECT_EQ(SummaryNoteText(followed),
            "followed 1 forked child (-f; pids 11): their hits are counted above and labelled "
            "with their pid");

  ProbeNote spurious = Note(Kind::kSpuriousTraps);
  spurious.count = 1;
  EXPECT_EQ(SummaryNoteText(spurious),
            "absorbed 1 spurious debug trap (SIGTRAP with no cause: no debug-register bit, no "
            "icebp) that would have killed a target without a SIGTRAP handler");

  ProbeNote stray = Note(Kind::kStrayTraps);
  stray.count = 2;
  EXPECT_EQ(SummaryNoteText(stray), "hw: 2 debug traps named no probe's register (dropped)");

  ProbeNote sampling = Note(Kind::kUprobeSampling);
  sampling.count = 512;
  EXPECT_EQ(SummaryNoteText(sampling),
            "uprobe backend: arguments come from the registers and the 512 bytes of stack above "
            "%sp that the kernel sampled at each hit; memory elsewhere (heap, globals, strings "
            "not on the stack) and %xmm registers are not sampled");

  ProbeNote not_sampled = Note(Kind::kNotSampled);
  not_sampled.count = 1;
  EXPECT_EQ(SummaryNoteText(not_sampled),
            "1 argument value showed (not sampled): the memory was outside the sampled stack "
            "(raise --stack-bytes, or use --backend ptrace, which reads the target's memory at "
            "the hit)");

  ProbeNote others = Note(Kind::kOtherProcesses);
  others.count = 4;
  others.path = "/bin/prog";
  EXPECT_EQ(SummaryNoteText(others), "4 hits of other processes running /bin/prog were left out");

  ProbeDef p;
  p.id = 2;
  ProbeNote dropped = Note(Kind::kSamplesDropped);
  dropped.count = 17;
  dropped.probe = &p;
  EXPECT_EQ(SummaryNoteText(dropped),
            "the kernel dropped 17 samples of probe 2 (ring full): counts are short");
}

}  // namespace
}  // namespace kwatch::cli
