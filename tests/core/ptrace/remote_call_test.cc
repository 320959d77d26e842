#include "core/ptrace/remote_call.h"

#include <signal.h>
#include <sys/ptrace.h>
#include <sys/user.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/ptrace/process.h"
#include "core/symbols/symbols.h"
#include "tests/test_util.h"

namespace kwatch::core::ptrace {
namespace {

using ::testing::HasSubstr;

// The address of function `name` of the target (its executable's symbols).
RemoteAddr Fn(const Process& proc, const std::string& name) {
  auto symbols = symbols::Symbols::ForProcess(proc.pid());
  if (!symbols.ok()) {
    ADD_FAILURE() << symbols.status();
    return RemoteAddr{};
  }
  auto f = (*symbols)->FindFunction(name);
  if (!f.has_value()) {
    ADD_FAILURE() << "no function " << name;
    return RemoteAddr{};
  }
  return f->start;
}

void RunToExit(Process& p) {
  while (p.alive()) {
    auto events = p.Poll(/*block=*/true);
    ASSERT_TRUE(events.ok()) << events.status();
  }
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string OutFile(const std::string& what) {
  return ::testing::TempDir() + "remote_call_" + what + "_" + std::to_string(::getpid());
}

std::string ExpectedCount(int n) {
  std::string out;
  long sum = 0;
  for (int i = 0; i < n; ++i) {
    out += "tick " + std::to_string(i) + "\n";
    sum += static_cast<long>(i) * i;
  }
  return out + "sum " + std::to_string(sum) + "\n";
}

bool SameRegs(const user_regs_struct& a, const user_regs_struct& b) {
  return std::memcmp(&a, &b, sizeof(a)) == 0;
}

user_fpregs_struct FpRegs(pid_t tid) {
  user_fpregs_struct fp{};
  EXPECT_EQ(::ptrace(PTRACE_GETFPREGS, tid, nullptr, &fp), 0);
  return fp;
}

// A launched target at its entry point with a return trap mapped.
struct Launched {
  std::unique_ptr<Process> proc;
  RemoteAddr trap;
  std::string out;
};

Launched LaunchCount(const std::string& tag, int n) {
  Launched l;
  l.out = OutFile(tag);
  std::remove(l.out.c_str());
  auto p = Process::Launch(
      {kwatch::testing::TargetPath("remote_call"), "count", std::to_string(n), "--out", l.out});
  if (!p.ok()) {
    ADD_FAILURE() << p.status();
    return l;
  }
  l.proc = std::move(*p);
  if (absl::Status s = l.proc->RunToEntry(); !s.ok()) {
    ADD_FAILURE() << s;
    return l;
  }
  auto trap = MapRemoteTrap(*l.proc, l.proc->pid(), 4096);
  if (!trap.ok()) {
    ADD_FAILURE() << trap.status();
    return l;
  }
  l.trap = *trap;
  return l;
}

TEST(RemoteCall, AtTheEntryPointPassesSixArgumentsAlignsTheStackAndRestoresEverything) {
  Launched l = LaunchCount("entry", 5);
  ASSERT_NE(l.proc, nullptr);
  Process& proc = *l.proc;
  const pid_t tid = proc.pid();
  auto before = proc.GetRegs(tid);
  ASSERT_TRUE(before.ok());
  const user_fpregs_struct fp_before = FpRegs(tid);
  RemoteCallOptions opts{.return_trap = l.trap};

  const uint64_t args[6] = {1, 2, 3, 4, 5, 6};
  auto r = RemoteCall(proc, tid, Fn(proc, "add6"), args, opts);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->value, 1u + 4 + 9 + 16 + 25 + 36);
  EXPECT_EQ(r->deferred_signals, 0);

  auto rsp = RemoteCall(proc, tid, Fn(proc, "entry_rsp"), {}, opts);
  ASSERT_TRUE(rsp.ok()) << rsp.status();
  EXPECT_EQ((rsp->value + 8) % 16, 0u) << std::hex << rsp->value;
  EXPECT_LE(rsp->value + 8, before->rsp - 128) << "the red zone must stay untouched";

  // A child forked inside a call would return into the trap: it is killed before it runs.
  auto forked = RemoteCall(proc, tid, Fn(proc, "do_fork"), {}, opts);
  ASSERT_TRUE(forked.ok()) << forked.status();
  EXPECT_EQ(forked->value, 100u + SIGKILL);
  EXPECT_EQ(forked->killed_forks, 1);

  auto after = proc.GetRegs(tid);
  ASSERT_TRUE(after.ok());
  EXPECT_TRUE(SameRegs(*before, *after));
  const user_fpregs_struct fp_after = FpRegs(tid);
  EXPECT_EQ(std::memcmp(&fp_before, &fp_after, sizeof(fp_after)), 0);

  ASSERT_TRUE(UnmapRemote(proc, tid, l.trap, 4096).ok());
  ASSERT_TRUE(proc.ResumeAll().ok());
  RunToExit(proc);
  ASSERT_TRUE(proc.exit_info().has_value());
  EXPECT_EQ(proc.exit_info()->ShellStatus(), 0);
  EXPECT_EQ(ReadFile(l.out), ExpectedCount(5));
  std::remove(l.out.c_str());
}

TEST(RemoteCall, AFaultIsReportedWithItsAddressAndTheProgramGoesOn) {
  Launched l = LaunchCount("fault", 4);
  ASSERT_NE(l.proc, nullptr);
  Process& proc = *l.proc;
  auto before = proc.GetRegs(proc.pid());
  ASSERT_TRUE(before.ok());
  RemoteCallOptions opts{.return_trap = l.trap};
  const uint64_t bad[1] = {0x10};
  auto r = RemoteCall(proc, proc.pid(), Fn(proc, "deref"), bad, opts);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("SIGSEGV"));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("at address 0x10,"));
  auto after = proc.GetRegs(proc.pid());
  ASSERT_TRUE(after.ok());
  EXPECT_TRUE(SameRegs(*before, *after));
  // Still usable.
  const uint64_t args[6] = {1, 1, 1, 1, 1, 1};
  auto again = RemoteCall(proc, proc.pid(), Fn(proc, "add6"), args, opts);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->value, 21u);
  ASSERT_TRUE(proc.ResumeAll().ok());
  RunToExit(proc);
  EXPECT_EQ(proc.exit_info()->ShellStatus(), 0);
  EXPECT_EQ(ReadFile(l.out), ExpectedCount(4));
  std::remove(l.out.c_str());
}

TEST(RemoteCall, ACallThatNeverReturnsTimesOutAndTheThreadIsRestored) {
  Launched l = LaunchCount("timeout", 3);
  ASSERT_NE(l.proc, nullptr);
  Process& proc = *l.proc;
  auto before = proc.GetRegs(proc.pid());
  ASSERT_TRUE(before.ok());
  RemoteCallOptions opts{.return_trap = l.trap, .timeout = absl::Milliseconds(200)};
  auto r = RemoteCall(proc, proc.pid(), Fn(proc, "spin"), {}, opts);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("did not return within 200ms"));
  auto after = proc.GetRegs(proc.pid());
  ASSERT_TRUE(after.ok());
  EXPECT_TRUE(SameRegs(*before, *after));
  ASSERT_TRUE(proc.ResumeAll().ok());
  RunToExit(proc);
  EXPECT_EQ(proc.exit_info()->ShellStatus(), 0);
  EXPECT_EQ(ReadFile(l.out), ExpectedCount(3));
  std::remove(l.out.c_str());
}

TEST(RemoteCall, RefusesWhatItCannotDo) {
  Launched l = LaunchCount("refuse", 1);
  ASSERT_NE(l.proc, nullptr);
  Process& proc = *l.proc;
  const uint64_t seven[7] = {};
  auto r = RemoteCall(proc, proc.pid(), Fn(proc, "add6"), seven,
                      RemoteCallOptions{.return_trap = l.trap});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  r = RemoteCall(proc, proc.pid(), Fn(proc, "add6"), {}, RemoteCallOptions{});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  r = RemoteCall(proc, proc.pid() + 100000, Fn(proc, "add6"), {},
                 RemoteCallOptions{.return_trap = l.trap});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(proc.ResumeAll().ok());
  RunToExit(proc);
  std::remove(l.out.c_str());
}

// Attached targets: the thread is stopped wherever it was.
struct Attached {
  std::unique_ptr<kwatch::testing::Spawned> target;
  std::unique_ptr<Process> proc;
  RemoteAddr trap;
};

Attached AttachTo(const std::string& mode) {
  Attached a;
  auto t = kwatch::testing::Spawned::Start({kwatch::testing::TargetPath("remote_call"), mode});
  if (!t.ok()) {
    ADD_FAILURE() << t.status();
    return a;
  }
  a.target = std::move(*t);
  if (absl::Status s = a.target->WaitForStdout("ready"); !s.ok()) {
    ADD_FAILURE() << s;
    return a;
  }
  auto p = Process::Attach(a.target->pid());
  if (!p.ok()) {
    ADD_FAILURE() << p.status();
    return a;
  }
  a.proc = std::move(*p);
  if (absl::Status s = a.proc->StopAll(); !s.ok()) {
    ADD_FAILURE() << s;
    return a;
  }
  auto trap = MapRemoteTrap(*a.proc, a.proc->pid(), 4096);
  if (!trap.ok()) {
    ADD_FAILURE() << trap.status();
    return a;
  }
  a.trap = *trap;
  return a;
}

TEST(RemoteCall, TheRedZoneAndVectorRegistersOfTheInterruptedCodeSurvive) {
  Attached a = AttachTo("hold");
  ASSERT_NE(a.proc, nullptr);
  Process& proc = *a.proc;
  const RemoteAddr spin = Fn(proc, "hold_spin");
  const RemoteAddr check = Fn(proc, "hold_check");
  // Until the main thread is in hold_state's loop, its pattern in place.
  for (int i = 0; i < 1000; ++i) {
    auto regs = proc.GetRegs(proc.pid());
    ASSERT_TRUE(regs.ok());
    if (regs->rip >= spin.value && regs->rip <= check.value) {
      break;
    }
    ASSERT_TRUE(proc.ResumeAll().ok());
    ::usleep(1000);
    ASSERT_TRUE(proc.StopAll().ok());
  }
  auto r = RemoteCall(proc, proc.pid(), Fn(proc, "clobber_and_release"), {},
                      RemoteCallOptions{.return_trap = a.trap});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->value, 99u);
  ASSERT_TRUE(UnmapRemote(proc, proc.pid(), a.trap, 4096).ok());
  ASSERT_TRUE(proc.Detach().ok());
  auto done = a.target->Finish();
  ASSERT_TRUE(done.ok());
  EXPECT_EQ(done->exit_code, 0);
  EXPECT_EQ(done->out, "ready\nintact 1\n");
}

TEST(RemoteCall, SignalsThatArriveDuringTheCallAreDeliveredAfterIt) {
  Attached a = AttachTo("signals");
  ASSERT_NE(a.proc, nullptr);
  Process& proc = *a.proc;
  // The main thread sits in pause(): the call interrupts it, and pause() restarts after.
  const uint64_t value[1] = {42};
  auto r = RemoteCall(proc, proc.pid(), Fn(proc, "raise_both"), value,
                      RemoteCallOptions{.return_trap = a.trap});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->value, 7u);
  EXPECT_EQ(r->deferred_signals, 2);
  ASSERT_TRUE(UnmapRemote(proc, proc.pid(), a.trap, 4096).ok());
  ASSERT_TRUE(proc.Detach().ok());
  auto done = a.target->Finish();
  ASSERT_TRUE(done.ok());
  EXPECT_EQ(done->exit_code, 0);
  // sigqueue's value, code (SI_QUEUE) and sender are kept.
  EXPECT_EQ(done->out, "ready\nusr1 1\nusr2 42 code -1 self 1\n");
}

TEST(RemoteCall, OtherThreadsResumedDuringTheCallReleaseTheirLocks) {
  Attached a = AttachTo("lock");
  ASSERT_NE(a.proc, nullptr);
  Process& proc = *a.proc;
  const RemoteAddr take_lock = Fn(proc, "take_lock");
  // The worker holds the lock and is stopped: the call cannot get it.
  auto stuck =
      RemoteCall(proc, proc.pid(), take_lock, {},
                 RemoteCallOptions{.return_trap = a.trap, .timeout = absl::Milliseconds(300)});
  ASSERT_FALSE(stuck.ok());
  EXPECT_EQ(stuck.status().code(), absl::StatusCode::kDeadlineExceeded);
  // Resumed, it lets the lock go.
  auto r = RemoteCall(proc, proc.pid(), take_lock, {},
                      RemoteCallOptions{.return_trap = a.trap, .resume_others = true});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->value, 5u);
  // Every thread is stopped again.
  ASSERT_TRUE(UnmapRemote(proc, proc.pid(), a.trap, 4096).ok());
  ASSERT_TRUE(proc.Detach().ok());
  auto done = a.target->Finish();
  ASSERT_TRUE(done.ok());
  EXPECT_EQ(done->exit_code, 0);
  EXPECT_EQ(done->out, "ready\njoined\n");
}

TEST(RemoteCall, AThreadThatEndsDuringTheCallIsReported) {
  Attached a = AttachTo("worker");
  ASSERT_NE(a.proc, nullptr);
  Process& proc = *a.proc;
  pid_t worker = 0;
  for (pid_t tid : proc.TracedThreads()) {
    if (tid != proc.pid()) {
      worker = tid;
    }
  }
  ASSERT_NE(worker, 0);
  auto r = RemoteCall(proc, worker, Fn(proc, "exit_thread"), {},
                      RemoteCallOptions{.return_trap = a.trap});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("the thread ended"));
  EXPECT_TRUE(proc.alive());
  ASSERT_TRUE(UnmapRemote(proc, proc.pid(), a.trap, 4096).ok());
  ASSERT_TRUE(proc.Detach().ok());
  auto done = a.target->Finish();
  ASSERT_TRUE(done.ok());
  EXPECT_EQ(done->exit_code, 0);
  EXPECT_THAT(done->out, HasSubstr("ready\njoined\n"));
}

}  // namespace
}  // namespace kwatch::core::ptrace
