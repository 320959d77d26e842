#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/kernel/kernel_symbols.h"
#include "core/symbols/symbols.h"
#include "watch/perf_ring.h"

namespace kwatch::watch::kernel {

// One frame of a kernel event's callchain, named for people.
struct KernelFrame {
  uint64_t ip = 0;
  bool user = false;  // a frame of the task's user code
  std::string site;   // "vfs_read+0x9c (fs/read_write.c:482)", "main+0x1a (prog.c:12)", "0x..."
};

// The frames of a callchain: kernel frames as `symbols` describes them (func+off, file:line
// with a vmlinux), then the task's user frames, by `user_syms` when given ("func+0xOFF
// (file.c:LINE)", the file's base name; --kernel-accesses knows the process) and as addresses
// otherwise (kernel watches' tasks are anyone's), or outside any known function.
std::vector<KernelFrame> KernelFrames(core::kernel::KernelSymbolResolver& symbols,
                                      const core::symbols::Symbols* user_syms,
                                      const PerfCallchain& chain);

}  // namespace kwatch::watch::kernel
