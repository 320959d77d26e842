#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/kernel/kernel_symbols.h"
#include "core/ptrace/process.h"
#include "core/symbols/symbols.h"
#include "drmgr/debug_regs.h"
#include "watch/kernel/drain_values.h"
#include "watch/kernel/kernel_event.h"
#include "watch/kernel/kernel_slots.h"

namespace kwatch::watch::kernel {

// What a kernel session is set up from (the command's options).
struct KernelSetupOptions {
  std::vector<std::string> exprs;
  drmgr::DrKind kind = drmgr::DrKind::kWrite;
  std::optional<uint64_t> len;    // --len
  std::string type;               // --type: the C type of a watched kernel symbol
  std::string via;                // --via FUNC[+OFF]: the accessor of a watched kernel variable
  uint16_t callchain_frames = 0;  // --stack: frames per callchain (0: none)
  std::string system_map;         // --system-map
  std::string vmlinux;            // --vmlinux
  std::string kcore;              // --kcore ("": /proc/kcore)
  bool values_needed = true;      // events are shown or recorded (else no kernel memory read)
  // --kernel-accesses: the process (attached, or launched with `launch`).
  std::optional<pid_t> pid;
  std::vector<std::string> command;
  core::ptrace::LaunchOptions launch;
};

// A kernel session's pieces, armed and ready for KernelWatchSession::Create.
struct KernelSetup {
  // --kernel-accesses: the process and its symbols (null for kernel watches). Declared first:
  // the slots opened on the process's threads are destroyed before it.
  std::unique_ptr<core::ptrace::Process> proc;
  std::unique_ptr<core::symbols::Symbols> user_syms;
  std::vector<KernelWatch> watches;
  drmgr::DrKind kind = drmgr::DrKind::kWrite;
  std::string armed;  // "armed 1 kernel watch on 4 CPUs (one breakpoint per CPU), ..."
  std::unique_ptr<core::kernel::KernelSymbolResolver> symbols;
  std::unique_ptr<KernelSlots> slots;
  std::unique_ptr<DrainValues> values;  // kernel watches: values at drain time, else null
};

// Receives what the user should hear while a session is set up, one line without the
// "kwatch: " prefix and without a newline ("note: ...", "warning: ...", or plain facts such as
// "jiffies: 8 bytes at 0x..., from /proc/kallsyms").
using SetupSay = std::function<void(const std::string& line)>;

// The note that watch `i`'s value cannot be read (said once per watch; also by the session).
std::string ValueUnreadableNote(size_t i, const KernelWatch& w, const absl::Status& why);

// Kernel watches (no process): checks the capability, resolves each expression among kernel
// symbols (kallsyms, System.map, vmlinux; BTF for types), has drmgr place them on every online
// CPU's registers and arms them, opens kernel memory for drain-time values and the kernel's
// line tables when a vmlinux with DWARF is at hand, saying each finding through `say`.
absl::StatusOr<KernelSetup> SetUpKernelWatches(const KernelSetupOptions& opts, const SetupSay& say);

// --kernel-accesses: attaches to or launches the process, resolves each expression in its
// memory, and arms breakpoints that see only the kernel's accesses (exclude_user) on every
// thread, inherited by new ones. On error a launched target is killed and an attached one
// detached. The caller blocks the session's signals before (SIGCHLD of the launch).
absl::StatusOr<KernelSetup> SetUpKernelAccesses(const KernelSetupOptions& opts,
                                                const SetupSay& say);

}  // namespace kwatch::watch::kernel
