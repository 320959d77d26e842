#include "core/ptrace/exit_anchor.h"

#include <linux/kcmp.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "tests/test_util.h"

namespace kwatch::core::ptrace {
namespace {

using ::kwatch::testing::SubreaperScope;

std::string ProcFile(pid_t pid, const std::string& name) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/" + name);
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return text;
}

// The value of `field` in /proc/PID/status ("SigBlk", "PPid").
std::string StatusField(pid_t pid, const std::string& field) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind(field + ":", 0) == 0) {
      return line.substr(line.find_first_not_of(" \t", field.size() + 1));
    }
  }
  return "";
}

// A child plays kwatch: starts its anchor, reports the anchor's pid (and whether the second
// call returned the same), and waits to be killed. The test process is a subreaper, so the
// anchor, reparented away from the child at once, becomes the test's to wait for.
TEST(ExitAnchor, HoldsTheAddressSpaceUntilItsProcessIsGoneThenEnds) {
  SubreaperScope reaper;
  int up[2];
  ASSERT_EQ(pipe(up), 0);
  const pid_t child = fork();
  if (child == 0) {
    auto a = StartExitAnchor();
    auto again = StartExitAnchor();
    pid_t report[2] = {a.ok() ? *a : -1, (again.ok() && a.ok() && *again == *a) ? 1 : 0};
    (void)!write(up[1], report, sizeof(report));
    for (;;) {
      pause();
    }
  }
  close(up[1]);
  pid_t report[2] = {0, 0};
  ASSERT_EQ(read(up[0], report, sizeof(report)), static_cast<ssize_t>(sizeof(report)));
  close(up[0]);
  const pid_t anchor = report[0];
  ASSERT_GT(anchor, 0) << "StartExitAnchor failed in the child (KWATCH_DEBUG says why)";
  EXPECT_EQ(report[1], 1) << "a second call started a second anchor";

  EXPECT_EQ(ProcFile(anchor, "comm"), "kwatch-anchor\n");
  // Another process (its own thread group), sharing the child's memory.
  EXPECT_EQ(StatusField(anchor, "Tgid"), std::to_string(anchor));
  EXPECT_EQ(syscall(SYS_kcmp, child, anchor, KCMP_VM, 0, 0), 0) << "not the child's address space";
  // Reparented away from the child (to this subreaper): the child has no child to wait for.
  EXPECT_EQ(StatusField(anchor, "PPid"), std::to_string(getpid()));
  // Every signal blocked, and one file open: the pidfd it waits on.
  EXPECT_EQ(StatusField(anchor, "SigBlk"), "fffffffffffbfeff") << "all but SIGKILL and SIGSTOP";
  size_t fds = 0;
  for ([[maybe_unused]] const auto& e :
       std::filesystem::directory_iterator("/proc/" + std::to_string(anchor) + "/fd")) {
    ++fds;
  }
  EXPECT_EQ(fds, 1u);
  // Ctrl-C and the like reach kwatch's process group, not the anchor's (its own session).
  EXPECT_NE(getpgid(anchor), getpgid(child));

  // Alive while the child lives...
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  int status = 0;
  EXPECT_EQ(waitpid(anchor, &status, WNOHANG), 0) << "the anchor ended before its process";
  // ... and gone, by itself and with status 0, once the child is.
  ASSERT_EQ(kill(child, SIGKILL), 0);
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  pid_t r = 0;
  for (int i = 0; i < 500 && (r = waitpid(anchor, &status, WNOHANG)) == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(r, anchor) << "the anchor outlived its process by 5 s";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

}  // namespace
}  // namespace kwatch::core::ptrace
