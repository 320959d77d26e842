#include "drmgr/simulator.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace kwatch::drmgr {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Pair;

constexpr Scope kT = Scope::Thread(40, 41);

SlotChange Arm(Scope scope, int slot, uint64_t addr, uint64_t len, DrKind kind,
               uint64_t holder = 1) {
  return SlotChange{SlotChange::Op::kArm,
                    scope,
                    slot,
                    Chunk{core::RemoteAddr{addr}, len},
                    kind,
                    {SlotHolder{RequestId{holder}, core::RemoteAddr{addr}, len, kind}}};
}

Changes Of(std::vector<SlotChange> slots) {
  return Changes{std::move(slots), {}};
}

Simulator::Access At(uint64_t addr, uint64_t size, core::AccessKind kind, pid_t pid = 40,
                     pid_t tid = 41, int cpu = 0) {
  return Simulator::Access{core::RemoteAddr{addr}, size, kind, pid, tid, cpu};
}

TEST(Simulator, ArmsRegisters) {
  Simulator sim;
  ASSERT_TRUE(sim.Apply(Of({Arm(kT, 0, 0x1000, 4, DrKind::kWrite),
                            Arm(kT, 2, 0x2000, 1, DrKind::kReadWrite)}))
                  .ok());
  const Simulator::Registers regs = sim.RegistersOf(kT);
  EXPECT_EQ(regs.dr[0], 0x1000U);
  EXPECT_EQ(regs.dr[2], 0x2000U);
  EXPECT_EQ(regs.dr7, 0x030D0411U);
  EXPECT_THAT(sim.ArmedScopes(), ElementsAre(kT));
  EXPECT_EQ(sim.MaxLoad(), 2);
}

TEST(Simulator, RefusesAFifthSlotAndChangesNothing) {
  Simulator sim;
  ASSERT_TRUE(
      sim.Apply(Of({Arm(kT, 0, 0x1000, 8, DrKind::kWrite), Arm(kT, 1, 0x1008, 8, DrKind::kWrite),
                    Arm(kT, 2, 0x1010, 8, DrKind::kWrite)}))
          .ok());
  const Simulator::Registers before = sim.RegistersOf(kT);
  // The process slot lands on thread 41 too: five.
  absl::Status s = sim.Apply(Of({Arm(kT, 3, 0x1018, 8, DrKind::kWrite),
                                 Arm(Scope::Process(40), 0, 0x3000, 8, DrKind::kWrite)}));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s.message()), HasSubstr("thread 41 of process 40"));
  EXPECT_EQ(sim.RegistersOf(kT), before);
  EXPECT_EQ(sim.RegistersOf(Scope::Process(40)), Simulator::Registers{});
  // Another process's thread is fine.
  EXPECT_TRUE(sim.Apply(Of({Arm(Scope::Process(50), 0, 0x3000, 8, DrKind::kWrite)})).ok());
  // External holders count.
  sim.SetExternal(kT, 1);
  EXPECT_EQ(sim.Apply(Of({Arm(kT, 3, 0x1018, 8, DrKind::kWrite)})).code(),
            absl::StatusCode::kResourceExhausted);
}

TEST(Simulator, CpuSlotsCountOnEveryThread) {
  Simulator sim;
  ASSERT_TRUE(sim.Apply(Of({Arm(Scope::AllCpus(), 0, 0x1000, 8, DrKind::kWrite),
                            Arm(Scope::Cpu(1), 0, 0x2000, 8, DrKind::kWrite),
                            Arm(Scope::Cpu(1), 1, 0x2008, 8, DrKind::kWrite),
                            Arm(kT, 0, 0x3000, 8, DrKind::kWrite)}))
                  .ok());
  EXPECT_EQ(sim.MaxLoad(), 4);
  EXPECT_EQ(sim.Apply(Of({Arm(Scope::Thread(60, 61), 0, 0x3000, 8, DrKind::kWrite),
                          Arm(Scope::Thread(60, 61), 1, 0x3008, 8, DrKind::kWrite)}))
                .code(),
            absl::StatusCode::kResourceExhausted);
}

TEST(Simulator, RefusesInconsistentChanges) {
  Simulator sim;
  ASSERT_TRUE(sim.Apply(Of({Arm(kT, 0, 0x1000, 8, DrKind::kWrite)})).ok());
  EXPECT_EQ(sim.Apply(Of({Arm(kT, 0, 0x2000, 8, DrKind::kWrite)})).code(),
            absl::StatusCode::kFailedPrecondition);
  SlotChange disarm{SlotChange::Op::kDisarm, kT, 0, Chunk{core::RemoteAddr{0x1000}, 4},
                    DrKind::kWrite,          {}};
  EXPECT_EQ(sim.Apply(Of({disarm})).code(), absl::StatusCode::kFailedPrecondition);
  disarm.chunk.len = 8;
  EXPECT_TRUE(sim.Apply(Of({disarm})).ok());
  EXPECT_THAT(sim.ArmedScopes(), IsEmpty());
  EXPECT_EQ(sim.Apply(Of({Arm(kT, 0, 0x1004, 8, DrKind::kWrite)})).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(sim.Apply(Of({Arm(kT, 4, 0x1000, 8, DrKind::kWrite)})).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(Simulator, MatchesLikeTheHardware) {
  Simulator sim;
  ASSERT_TRUE(sim.Apply(Of({Arm(kT, 0, 0x1000, 4, DrKind::kWrite, 1),
                            Arm(kT, 1, 0x2000, 8, DrKind::kReadWrite, 2),
                            Arm(kT, 3, 0x401000, 1, DrKind::kExec, 3)}))
                  .ok());
  // A write that overlaps the last byte of slot 0.
  Simulator::Outcome o = sim.Simulate(At(0x0ffe, 4, core::AccessKind::kWrite));
  EXPECT_THAT(o.trapped, ElementsAre(Pair(kT, 0)));
  EXPECT_THAT(o.dr6, ElementsAre(Pair(kT, 0xFFFF0FF1U)));
  EXPECT_THAT(o.seen, ElementsAre(RequestId{1}));
  // Reads do not trip a write slot; they trip a read-write one.
  EXPECT_THAT(sim.Simulate(At(0x1000, 4, core::AccessKind::kRead)).trapped, IsEmpty());
  o = sim.Simulate(At(0x2007, 1, core::AccessKind::kRead));
  EXPECT_THAT(o.dr6, ElementsAre(Pair(kT, 0xFFFF0FF2U)));
  // Execute matches the exact address only; data slots never match a fetch.
  EXPECT_THAT(sim.Simulate(At(0x401000, 1, core::AccessKind::kExec)).seen,
              ElementsAre(RequestId{3}));
  EXPECT_THAT(sim.Simulate(At(0x401001, 1, core::AccessKind::kExec)).trapped, IsEmpty());
  EXPECT_THAT(sim.Simulate(At(0x2000, 1, core::AccessKind::kExec)).trapped, IsEmpty());
  EXPECT_THAT(sim.Simulate(At(0x401000, 1, core::AccessKind::kWrite)).trapped, IsEmpty());
  // Another thread does not carry thread 41's registers.
  EXPECT_THAT(sim.Simulate(At(0x1000, 4, core::AccessKind::kWrite, 40, 42)).trapped, IsEmpty());
}

TEST(Simulator, ScopesApplyToTheirThreads) {
  Simulator sim;
  ASSERT_TRUE(sim.Apply(Of({Arm(Scope::Process(40), 0, 0x1000, 8, DrKind::kWrite, 1),
                            Arm(Scope::Cpu(1), 0, 0x1000, 8, DrKind::kWrite, 2)}))
                  .ok());
  EXPECT_THAT(sim.Simulate(At(0x1000, 1, core::AccessKind::kWrite, 40, 99, 0)).seen,
              ElementsAre(RequestId{1}));
  EXPECT_THAT(sim.Simulate(At(0x1000, 1, core::AccessKind::kWrite, 40, 99, 1)).seen,
              ElementsAre(RequestId{1}, RequestId{2}));
  EXPECT_THAT(sim.Simulate(At(0x1000, 1, core::AccessKind::kWrite, 70, 71, 1)).seen,
              ElementsAre(RequestId{2}));
}

TEST(Simulator, FiltersHoldersInSoftware) {
  Simulator sim;
  // A read-write slot shared by a write-only holder and a read-write holder of 2 bytes.
  SlotChange arm{SlotChange::Op::kArm,
                 kT,
                 0,
                 Chunk{core::RemoteAddr{0x1000}, 8},
                 DrKind::kReadWrite,
                 {SlotHolder{RequestId{1}, core::RemoteAddr{0x1000}, 8, DrKind::kWrite},
                  SlotHolder{RequestId{2}, core::RemoteAddr{0x1002}, 2, DrKind::kReadWrite}}};
  ASSERT_TRUE(sim.Apply(Of({arm})).ok());
  EXPECT_THAT(sim.Simulate(At(0x1003, 1, core::AccessKind::kRead)).seen, ElementsAre(RequestId{2}));
  EXPECT_THAT(sim.Simulate(At(0x1003, 1, core::AccessKind::kWrite)).seen,
              ElementsAre(RequestId{1}, RequestId{2}));
  Simulator::Outcome o = sim.Simulate(At(0x1006, 1, core::AccessKind::kRead));
  EXPECT_THAT(o.trapped, ElementsAre(Pair(kT, 0)));  // a trap nobody wants
  EXPECT_THAT(o.seen, IsEmpty());
}

}  // namespace
}  // namespace kwatch::drmgr
