#include "drmgr/slot_allocator.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "drmgr/simulator.h"

namespace kwatch::drmgr {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

constexpr Scope kT1 = Scope::Thread(40, 41);
constexpr Scope kT2 = Scope::Thread(40, 42);
constexpr Scope kP = Scope::Process(40);

Chunk C(uint64_t addr, uint64_t len) {
  return Chunk{core::RemoteAddr{addr}, len};
}

SlotRequest Req(uint64_t addr, uint64_t len, DrKind kind = DrKind::kWrite, Scope scope = kT1,
                int priority = 10, ShortagePolicy policy = ShortagePolicy::kFail) {
  SlotRequest r;
  r.addr = core::RemoteAddr{addr};
  r.len = len;
  r.kind = kind;
  r.scope = scope;
  r.priority = priority;
  r.policy = policy;
  return r;
}

// An allocator whose every change list is applied to a simulator, which must accept it.
class AllocatorTest : public ::testing::Test {
 protected:
  Grant Ask(SlotRequest r, ClientId client = {}) {
    absl::StatusOr<Grant> g = alloc_.Request(client.value == 0 ? watch_ : client, std::move(r));
    EXPECT_TRUE(g.ok()) << g.status();
    if (!g.ok()) {
      return Grant{};
    }
    Apply(g->changes);
    return *std::move(g);
  }
  Changes Drop(RequestId id) {
    absl::StatusOr<Changes> c = alloc_.Release(id);
    EXPECT_TRUE(c.ok()) << c.status();
    Apply(c.value_or(Changes{}));
    return c.value_or(Changes{});
  }
  void Apply(const Changes& c) {
    absl::Status s = sim_.Apply(c);
    EXPECT_TRUE(s.ok()) << s;
  }
  RequestView View(RequestId id) {
    absl::StatusOr<RequestView> v = alloc_.Describe(id);
    EXPECT_TRUE(v.ok()) << v.status();
    return v.value_or(RequestView{});
  }
  static ScopeView ScopeOf(const AllocatorSnapshot& snap, const Scope& s) {
    for (const ScopeView& v : snap.scopes) {
      if (v.scope == s) {
        return v;
      }
    }
    ADD_FAILURE() << "no scope " << s.ToString();
    return ScopeView{};
  }
  std::vector<RequestId> Seen(uint64_t addr, uint64_t size, core::AccessKind kind, pid_t tid = 41) {
    return sim_.Simulate(Simulator::Access{core::RemoteAddr{addr}, size, kind, 40, tid, 0}).seen;
  }

  SlotAllocator alloc_;
  Simulator sim_;
  ClientId watch_ = alloc_.AddClient(ClientKind::kWatchpoint, "kwatch");
  ClientId gdb_ = alloc_.AddClient(ClientKind::kDebugger, "gdb");
};

TEST_F(AllocatorTest, OneAlignedWatchTakesSlotZero) {
  Grant g = Ask(Req(0x1000, 4));
  EXPECT_EQ(g.state, RequestState::kHardware);
  EXPECT_EQ(g.reason, "4 bytes at 0x1000: 1 exact 4-byte slot");
  ASSERT_THAT(g.changes.slots, SizeIs(1));
  const SlotChange& arm = g.changes.slots[0];
  EXPECT_EQ(arm.op, SlotChange::Op::kArm);
  EXPECT_EQ(arm.scope, kT1);
  EXPECT_EQ(arm.slot, 0);
  EXPECT_EQ(arm.chunk, C(0x1000, 4));
  EXPECT_EQ(arm.kind, DrKind::kWrite);
  EXPECT_EQ(arm.ToString(),
            "arm thread 41 of process 40 slot 0: 4 bytes at 0x1000 write (requests 1)");
  ASSERT_THAT(g.changes.requests, SizeIs(1));
  EXPECT_FALSE(g.changes.requests[0].from.has_value());
  EXPECT_EQ(sim_.RegistersOf(kT1).dr[0], 0x1000U);
  EXPECT_EQ(sim_.RegistersOf(kT1).dr7, 0x000D0401U);
  const AllocatorSnapshot snap = alloc_.Snapshot();
  const ScopeView t1 = ScopeOf(snap, kT1);
  EXPECT_EQ(t1.slots[0].state, SlotState::kArmed);
  EXPECT_THAT(t1.slots[0].holders, ElementsAre(g.id));
  EXPECT_EQ(t1.slots[1].state, SlotState::kFree);
  EXPECT_EQ(t1.free, 3);
}

TEST_F(AllocatorTest, StructIsSplitIntoChunks) {
  Grant g = Ask(Req(0x1000, 24));
  EXPECT_EQ(g.state, RequestState::kHardware);
  EXPECT_EQ(g.reason, "24 bytes at 0x1000: 3 exact 8-byte slots");
  const RequestView v = View(g.id);
  EXPECT_THAT(v.chunks, ElementsAre(C(0x1000, 8), C(0x1008, 8), C(0x1010, 8)));
  EXPECT_THAT(v.slots, ElementsAre(0, 1, 2));
  EXPECT_TRUE(v.exact);
  EXPECT_THAT(Seen(0x1017, 1, core::AccessKind::kWrite), ElementsAre(g.id));
  EXPECT_THAT(Seen(0x1018, 1, core::AccessKind::kWrite), IsEmpty());
  EXPECT_THAT(Seen(0x1000, 1, core::AccessKind::kRead), IsEmpty());
}

TEST_F(AllocatorTest, EqualChunksShareOneSlot) {
  Grant a = Ask(Req(0x1000, 8));
  Grant b = Ask(Req(0x1000, 8));
  EXPECT_EQ(b.state, RequestState::kHardware);
  ASSERT_THAT(b.changes.slots, SizeIs(1));
  EXPECT_EQ(b.changes.slots[0].op, SlotChange::Op::kUpdateHolders);
  EXPECT_TRUE(View(a.id).shared);
  EXPECT_TRUE(View(b.id).shared);
  EXPECT_EQ(ScopeOf(alloc_.Snapshot(), kT1).free, 3);
  EXPECT_THAT(Seen(0x1004, 2, core::AccessKind::kWrite), ElementsAre(a.id, b.id));
  Drop(a.id);
  EXPECT_FALSE(View(b.id).shared);
  EXPECT_THAT(Seen(0x1004, 2, core::AccessKind::kWrite), ElementsAre(b.id));
}

TEST_F(AllocatorTest, WriteAndReadWriteShareAReadWriteSlot) {
  Grant w = Ask(Req(0x1000, 8, DrKind::kWrite));
  Grant rw = Ask(Req(0x1000, 8, DrKind::kReadWrite));
  // The slot is re-armed read-write at the same index.
  ASSERT_THAT(rw.changes.slots, SizeIs(2));
  EXPECT_EQ(rw.changes.slots[0].op, SlotChange::Op::kDisarm);
  EXPECT_EQ(rw.changes.slots[1].op, SlotChange::Op::kArm);
  EXPECT_EQ(rw.changes.slots[1].slot, 0);
  EXPECT_EQ(rw.changes.slots[1].kind, DrKind::kReadWrite);
  EXPECT_TRUE(View(w.id).filter_reads);
  EXPECT_FALSE(View(rw.id).filter_reads);
  EXPECT_EQ(ScopeOf(alloc_.Snapshot(), kT1).slots[0].kind, DrKind::kReadWrite);
  // A read traps, but only the read-write holder sees it; a write reaches both.
  EXPECT_THAT(Seen(0x1000, 4, core::AccessKind::kRead), ElementsAre(rw.id));
  EXPECT_THAT(Seen(0x1000, 4, core::AccessKind::kWrite), ElementsAre(w.id, rw.id));
  Drop(rw.id);
  EXPECT_FALSE(View(w.id).filter_reads);
  EXPECT_EQ(sim_.RegistersOf(kT1).dr7, 0x00090401U);  // back to write, 8 bytes
}

TEST_F(AllocatorTest, ExecuteSharesOnlyWithExecute) {
  Grant x1 = Ask(Req(0x401000, 1, DrKind::kExec));
  Grant x2 = Ask(Req(0x401000, 1, DrKind::kExec));
  Grant w = Ask(Req(0x401000, 1, DrKind::kWrite));
  EXPECT_TRUE(View(x1.id).shared);
  EXPECT_FALSE(View(w.id).shared);
  EXPECT_EQ(ScopeOf(alloc_.Snapshot(), kT1).free, 2);
  EXPECT_THAT(Seen(0x401000, 1, core::AccessKind::kExec), ElementsAre(x1.id, x2.id));
  EXPECT_THAT(Seen(0x401000, 1, core::AccessKind::kWrite), ElementsAre(w.id));
}

TEST_F(AllocatorTest, WideCoverWhenShort) {
  Ask(Req(0x2000, 8));
  Ask(Req(0x3000, 8));
  Grant g = Ask(Req(0x1001, 12));
  EXPECT_EQ(g.state, RequestState::kHardware);
  EXPECT_EQ(g.reason,
            "12 bytes at 0x1001 need 5 slots, 2 free: watching 16 aligned bytes at 0x1000 in 2 "
            "slots, 4 bytes filtered in software");
  const RequestView v = View(g.id);
  EXPECT_FALSE(v.exact);
  EXPECT_EQ(v.bytes_filtered, 4U);
  // Bytes 0x1000 and 0x100d..0x100f trap in hardware but are filtered out.
  Simulator::Outcome out =
      sim_.Simulate({core::RemoteAddr{0x1000}, 1, core::AccessKind::kWrite, 40, 41, 0});
  EXPECT_THAT(out.trapped, SizeIs(1));
  EXPECT_THAT(out.seen, IsEmpty());
  EXPECT_THAT(Seen(0x1001, 1, core::AccessKind::kWrite), ElementsAre(g.id));
  EXPECT_THAT(Seen(0x100c, 1, core::AccessKind::kWrite), ElementsAre(g.id));
  EXPECT_THAT(Seen(0x100d, 1, core::AccessKind::kWrite), IsEmpty());
}

TEST_F(AllocatorTest, DebuggerPreemptsAndGivesBack) {
  std::vector<RequestId> ids;
  for (uint64_t i = 0; i < 4; ++i) {
    ids.push_back(
        Ask(Req(0x1000 + 8 * i, 8, DrKind::kWrite, kT1, 10, ShortagePolicy::kFallbackPages)).id);
  }
  const AllocatorSnapshot before = alloc_.Snapshot();
  Grant d = Ask(Req(0x5000, 8, DrKind::kReadWrite, kT1, DefaultPriority(ClientKind::kDebugger),
                    ShortagePolicy::kPreemptLower),
                gdb_);
  EXPECT_EQ(d.state, RequestState::kHardware);
  // The latest watch of the lowest priority gave its slot, and was told.
  const RequestView evicted = View(ids[3]);
  EXPECT_EQ(evicted.state, RequestState::kFallbackPages);
  EXPECT_THAT(evicted.reason, HasSubstr("request 5 (debugger 'gdb', priority 100)"));
  bool told = false;
  for (const RequestChange& rc : d.changes.requests) {
    if (rc.id == ids[3]) {
      told = rc.from == RequestState::kHardware && rc.to == RequestState::kFallbackPages &&
             rc.was_armed && !rc.armed;
    }
  }
  EXPECT_TRUE(told);
  const ScopeView t1 = ScopeOf(alloc_.Snapshot(), kT1);
  EXPECT_EQ(t1.slots[3].state, SlotState::kPreempted);
  EXPECT_THAT(t1.slots[3].holders, ElementsAre(d.id));
  EXPECT_THAT(t1.slots[3].displaced, ElementsAre(ids[3]));
  // The debugger leaves: the watch gets its slot back, everything as before.
  Changes back = Drop(d.id);
  EXPECT_EQ(View(ids[3]).state, RequestState::kHardware);
  EXPECT_EQ(alloc_.Snapshot(), before) << alloc_.Snapshot().ToString();
  ASSERT_THAT(back.slots, SizeIs(2));
  EXPECT_EQ(back.slots[1].slot, 3);
}

TEST_F(AllocatorTest, FailPolicyNeverTakesSlots) {
  for (uint64_t i = 0; i < 4; ++i) {
    Ask(Req(0x1000 + 8 * i, 8));
  }
  Grant g = Ask(Req(0x5000, 4));
  EXPECT_EQ(g.state, RequestState::kFailed);
  EXPECT_THAT(g.reason, HasSubstr("no free slot: 4 bytes at 0x5000 need 1 slot, 0 free"));
  EXPECT_THAT(g.reason, HasSubstr("held by request 1 (watchpoint 'kwatch', priority 10)"));
  EXPECT_THAT(g.changes.slots, IsEmpty());
  // Even with a higher priority, kFail does not evict anyone.
  Grant hi = Ask(Req(0x6000, 4, DrKind::kWrite, kT1, 50, ShortagePolicy::kFail));
  EXPECT_EQ(hi.state, RequestState::kFailed);
  EXPECT_THAT(hi.reason, HasSubstr("would take slots from request 4"));
  EXPECT_THAT(hi.changes.slots, IsEmpty());
  // Another thread has room.
  EXPECT_EQ(Ask(Req(0x5000, 4, DrKind::kWrite, kT2)).state, RequestState::kHardware);
}

TEST_F(AllocatorTest, PreemptedFailRequestWaitsAndReturns) {
  Grant w = Ask(Req(0x1000, 8, DrKind::kWrite, kT1, 10, ShortagePolicy::kFail));
  ASSERT_TRUE(alloc_.MarkExternallyHeld(kT1, 3).ok());  // nothing to apply: slot 0 stays
  Grant d = Ask(Req(0x2000, 8, DrKind::kWrite, kT1, 100, ShortagePolicy::kPreemptLower), gdb_);
  EXPECT_EQ(d.state, RequestState::kHardware);
  EXPECT_EQ(View(w.id).state, RequestState::kPreempted);
  EXPECT_THAT(View(w.id).reason, HasSubstr("waiting for a slot"));
  EXPECT_THAT(View(w.id).reason, HasSubstr("3 held outside kwatch"));
  Drop(d.id);
  EXPECT_EQ(View(w.id).state, RequestState::kHardware);
}

TEST_F(AllocatorTest, PreemptLowerWaitsBehindHigherPriority) {
  Grant d = Ask(Req(0x1000, 32, DrKind::kWrite, kT1, 100, ShortagePolicy::kPreemptLower), gdb_);
  Grant p = Ask(Req(0x2000, 8, DrKind::kWrite, kT1, 50, ShortagePolicy::kPreemptLower));
  EXPECT_EQ(p.state, RequestState::kPreempted);
  Drop(d.id);
  EXPECT_EQ(View(p.id).state, RequestState::kHardware);
}

TEST_F(AllocatorTest, MultiplexRotatesFairly) {
  SlotAllocator::Options opts;
  opts.rotate_interval = absl::Milliseconds(4);
  alloc_ = SlotAllocator(opts);
  watch_ = alloc_.AddClient(ClientKind::kWatchpoint, "kwatch");
  std::vector<RequestId> ids;
  for (uint64_t i = 0; i < 6; ++i) {
    ids.push_back(
        Ask(Req(0x1000 + 64 * i, 8, DrKind::kWrite, kT1, 10, ShortagePolicy::kMultiplex)).id);
  }
  int armed = 0;
  for (RequestId id : ids) {
    EXPECT_EQ(View(id).state, RequestState::kMultiplexed) << View(id).reason;
    armed += View(id).armed ? 1 : 0;
  }
  EXPECT_EQ(armed, 4);
  EXPECT_THAT(View(ids[5]).reason, HasSubstr("multiplexed, waiting for its turn with"));
  absl::Time t = absl::UnixEpoch();
  alloc_.AdvanceClock(t);
  for (int step = 0; step < 60; ++step) {
    t += absl::Milliseconds(4);
    Changes c = alloc_.Rotate(t);
    // One request out, one in.
    EXPECT_THAT(c.slots, SizeIs(2)) << step;
    Apply(c);
  }
  // 60 turns of 4 ms: each request was armed in 4 of every 6.
  double sum = 0;
  for (RequestId id : ids) {
    const RequestView v = View(id);
    EXPECT_NEAR(v.coverage(), 4.0 / 6.0, 1e-9) << id.value;
    EXPECT_EQ(v.time_enabled, absl::Milliseconds(240));
    EXPECT_EQ(v.time_armed, absl::Milliseconds(160));
    sum += v.coverage();
  }
  EXPECT_LE(sum, 4.0 + 1e-9);
  // Too early for the next turn: time is accounted, nothing moves.
  EXPECT_TRUE(alloc_.Rotate(t + absl::Milliseconds(1)).empty());
  EXPECT_EQ(View(ids[0]).time_enabled, absl::Milliseconds(241));
  const ScopeView t1 = ScopeOf(alloc_.Snapshot(), kT1);
  for (const SlotView& s : t1.slots) {
    EXPECT_EQ(s.state, SlotState::kMultiplexed);
  }
}

TEST_F(AllocatorTest, MultiplexWithoutPartnerWaits) {
  for (uint64_t i = 0; i < 4; ++i) {
    Ask(Req(0x1000 + 8 * i, 8, DrKind::kWrite, kT1, 10, ShortagePolicy::kFallbackPages));
  }
  Grant m = Ask(Req(0x2000, 8, DrKind::kWrite, kT1, 10, ShortagePolicy::kMultiplex));
  EXPECT_EQ(m.state, RequestState::kPreempted);
  EXPECT_THAT(m.reason, HasSubstr("no multiplexed request of priority 10 to take turns with"));
}

TEST_F(AllocatorTest, ExternalSlotsCount) {
  absl::StatusOr<Changes> c = alloc_.MarkExternallyHeld(kT1, 2);
  ASSERT_TRUE(c.ok());
  sim_.SetExternal(kT1, 2);
  Ask(Req(0x1000, 8));
  Ask(Req(0x1008, 8));
  Grant g = Ask(Req(0x1010, 8, DrKind::kWrite, kT1, 10, ShortagePolicy::kFallbackPages));
  EXPECT_EQ(g.state, RequestState::kFallbackPages);
  EXPECT_THAT(g.reason, HasSubstr("2 held outside kwatch"));
  const ScopeView t1 = ScopeOf(alloc_.Snapshot(), kT1);
  EXPECT_EQ(t1.external, 2);
  EXPECT_EQ(t1.slots[2].state, SlotState::kExternal);
  EXPECT_EQ(t1.slots[3].state, SlotState::kExternal);
  // The debugger lets one go: the page-protected watch moves into hardware.
  c = alloc_.MarkExternallyHeld(kT1, 1);
  ASSERT_TRUE(c.ok());
  sim_.SetExternal(kT1, 1);
  Apply(*c);
  EXPECT_EQ(View(g.id).state, RequestState::kHardware);
}

TEST_F(AllocatorTest, LearnsExternalSlotsFromNoSpace) {
  sim_.SetExternal(kT1, 2);  // a debugger the allocator does not know about
  Ask(Req(0x1000, 8));
  Ask(Req(0x1008, 8));
  absl::StatusOr<Grant> g = alloc_.Request(
      watch_, Req(0x1010, 8, DrKind::kWrite, kT1, 10, ShortagePolicy::kFallbackPages));
  ASSERT_TRUE(g.ok());
  absl::Status s = sim_.Apply(g->changes);
  ASSERT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("thread 41 of process 40"));
  // Learn one slot per refusal until the changes apply.
  int tries = 0;
  for (; !s.ok() && tries < 4; ++tries) {
    absl::StatusOr<Changes> c = alloc_.ReportNoSpace(kT1);
    ASSERT_TRUE(c.ok()) << c.status();
    s = sim_.Apply(*c);
  }
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(tries, 2);
  EXPECT_EQ(alloc_.ExternallyHeld(kT1), 2);
  EXPECT_EQ(View(g->id).state, RequestState::kFallbackPages);
  EXPECT_THAT(View(g->id).reason, HasSubstr("2 held outside kwatch"));
}

TEST_F(AllocatorTest, ProcessScopeSlotsCountInEveryThread) {
  Ask(Req(0x1000, 8, DrKind::kWrite, kP));
  Ask(Req(0x2000, 8, DrKind::kWrite, kT1));
  Ask(Req(0x2008, 8, DrKind::kWrite, kT1));
  Ask(Req(0x2010, 8, DrKind::kWrite, kT1));
  // Thread 41 is full (1 process slot + 3 own); thread 42 still has 3; the process none.
  EXPECT_EQ(Ask(Req(0x3000, 8, DrKind::kWrite, kT1)).state, RequestState::kFailed);
  EXPECT_EQ(Ask(Req(0x3000, 8, DrKind::kWrite, kT2)).state, RequestState::kHardware);
  EXPECT_EQ(Ask(Req(0x4000, 8, DrKind::kWrite, kP)).state, RequestState::kFailed);
  EXPECT_EQ(ScopeOf(alloc_.Snapshot(), kT2).free, 2);
  // A thread the allocator never heard of still carries the process slot.
  EXPECT_THAT(Seen(0x1000, 1, core::AccessKind::kWrite, /*tid=*/77), SizeIs(1));
  EXPECT_LE(sim_.MaxLoad(), 4);
}

TEST_F(AllocatorTest, CpuScopesCountAgainstTasks) {
  Ask(Req(0xffffffff81000000, 8, DrKind::kWrite, Scope::AllCpus()));
  Ask(Req(0xffffffff81000008, 8, DrKind::kWrite, Scope::Cpu(1)));
  // Every thread can run on CPU 1: 2 slots left for it.
  EXPECT_EQ(ScopeOf(alloc_.Snapshot(), Scope::AllCpus()).free, 2);
  Ask(Req(0x1000, 8, DrKind::kWrite, kT1));
  Ask(Req(0x1008, 8, DrKind::kWrite, kT1));
  EXPECT_EQ(Ask(Req(0x1010, 8, DrKind::kWrite, kT1)).state, RequestState::kFailed);
  // CPU 0 carries the all-CPU slot and the busiest thread's two: one left.
  EXPECT_EQ(Ask(Req(0xffffffff81000010, 8, DrKind::kWrite, Scope::Cpu(0))).state,
            RequestState::kHardware);
  EXPECT_EQ(Ask(Req(0xffffffff81000018, 8, DrKind::kWrite, Scope::Cpu(0))).state,
            RequestState::kFailed);
  EXPECT_LE(sim_.MaxLoad(), 4);
}

TEST_F(AllocatorTest, RangesThatNeverFit) {
  Grant g = Ask(Req(0x1000, 40));
  EXPECT_EQ(g.state, RequestState::kFailed);
  EXPECT_THAT(g.reason, HasSubstr("40 bytes at 0x1000 need 5 slots, 4 free"));
  EXPECT_THAT(g.reason, HasSubstr("fall back to page protection"));
  Grant p = Ask(Req(0x1000, 48, DrKind::kWrite, kT1, 10, ShortagePolicy::kFallbackPages));
  EXPECT_EQ(p.state, RequestState::kFallbackPages);
  EXPECT_EQ(ScopeOf(alloc_.Snapshot(), kT1).free, 4);
  // The largest request accepted: pages, without building 131072 chunks per decision.
  Grant big = Ask(
      Req(0x100000, kMaxRequestLen, DrKind::kReadWrite, kT1, 10, ShortagePolicy::kFallbackPages));
  EXPECT_EQ(big.state, RequestState::kFallbackPages);
  EXPECT_THAT(big.reason, HasSubstr("1048576 bytes at 0x100000 need 131072 slots"));
  for (int i = 0; i < 100; ++i) {
    Drop(Ask(Req(0x1000, 8)).id);
  }
}

TEST_F(AllocatorTest, BadInput) {
  const auto code = [&](SlotRequest r) { return alloc_.Request(watch_, std::move(r)).status(); };
  absl::Status s = code(Req(0x1000, 0));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("zero-length range at 0x1000"));
  s = code(Req(0x1000, kMaxRequestLen + 1));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("page protection"));
  EXPECT_EQ(code(Req(~uint64_t{0} - 3, 8)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(Req(0x1000, 8, DrKind::kExec)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(Req(0x1000, 8, DrKind::kWrite, Scope::Thread(40, 0))).code(),
            absl::StatusCode::kInvalidArgument);
  s = code(Req(0xffffffff81000000, 8, DrKind::kWrite, Scope::AllCpus(), 10,
               ShortagePolicy::kFallbackPages));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("kernel memory"));
  EXPECT_EQ(alloc_.Request(ClientId{99}, Req(0x1000, 8)).status().code(),
            absl::StatusCode::kNotFound);
  absl::StatusOr<Changes> r = alloc_.Release(RequestId{12345});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("no request 12345"));
  EXPECT_EQ(alloc_.MarkExternallyHeld(kT1, 5).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(alloc_.Describe(RequestId{7}).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(alloc_.RemoveClient(ClientId{99}).status().code(), absl::StatusCode::kNotFound);
  // Nothing was recorded.
  EXPECT_THAT(alloc_.Snapshot().requests, IsEmpty());
}

TEST_F(AllocatorTest, RemoveClientReleasesItsRequests) {
  Ask(Req(0x1000, 8), gdb_);
  Ask(Req(0x1008, 8), gdb_);
  Ask(Req(0x1010, 8));
  absl::StatusOr<Changes> c = alloc_.RemoveClient(gdb_);
  ASSERT_TRUE(c.ok());
  Apply(*c);
  EXPECT_THAT(c->slots, SizeIs(2));
  EXPECT_THAT(alloc_.Snapshot().requests, SizeIs(1));
}

TEST_F(AllocatorTest, SnapshotPrints) {
  Ask(Req(0x1000, 8));
  const std::string text = alloc_.Snapshot().ToString();
  EXPECT_THAT(text, HasSubstr("thread 41 of process 40: 3 free, 0 held outside kwatch"));
  EXPECT_THAT(text, HasSubstr("DR0 armed       8 bytes at 0x1000 write, requests 1"));
  EXPECT_THAT(text, HasSubstr("request 1 [watchpoint, priority 10, fail] hardware armed"));
}

}  // namespace
}  // namespace kwatch::drmgr
