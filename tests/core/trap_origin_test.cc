#include "core/trap_origin.h"

#include <signal.h>

#include <gtest/gtest.h>

namespace kwatch::core {
namespace {

TrapOrigin Classify(int code, std::optional<uint8_t> before = std::nullopt, uint64_t dr6 = 0) {
  return ClassifySigtrap({.si_code = code, .byte_before_ip = before, .dr6 = dr6});
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
  for (TrapOrigin o : {TrapOrigin::kInt3, TrapOrigin::kIcebp, TrapOrigin::kSingleStep,
                       TrapOrigin::kHardwareBreakpoint, TrapOrigin::kPerfSigtrap,
                       TrapOrigin::kOther}) {
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
  EXPECT_EQ(Classify(TRAP_BRKPT, 0x05, 0), TrapOrigin::kSpurious);  // after a syscall
  EXPECT_EQ(Classify(TRAP_BRKPT, std::nullopt, 0), TrapOrigin::kSpurious);  // unreadable code
  EXPECT_FALSE(DeliverTrap(TrapOrigin::kSpurious));
  EXPECT_EQ(TrapOriginName(TrapOrigin::kSpurious), "spurious debug exception");
}

}  // namespace
}  // namespace kwatch::core
