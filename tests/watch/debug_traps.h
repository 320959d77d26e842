#pragma once

#include <gtest/gtest.h>

#include "tests/test_util.h"
#include "watch/hw_probe.h"

// For tests that need an armed hardware breakpoint to actually fire. Place it after the code
// that does not need delivered traps (opening the breakpoint, its ring, its count), so that
// this part still runs everywhere.
//  - traps are delivered: continue (and assert exact counts);
//  - the kernel refused the probe's breakpoint: fail, a missing kernel feature is a failure
//    (KW_REQUIRE_FEATURE; it skips only with KWATCH_ALLOW_SKIP=1, never in CI);
//  - the kernel accepted it but not one of the probe's writes trapped: the hypervisor is
//    proven not to deliver debug-register traps, so skip with the probe's explanation;
//  - some but not all writes trapped: fail, lost traps are a bug to look at.
#define KW_REQUIRE_DEBUG_TRAPS()                                                           \
  do {                                                                                     \
    const ::kwatch::watch::DebugTrapProbe& kw_probe_ = ::kwatch::watch::ProbeDebugTraps(); \
    if (!kw_probe_.delivered) {                                                            \
      KW_REQUIRE_FEATURE(kw_probe_.accepted, kw_probe_.detail);                            \
      if (kw_probe_.counted != 0) {                                                        \
        FAIL() << kw_probe_.detail;                                                        \
      }                                                                                    \
      GTEST_SKIP() << "hardware cannot deliver debug traps here: " << kw_probe_.detail;    \
    }                                                                                      \
  } while (false)
