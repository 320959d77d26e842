#include "core/ptrace/process.h"

#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <span>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/test_util.h"

namespace kwatch::core::ptrace {
namespace {

using ::testing::HasSubstr;

// Polls until the process has exited.
void RunToExit(Process& p) {
  while (p.alive()) {
    auto events = p.Poll(/*block=*/true);
    ASSERT_TRUE(events.ok()) << events.status();
  }
}

TEST(ProcessLaunch, StopsAfterExecAndReportsExitStatus) {
  auto p = Process::Launch({kwatch::testing::TargetPath("field_writer"), "2", "10", "--exit", "3",
                            "--truth", "/dev/null"});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE((*p)->launched());
  // Stopped at exec: one thread, and the executable is mapped.
  EXPECT_EQ((*p)->TracedThreads().size(), 1u);
  auto maps = (*p)->Maps();
  ASSERT_TRUE(maps.ok());
  bool found = false;
  for (const auto& m : *maps) {
    found |= m.path.find("field_writer") != std::string::npos;
  }
  EXPECT_TRUE(found);
  ASSERT_TRUE((*p)->RunToEntry().ok());
  ASSERT_TRUE((*p)->ResumeAll().ok());
  int started = 0;
  while ((*p)->alive()) {
    auto events = (*p)->Poll(true);
    ASSERT_TRUE(events.ok());
    for (const auto& e : *events) {
      started += e.kind == ProcessEvent::Kind::kThreadStarted;
    }
  }
  EXPECT_EQ(started, 2);  // the two workers, followed through PTRACE_O_TRACECLONE
  ASSERT_TRUE((*p)->exit_info().has_value());
  EXPECT_FALSE((*p)->exit_info()->signaled);
  EXPECT_EQ((*p)->exit_info()->code, 3);
}

TEST(ProcessLaunch, MissingProgramSaysSo) {
  auto p = Process::Launch({"/nonexistent/kwatch-target"});
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(p.status().message()),
              HasSubstr("cannot execute '/nonexistent/kwatch-target'"));
}

TEST(ProcessLaunch, NonExecutableFileSaysSo) {
  auto p = Process::Launch({std::string(KWATCH_SOURCE_DIR) + "/tests/targets/field_writer.c"});
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("chmod +x"));
}

TEST(ProcessLaunch, ReadsAndWritesMemoryIncludingCode) {
  auto p = Process::Launch(
      {kwatch::testing::TargetPath("field_writer"), "1", "1", "--truth", "/dev/null"});
  ASSERT_TRUE(p.ok());
  ASSERT_TRUE((*p)->RunToEntry().ok());
  auto regs = (*p)->GetRegs((*p)->pid());
  ASSERT_TRUE(regs.ok());
  // At the entry point: read the first code bytes, write them back (read-only page).
  uint8_t code[4] = {};
  ASSERT_TRUE((*p)->ReadMemory(RemoteAddr{regs->rip}, code).ok());
  EXPECT_NE(code[0], 0xcc);  // the temporary breakpoint is gone
  ASSERT_TRUE((*p)->WriteMemory(RemoteAddr{regs->rip}, code).ok());
  uint8_t again[4] = {};
  ASSERT_TRUE((*p)->ReadMemory(RemoteAddr{regs->rip}, again).ok());
  EXPECT_EQ(0, memcmp(code, again, 4));
  auto bad = (*p)->ReadMemory(RemoteAddr{8}, code);
  EXPECT_FALSE(bad.ok());
  ASSERT_TRUE((*p)->ResumeAll().ok());
  RunToExit(**p);
  EXPECT_EQ((*p)->exit_info()->code, 0);
}

TEST(ProcessAttach, SeizesEveryThreadAndDetaches) {
  auto target = kwatch::testing::Spawned::Start(
      {kwatch::testing::TargetPath("field_writer"), "1", "1", "--wait", "--truth", "/dev/null"});
  ASSERT_TRUE(target.ok());
  ASSERT_TRUE((*target)->WaitForStdout("ready").ok());
  {
    auto p = Process::Attach((*target)->pid());
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_FALSE((*p)->launched());
    EXPECT_EQ((*p)->TracedThreads(), std::vector<pid_t>{(*target)->pid()});
    ASSERT_TRUE((*p)->StopAll().ok());
    ASSERT_TRUE((*p)->Detach().ok());
  }
  // Untraced again, it runs to its end on our signal.
  kill((*target)->pid(), SIGUSR1);
  auto r = (*target)->Finish();
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->exit_code, 0);
}

TEST(ProcessAttach, NoSuchProcess) {
  auto p = Process::Attach(999999999);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kNotFound);
}

// A thread interrupted inside a blocking call (here by StopAll, with system-call stops on)
// is due to restart it; a system call kwatch runs in it meanwhile must not cost it that
// restart: the program would see the kernel's -ERESTARTSYS (glibc aborts on a futex result
// it does not know).
TEST(ProcessSyscalls, ACallRunInAThreadInterruptedInABlockingCallKeepsItsRestart) {
  const std::string out = ::testing::TempDir() + "futex_restart_" + std::to_string(::getpid());
  std::remove(out.c_str());
  auto p = Process::Launch({kwatch::testing::TargetPath("futex_restart"), out, "600"});
  ASSERT_TRUE(p.ok()) << p.status();
  Process& proc = **p;
  ASSERT_TRUE(proc.RunToEntry().ok());
  proc.SetSyscallStops(true);
  ASSERT_TRUE(proc.ResumeAll().ok());
  // Let the main thread reach its futex wait (every call stops at entry and exit meanwhile).
  for (int i = 0; i < 200; ++i) {
    ASSERT_TRUE(proc.Poll(/*block=*/false).ok());
    ::usleep(1000);
  }
  ASSERT_TRUE(proc.StopAll().ok());
  const uint64_t none[1] = {0};
  auto r = proc.RemoteSyscall(proc.pid(), SYS_getpid, std::span<const uint64_t>(none, 0));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, proc.pid());
  ASSERT_TRUE(proc.ResumeAll().ok());
  proc.SetSyscallStops(false);
  RunToExit(proc);
  ASSERT_TRUE(proc.exit_info().has_value());
  EXPECT_EQ(proc.exit_info()->code, 0);
  std::ifstream in(out);
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, "futex ok");
  std::remove(out.c_str());
}

}  // namespace
}  // namespace kwatch::core::ptrace
