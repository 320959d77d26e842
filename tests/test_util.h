#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kwatch::testing {

// Path of a fixture program built from tests/targets/NAME.c.
std::string TargetPath(const std::string& name);

// Path of the kwatch binary under test.
std::string KwatchPath();

// Output of a finished child process.
struct RunResult {
  int exit_code = -1;    // exit status, or 128+signal when killed
  std::string out;       // stdout
  std::string err;       // stderr
};

// Runs argv to completion (no shell), capturing stdout and stderr. Fails the test's
// expectations only through the returned status: spawn failures become errors.
absl::StatusOr<RunResult> Run(const std::vector<std::string>& argv, int timeout_s = 120);

// Whether kernel-feature tests may skip instead of failing (KWATCH_ALLOW_SKIP=1, never in CI).
bool AllowSkip();

}  // namespace kwatch::testing

// Fails (or skips, only when KWATCH_ALLOW_SKIP=1) with `why` when `cond` is false.
#define KW_REQUIRE_FEATURE(cond, why)                                 \
  do {                                                                \
    if (!(cond)) {                                                    \
      if (::kwatch::testing::AllowSkip()) GTEST_SKIP() << (why);      \
      FAIL() << "kernel feature missing: " << (why)                   \
             << " (set KWATCH_ALLOW_SKIP=1 to skip outside CI)";      \
    }                                                                 \
  } while (false)
