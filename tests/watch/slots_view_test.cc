// watch/slots_view.h: what `kwatch slots` reads from the machine, on tests/targets/slot_holder
// (three threads).
#include "watch/slots_view.h"

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/base/unique_fd.h"
#include "drmgr/slot_allocator.h"
#include "drmgr/slot_registry.h"
#include "tests/test_util.h"

namespace kwatch::watch {
namespace {

using ::kwatch::testing::HoldBreakpointSlot;
using ::kwatch::testing::Spawned;
using ::kwatch::testing::TargetPath;
using ::testing::ElementsAre;
using ::testing::IsEmpty;

// slot_holder: "pid=P tids=T0,T1,T2 a=0x... b=0x... c=0x... d=0x...".
struct Holder {
  std::unique_ptr<Spawned> proc;
  pid_t pid = 0;
  std::vector<pid_t> tids;
  uint64_t a = 0;
};

Holder StartHolder() {
  Holder h;
  auto p = Spawned::Start({TargetPath("slot_holder")});
  EXPECT_TRUE(p.ok()) << p.status();
  if (!p.ok()) {
    return h;
  }
  h.proc = *std::move(p);
  EXPECT_TRUE(h.proc->WaitForStdout("d=0x").ok()) << h.proc->out();
  const std::string line = h.proc->out().substr(0, h.proc->out().find('\n'));
  for (absl::string_view field : absl::StrSplit(line, ' ')) {
    const std::vector<std::string> kv = absl::StrSplit(field, '=');
    if (kv.size() != 2) {
      continue;
    }
    if (kv[0] == "pid") {
      EXPECT_TRUE(absl::SimpleAtoi(kv[1], &h.pid));
    } else if (kv[0] == "tids") {
      for (absl::string_view t : absl::StrSplit(kv[1], ',')) {
        pid_t tid = 0;
        EXPECT_TRUE(absl::SimpleAtoi(t, &tid));
        h.tids.push_back(tid);
      }
    } else if (kv[0] == "a") {
      EXPECT_TRUE(absl::SimpleHexAtoi(kv[1], &h.a));
    }
  }
  return h;
}

// CountFreeSlots once it says `want`: a CPU-wide breakpoint of a test running in parallel
// (kernel watches) takes a slot of every thread for a moment. The last answer otherwise.
absl::StatusOr<int> FreeSlotsSettled(pid_t tid, int want) {
  absl::StatusOr<int> n = CountFreeSlots(tid);
  for (int i = 0; i < 100 && n.ok() && *n != want; ++i) {
    usleep(20000);
    n = CountFreeSlots(tid);
  }
  return n;
}

class SlotsViewTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = absl::StrCat(::testing::TempDir(), "/kwatch-slots-view-XXXXXX");
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    ::setenv("KWATCH_RUN_DIR", dir_.c_str(), 1);  // NOLINT(concurrency-mt-unsafe): one thread
    holder_ = StartHolder();
    ASSERT_EQ(holder_.tids.size(), 3U);
  }
  void TearDown() override {
    drmgr::UnpublishSlots();
    ::unsetenv("KWATCH_RUN_DIR");  // NOLINT(concurrency-mt-unsafe): one thread
    std::filesystem::remove_all(dir_);
  }

  std::string dir_;
  Holder holder_;
};

TEST_F(SlotsViewTest, ThreadsOfAProcess) {
  auto tids = ProcessThreads(holder_.pid);
  ASSERT_TRUE(tids.ok()) << tids.status();
  EXPECT_EQ(*tids, holder_.tids);  // ascending: the main thread is the lowest
  EXPECT_EQ(ProcessThreads(holder_.tids[1]).status(),
            absl::InvalidArgumentError(absl::StrCat(holder_.tids[1], " is a thread of process ",
                                                    holder_.pid, ": give -p ", holder_.pid)));
  EXPECT_EQ(ProcessThreads(5'000'000).status(),
            absl::NotFoundError("process 5000000 does not exist (or has exited)"));
}

TEST_F(SlotsViewTest, FreeSlotsAsTheKernelCountsThem) {
  const pid_t tid = holder_.tids[1];
  EXPECT_EQ(FreeSlotsSettled(tid, 4).value_or(-1), 4);
  {
    const core::UniqueFd held = HoldBreakpointSlot(tid, holder_.a);
    ASSERT_TRUE(held.valid());
    EXPECT_EQ(FreeSlotsSettled(tid, 3).value_or(-1), 3);
    // Only that thread's: its siblings keep theirs.
    EXPECT_EQ(FreeSlotsSettled(holder_.tids[2], 4).value_or(-1), 4);
  }
  EXPECT_EQ(FreeSlotsSettled(tid, 4).value_or(-1), 4);
  EXPECT_EQ(CountFreeSlots(5'000'000).status(), absl::NotFoundError("thread 5000000 exited"));
}

TEST_F(SlotsViewTest, AProcessWithAPublishedSession) {
  // This test process publishes a session watching slot_holder's `a` process-wide (no
  // breakpoint is opened: the kernel sees four free slots, so the view notes a stale count).
  drmgr::SlotAllocator alloc;
  const drmgr::ClientId c = alloc.AddClient(drmgr::ClientKind::kWatchpoint, "kwatch");
  drmgr::SlotRequest r;
  r.addr = core::RemoteAddr{holder_.a};
  r.len = 8;
  r.scope = drmgr::Scope::Process(holder_.pid);
  r.label = "g_a";
  ASSERT_TRUE(alloc.Request(c, r).ok());
  ASSERT_TRUE(drmgr::PublishSlots(holder_.pid, alloc.Snapshot(), "kwatch --write g_a").ok());

  // Published but not in the kernel: one note per thread. A CPU-wide breakpoint of a test
  // running in parallel (kernel watches) takes a slot of every thread for a moment: ask again.
  auto view = ReadSlotsView(holder_.pid);
  for (int i = 0; i < 50 && view.ok() && view->notes.size() != 3; ++i) {
    usleep(20000);
    view = ReadSlotsView(holder_.pid);
  }
  ASSERT_TRUE(view.ok()) << view.status();
  ASSERT_EQ(view->notes.size(), 3U);
  EXPECT_EQ(view->notes[0],
            absl::StrCat("thread ", holder_.tids[0],
                         ": kwatch sessions published 1 slots but the kernel shows 0 in use (a "
                         "session is changing its slots, or its last publication is out of "
                         "date)"));
  EXPECT_THAT(view->kernel, IsEmpty());
  ASSERT_EQ(view->processes.size(), 1U);
  const ProcessSlots& p = view->processes[0];
  EXPECT_EQ(p.pid, holder_.pid);
  EXPECT_EQ(p.comm, "slot_holder");
  ASSERT_EQ(p.sessions.size(), 1U);
  EXPECT_EQ(p.sessions[0].kwatch_pid, getpid());
  EXPECT_EQ(p.sessions[0].command_line, "kwatch --write g_a");
  ASSERT_EQ(p.threads.size(), 3U);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(p.threads[i].tid, holder_.tids[i]);
    EXPECT_EQ(p.threads[i].comm, "slot_holder");
    EXPECT_EQ(p.threads[i].kwatch, 1);
    ASSERT_FALSE(p.threads[i].rows.empty());
    EXPECT_THAT(p.threads[i].rows[0].labels, ElementsAre("g_a"));
  }
  EXPECT_THAT(p.not_in_hardware, IsEmpty());

  // Without -p: every watched process.
  auto all = ReadSlotsView(0);
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->processes.size(), 1U);
  EXPECT_EQ(all->processes[0].pid, holder_.pid);

  // A process that has exited is a note.
  holder_.proc.reset();
  auto gone = ReadSlotsView(0);
  ASSERT_TRUE(gone.ok()) << gone.status();
  EXPECT_THAT(gone->processes, IsEmpty());
  EXPECT_THAT(gone->notes, ElementsAre(absl::StrCat("process ", holder_.pid, " (watched by kwatch ",
                                                    getpid(), ") has exited")));
}

}  // namespace
}  // namespace kwatch::watch
