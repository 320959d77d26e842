// watch/kernel/capability.h: who may open kernel breakpoint events.
#include "watch/kernel/capability.h"

#include <unistd.h>

#include <gtest/gtest.h>

namespace kwatch::watch::kernel {
namespace {

TEST(CapabilityTest, CapEffBits) {
  // CAP_SYS_ADMIN is bit 21, CAP_PERFMON bit 38.
  EXPECT_TRUE(
      CapEffAllowsKernelEvents("Name:\tkwatch\nCapInh:\t0000000000000000\n"
                               "CapEff:\t0000000000200000\nCapBnd:\t000001ffffffffff\n"));
  EXPECT_TRUE(CapEffAllowsKernelEvents("CapEff:\t0000004000000000\n"));
  EXPECT_TRUE(CapEffAllowsKernelEvents("CapEff:\t000001ffffffffff\n"));
  // CAP_SYSLOG (34) and CAP_SYS_RAWIO (17) alone are not enough.
  EXPECT_FALSE(CapEffAllowsKernelEvents("CapEff:\t0000000400020000\n"));
  EXPECT_FALSE(CapEffAllowsKernelEvents("CapEff:\t0000000000000000\n"));
  // Only the effective set counts.
  EXPECT_FALSE(CapEffAllowsKernelEvents("CapPrm:\t000001ffffffffff\nCapEff:\t0\n"));
  EXPECT_FALSE(CapEffAllowsKernelEvents("Name:\tkwatch\n"));
  EXPECT_FALSE(CapEffAllowsKernelEvents("CapEff:\tnot hex\n"));
  EXPECT_FALSE(CapEffAllowsKernelEvents(""));
}

TEST(CapabilityTest, RootMay) {
  // The tests run as root (docs/design.md: this machine).
  ASSERT_EQ(geteuid(), 0U) << "the kernel-watch tests run as root";
  EXPECT_TRUE(HasPerfmonCapability());
}

}  // namespace
}  // namespace kwatch::watch::kernel
