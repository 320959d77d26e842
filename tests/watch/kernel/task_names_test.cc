// watch/kernel/task_names.h: the names of the tasks kernel events come from.
#include "watch/kernel/task_names.h"

#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <array>
#include <string>

#include <gtest/gtest.h>

namespace kwatch::watch::kernel {
namespace {

TEST(TaskNamesTest, IdleTasksAreSwapperPerCpu) {
  TaskNames names;
  EXPECT_EQ(names.Get(0, 0), "swapper/0");
  EXPECT_EQ(names.Get(0, 3), "swapper/3");
  EXPECT_EQ(names.Get(0, 0), "swapper/0");
}

TEST(TaskNamesTest, ANameIsReadOnceAndKept) {
  std::array<char, 16> old_name{};
  ASSERT_EQ(prctl(PR_GET_NAME, old_name.data()), 0);
  ASSERT_EQ(prctl(PR_SET_NAME, "kw-names-one"), 0);
  const auto tid = static_cast<pid_t>(syscall(SYS_gettid));
  TaskNames names;
  EXPECT_EQ(names.Get(tid, 1), "kw-names-one");
  ASSERT_EQ(prctl(PR_SET_NAME, "kw-names-two"), 0);
  EXPECT_EQ(names.Get(tid, 0), "kw-names-one");  // as it was at its first event
  EXPECT_EQ(TaskNames().Get(tid, 0), "kw-names-two");
  ASSERT_EQ(prctl(PR_SET_NAME, old_name.data()), 0);
}

TEST(TaskNamesTest, AGoneTaskIsAQuestionMark) {
  TaskNames names;
  // Above the kernel's largest pid_max (2^22): never a task.
  EXPECT_EQ(names.Get(5'000'000, 0), "?");
}

}  // namespace
}  // namespace kwatch::watch::kernel
