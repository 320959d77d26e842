#pragma once

// What this build of kwatch is: the release (CMake's project version) and the git commit the
// sources were built from, as `--version` prints it and a recording keeps it.

#include <string>

namespace kwatch::version {

// "0.1.0": the release alone.
std::string Release();

// "0.1.0 (git 1a2b3c4d)", "0.1.0 (git 1a2b3c4d, dirty)" when the tree had changes the commit
// does not hold (tracked or untracked, not ignored), "0.1.0 (not built from a git checkout)".
// Taken at build time: a rebuild after a commit picks up the new one without a reconfigure.
std::string Full();

}  // namespace kwatch::version
