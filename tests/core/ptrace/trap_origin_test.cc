#include "core/ptrace/trap_origin.h"

#include <signal.h>

#include <cstring>

#include <gtest/gtest.h>

namespace kwatch::core::ptrace {
namespace {

TrapOrigin Classify(int code, std::optional<uint8_t> before = std::nullopt, uint64_t dr6 = 0) {
  return ClassifySigtrap(
      {.si_code = code, .byte_before_ip = before, .byte_at_ip = std::nullopt, .dr6 = dr6});
}

TEST(TrapOrigin, SignalsSentByProcessesAreDelivered) {
  EXPECT_EQ(Classify(SI_USER), TrapOrigin::kSentByProcess);
  EXPECT_EQ(Classify(SI_TKILL), TrapOrigin::kSentByProcess);
  EXPECT_EQ(Classify(SI_QUEUE), TrapOrigin::kSentByProcess);
  EXPECT_TRUE(DeliverTrap(Classify(SI_USER)));
}

TEST(TrapOrigin, TheProgramsOwnInstructionsAreDelivered) {
  EXPECT_EQ(Classify(SI_KERNEL, 0xCC), TrapOrigin::kInt3);
  EXPECT_EQ(Classify(TRAP_BRKPT, 0xF1), TrapOrigin::kIcebp);
  EXPECT_EQ(Classify(TRAP_TRACE, 0x90, 1u << 14), TrapOrigin::kSingleStep);
  EXPECT_EQ(Classify(TRAP_HWBKPT, 0x89, 0x1), TrapOrigin::kHardwareBreakpoint);
  EXPECT_EQ(Classify(6), TrapOrigin::kPerfSigtrap);  // TRAP_PERF
  EXPECT_EQ(Classify(TRAP_BRANCH), TrapOrigin::kOther);
  for (TrapOrigin o :
       {TrapOrigin::kInt3, TrapOrigin::kIcebp, TrapOrigin::kSingleStep,
        TrapOrigin::kHardwareBreakpoint, TrapOrigin::kPerfSigtrap, TrapOrigin::kOther}) {
    EXPECT_TRUE(DeliverTrap(o)) << TrapOriginName(o);
  }
}

TEST(TrapOrigin, ABreakpointTrapWithCauseBitsIsAHardwareBreakpoint) {
  for (uint64_t bit : {0x1ULL, 0x2ULL, 0x4ULL, 0x8ULL, 1ULL << 13, 1ULL << 14, 1ULL << 15}) {
    EXPECT_EQ(Classify(TRAP_BRKPT, 0x89, 0xFFFF0FF0ULL | bit), TrapOrigin::kHardwareBreakpoint)
        << bit;
  }
}

TEST(TrapOrigin, ADebugExceptionWithNoCauseIsSpurious) {
  // DR6's reserved bits read as ones: 0xFFFF0FF0 has no cause bit.
  EXPECT_EQ(Classify(TRAP_BRKPT, 0x89, 0xFFFF0FF0ULL), TrapOrigin::kSpurious);
  EXPECT_EQ(Classify(TRAP_BRKPT, 0x05, 0), TrapOrigin::kSpurious);          // after a syscall
  EXPECT_EQ(Classify(TRAP_BRKPT, std::nullopt, 0), TrapOrigin::kSpurious);  // unreadable code
  EXPECT_FALSE(DeliverTrap(TrapOrigin::kSpurious));
  EXPECT_EQ(TrapOriginName(TrapOrigin::kSpurious), "spurious debug exception");
}

// Where the host reports icebp as a fault the 0xF1 byte is at the instruction pointer; the
// byte before it then proves nothing (an instruction may end in 0xF1: mov %esi,-0xf(%rcx)).
TEST(TrapOrigin, OnFaultHostsTheIcebpIsTheByteAtTheInstructionPointer) {
  TrapEvidence e{.si_code = TRAP_BRKPT, .byte_before_ip = 0x89, .byte_at_ip = 0xF1, .dr6 = 0};
  EXPECT_EQ(ClassifySigtrap(e, IcebpKind::kFault), TrapOrigin::kIcebp);
  EXPECT_EQ(ClassifySigtrap(e, IcebpKind::kTrap), TrapOrigin::kSpurious);
  e = {.si_code = TRAP_BRKPT, .byte_before_ip = 0xF1, .byte_at_ip = 0x90, .dr6 = 0};
  EXPECT_EQ(ClassifySigtrap(e, IcebpKind::kFault), TrapOrigin::kSpurious);
  EXPECT_EQ(ClassifySigtrap(e, IcebpKind::kTrap), TrapOrigin::kIcebp);
  // Where the host drops icebp, no breakpoint trap without cause bits is one.
  EXPECT_EQ(ClassifySigtrap(e, IcebpKind::kDropped), TrapOrigin::kSpurious);
  e.dr6 = 0x1;
  EXPECT_EQ(ClassifySigtrap(e, IcebpKind::kFault), TrapOrigin::kHardwareBreakpoint);
}

// The check this host answers (whichever it is) is stable and named.
TEST(TrapOrigin, TheHostsIcebpKindIsFoundAndCached) {
  const absl::StatusOr<IcebpKind> first = HostIcebpKind();
  ASSERT_TRUE(first.ok()) << first.status();
  const absl::StatusOr<IcebpKind> second = HostIcebpKind();
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(*first, *second);
  EXPECT_FALSE(IcebpKindName(*first).empty());
}

// kwatch's own breakpoints (perf events with sigtrap, watch/trap_breakpoints.h) carry its magic
// in their sig_data: a late one is absorbed, any other TRAP_PERF is the program's own.
TEST(TrapOrigin, PerfTrapsAreTheProgramsUnlessTheyCarryKwatchsData) {
  TrapEvidence e;
  e.si_code = kTrapPerf;
  e.perf_data = 0x1234;
  EXPECT_EQ(ClassifySigtrap(e), TrapOrigin::kPerfSigtrap);
  EXPECT_TRUE(DeliverTrap(ClassifySigtrap(e)));
  e.perf_data = kKwatchSigDataMagic | 0x2a;
  EXPECT_TRUE(IsKwatchSigData(e.perf_data));
  EXPECT_EQ(ClassifySigtrap(e), TrapOrigin::kKwatchBreakpoint);
  EXPECT_FALSE(DeliverTrap(TrapOrigin::kKwatchBreakpoint));
  EXPECT_FALSE(IsKwatchSigData(0x6b77617500000000ULL));
}

// The kernel puts sig_data at byte 24 of siginfo_t (_sigfault._perf._data on x86-64).
TEST(TrapOrigin, PerfDataIsReadWhereTheKernelPutsIt) {
  siginfo_t si{};
  si.si_signo = SIGTRAP;
  si.si_code = kTrapPerf;
  si.si_addr = reinterpret_cast<void*>(0x1000);
  const uint64_t data = kKwatchSigDataMagic | 7;
  std::memcpy(reinterpret_cast<char*>(&si) + 24, &data, sizeof(data));
  EXPECT_EQ(SiPerfData(si), data);
  EXPECT_EQ(si.si_addr, reinterpret_cast<void*>(0x1000));  // before it, untouched
}

}  // namespace
}  // namespace kwatch::core::ptrace
