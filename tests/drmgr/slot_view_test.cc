// drmgr/slot_view.h: the `kwatch slots` view composed from published snapshots.
#include "drmgr/slot_view.h"

#include <cstdint>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "drmgr/slot_allocator.h"

namespace kwatch::drmgr {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

constexpr pid_t kPid = 100;
constexpr pid_t kTid = 101;

SlotRequest Req(uint64_t addr, uint64_t len, Scope scope, const std::string& label,
                ShortagePolicy policy = ShortagePolicy::kFail) {
  SlotRequest r;
  r.addr = core::RemoteAddr{addr};
  r.len = len;
  r.kind = DrKind::kWrite;
  r.scope = scope;
  r.policy = policy;
  r.label = label;
  return r;
}

// A session of kwatch process `kwatch_pid` that asked for `requests` in its own allocator.
PublishedSlots Session(pid_t kwatch_pid, const std::vector<SlotRequest>& requests) {
  SlotAllocator a;
  const ClientId c = a.AddClient(ClientKind::kWatchpoint, "kwatch");
  for (const SlotRequest& r : requests) {
    EXPECT_TRUE(a.Request(c, r).ok()) << r.label;
  }
  PublishedSlots p;
  p.kwatch_pid = kwatch_pid;
  p.target = requests.empty() ? 0 : requests[0].scope.pid;
  p.command_line = "kwatch";
  p.snapshot = a.Snapshot();
  return p;
}

std::vector<int> Drs(const ThreadSlots& t) {
  std::vector<int> out;
  out.reserve(t.rows.size());
  for (const SlotRow& r : t.rows) {
    out.push_back(r.dr);
  }
  return out;
}

std::vector<SlotState> States(const std::vector<SlotRow>& rows) {
  std::vector<SlotState> out;
  out.reserve(rows.size());
  for (const SlotRow& r : rows) {
    out.push_back(r.state);
  }
  return out;
}

TEST(SlotViewTest, KwatchExternalAndFree) {
  const std::vector<PublishedSlots> sessions = {Session(
      7,
      {Req(0x1000, 8, Scope::Process(kPid), "g_a"), Req(0x2000, 4, Scope::Process(kPid), "g_b")})};
  std::vector<std::string> notes;
  // The kernel says one slot is free: two are kwatch's, one is someone else's.
  const ThreadSlots t = ComposeThreadSlots(kPid, kTid, 1, sessions, notes);
  EXPECT_THAT(notes, IsEmpty());
  EXPECT_EQ(t.tid, kTid);
  EXPECT_EQ(t.free, 1);
  EXPECT_EQ(t.kwatch, 2);
  EXPECT_EQ(t.external, 1);
  EXPECT_THAT(Drs(t), ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(States(t.rows), ElementsAre(SlotState::kArmed, SlotState::kArmed, SlotState::kFree,
                                          SlotState::kExternal));
  EXPECT_THAT(t.rows[0].labels, ElementsAre("g_a"));
  EXPECT_EQ(t.rows[0].kwatch_pid, 7);
  EXPECT_EQ(t.rows[0].chunk.addr.value, 0x1000U);
  EXPECT_EQ(t.rows[0].chunk.len, 8U);
  EXPECT_THAT(t.rows[1].labels, ElementsAre("g_b"));
  EXPECT_EQ(t.rows[1].chunk.len, 4U);
  EXPECT_THAT(t.rows[2].requests, IsEmpty());
  EXPECT_THAT(t.rows[3].requests, IsEmpty());
  // Another process's thread shows none of them.
  const ThreadSlots other = ComposeThreadSlots(kPid + 1, kTid, 4, sessions, notes);
  EXPECT_EQ(other.kwatch, 0);
  EXPECT_THAT(States(other.rows),
              ElementsAre(SlotState::kFree, SlotState::kFree, SlotState::kFree, SlotState::kFree));
}

TEST(SlotViewTest, AStalePublicationIsANote) {
  const std::vector<PublishedSlots> sessions = {Session(
      7,
      {Req(0x1000, 8, Scope::Process(kPid), "g_a"), Req(0x2000, 8, Scope::Process(kPid), "g_b")})};
  std::vector<std::string> notes;
  const ThreadSlots t = ComposeThreadSlots(kPid, kTid, 4, sessions, notes);
  EXPECT_THAT(notes, ElementsAre("thread 101: kwatch sessions published 2 slots but the kernel "
                                 "shows 0 in use (a session is changing its slots, or its last "
                                 "publication is out of date)"));
  EXPECT_EQ(t.external, 0);
  EXPECT_THAT(States(t.rows), ElementsAre(SlotState::kArmed, SlotState::kArmed, SlotState::kFree,
                                          SlotState::kFree));
}

TEST(SlotViewTest, ProcessWideFirstThenThreadsOwnThenBeyondFour) {
  // Session 7 holds DR0-DR2 process-wide; session 8's thread slot also says DR0 (its own
  // allocator): it moves to DR3. Session 9's is a fifth: shown last, as DR -1.
  const std::vector<PublishedSlots> sessions = {
      Session(8, {Req(0x5000, 8, Scope::Thread(kPid, kTid), "t")}),
      Session(7,
              {Req(0x1000, 8, Scope::Process(kPid), "a"), Req(0x2000, 8, Scope::Process(kPid), "b"),
               Req(0x3000, 8, Scope::Process(kPid), "c")}),
      Session(9, {Req(0x6000, 8, Scope::Thread(kPid, kTid), "u")})};
  std::vector<std::string> notes;
  const ThreadSlots t = ComposeThreadSlots(kPid, kTid, 0, sessions, notes);
  EXPECT_EQ(t.kwatch, 5);
  EXPECT_EQ(t.external, 0);
  ASSERT_EQ(notes.size(), 1U);  // five published, four in use
  EXPECT_THAT(Drs(t), ElementsAre(0, 1, 2, 3, -1));
  EXPECT_THAT(t.rows[0].labels, ElementsAre("a"));
  EXPECT_THAT(t.rows[2].labels, ElementsAre("c"));
  EXPECT_THAT(t.rows[3].labels, ElementsAre("t"));
  EXPECT_EQ(t.rows[3].kwatch_pid, 8);
  EXPECT_THAT(t.rows[4].labels, ElementsAre("u"));
}

TEST(SlotViewTest, RequestsNotInHardware) {
  const std::vector<PublishedSlots> sessions = {Session(
      7, {Req(0x1000, 8, Scope::Process(kPid), "a"), Req(0x2000, 8, Scope::Process(kPid), "b"),
          Req(0x3000, 8, Scope::Process(kPid), "c"), Req(0x4000, 8, Scope::Process(kPid), "d"),
          Req(0x5000, 8, Scope::Process(kPid), "e", ShortagePolicy::kFallbackPages),
          Req(0x6000, 8, Scope::Process(kPid), "f")})};
  const std::vector<WaitingRequest> waiting = NotInHardware(kPid, sessions);
  ASSERT_EQ(waiting.size(), 2U);
  EXPECT_EQ(waiting[0].kwatch_pid, 7);
  EXPECT_EQ(waiting[0].view.request.label, "e");
  EXPECT_EQ(waiting[0].view.state, RequestState::kFallbackPages);
  EXPECT_EQ(waiting[1].view.request.label, "f");
  EXPECT_EQ(waiting[1].view.state, RequestState::kFailed);
  EXPECT_THAT(NotInHardware(kPid + 1, sessions), IsEmpty());
  EXPECT_EQ(RequestLabel(sessions[0].snapshot, waiting[1].view.id), "f");
  EXPECT_EQ(RequestLabel(sessions[0].snapshot, RequestId{999}), "request 999");
}

TEST(SlotViewTest, KernelSessionsPerCpu) {
  SlotAllocator a;
  const ClientId c = a.AddClient(ClientKind::kWatchpoint, "kwatch");
  for (const int cpu : {0, 1}) {
    SlotRequest r = Req(0xffffffff82000000ULL, 8, Scope::Cpu(cpu), "jiffies");
    ASSERT_TRUE(a.Request(c, r).ok());
  }
  ASSERT_TRUE(a.MarkExternallyHeld(Scope::Cpu(1), 1).ok());
  PublishedSlots s;
  s.kwatch_pid = 7;
  s.snapshot = a.Snapshot();
  const std::vector<CpuSlots> cpus = KernelCpuSlots(s);
  ASSERT_EQ(cpus.size(), 2U);
  EXPECT_EQ(cpus[0].cpu, 0);
  EXPECT_EQ(cpus[0].kwatch, 1);
  EXPECT_EQ(cpus[0].external, 0);
  EXPECT_EQ(cpus[0].free, 3);
  EXPECT_EQ(cpus[1].cpu, 1);
  EXPECT_EQ(cpus[1].kwatch, 1);
  EXPECT_EQ(cpus[1].external, 1);
  EXPECT_EQ(cpus[1].free, 2);
  ASSERT_EQ(cpus[1].rows.size(), 4U);
  EXPECT_EQ(cpus[1].rows[0].dr, 0);
  EXPECT_THAT(cpus[1].rows[0].labels, ElementsAre("jiffies"));
  EXPECT_EQ(cpus[1].rows[0].kwatch_pid, 7);
  EXPECT_EQ(cpus[1].rows[0].chunk.addr.value, 0xffffffff82000000ULL);
  EXPECT_THAT(States(cpus[1].rows), ElementsAre(SlotState::kArmed, SlotState::kFree,
                                                SlotState::kFree, SlotState::kExternal));
}

}  // namespace
}  // namespace kwatch::drmgr
