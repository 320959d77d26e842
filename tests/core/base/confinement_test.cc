#include "core/base/confinement.h"

#include <linux/capability.h>

#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace kwatch::core {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;

// /proc/self/status of a process with capabilities `cap_eff` (hex) and seccomp mode `mode`.
std::string Status(const std::string& cap_eff, int mode) {
  return "Name:\tkwatch\nUid:\t0\t0\t0\t0\nCapInh:\t0000000000000000\nCapEff:\t" + cap_eff +
         "\nNoNewPrivs:\t0\nSeccomp:\t" + std::to_string(mode) + "\nSeccomp_filters:\t0\n";
}

TEST(Confinement, RootWithEveryCapabilityAndNoFilterIsNotConfined) {
  EXPECT_THAT(ConfinementAdviceFor(Status("000001ffffffffff", 0), 0, CAP_SYS_PTRACE, "SYS_PTRACE"),
              IsEmpty());
  EXPECT_THAT(ConfinementAdviceFor(Status("000001ffffffffff", 0), 0, CAP_PERFMON, "PERFMON"),
              IsEmpty());
}

TEST(Confinement, ADockerDefaultRootNamesTheCapabilityAndTheFilter) {
  // Docker's default set: chown dac_override fowner fsetid kill setgid setuid setpcap
  // net_bind_service net_raw sys_chroot mknod audit_write setfcap; its seccomp profile.
  const std::string docker = Status("00000000a80425fb", 2);
  const std::string ptrace = ConfinementAdviceFor(docker, 0, CAP_SYS_PTRACE, "SYS_PTRACE");
  EXPECT_THAT(ptrace, HasSubstr("kwatch runs as root without CAP_SYS_PTRACE (a container runtime "
                                "drops it: `docker run --cap-add SYS_PTRACE`"));
  EXPECT_THAT(ptrace, HasSubstr("kwatch runs under a seccomp filter"));
  EXPECT_THAT(ptrace, HasSubstr("`--security-opt seccomp=unconfined`"));
  EXPECT_THAT(ConfinementAdviceFor(docker, 0, CAP_PERFMON, "PERFMON"),
              HasSubstr("without CAP_PERFMON (a container runtime drops it: `docker run "
                        "--cap-add PERFMON`"));
}

TEST(Confinement, SysAdminServesForPerfmonAndAnOrdinaryUserIsNotToldAboutContainers) {
  EXPECT_THAT(ConfinementAdviceFor(Status("0000000000200000", 0), 0, CAP_PERFMON, "PERFMON"),
              IsEmpty());  // CAP_SYS_ADMIN (bit 21) alone
  EXPECT_THAT(
      ConfinementAdviceFor(Status("0000000000000000", 0), 1000, CAP_SYS_PTRACE, "SYS_PTRACE"),
      IsEmpty());  // the sysctl and capability advice of the caller applies
}

}  // namespace
}  // namespace kwatch::core
