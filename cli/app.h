#pragma once

namespace kwatch::cli {

// The `kwatch` command. Returns the process exit status: the launched command's status
// when it ran to its end, 0 after a clean stop, 1 on a kwatch error, 2 on a usage error.
int Main(int argc, char** argv);

}  // namespace kwatch::cli
