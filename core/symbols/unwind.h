#pragma once

#include <sys/types.h>
#include <sys/user.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/base/remote_addr.h"
#include "core/symbols/symbols.h"

struct Dwfl;

namespace kwatch::core::symbols {

class ProcessElfFinder;  // process_elf.h

// Backtraces of threads that kwatch holds stopped (ptrace), unwound with libdw from the
// thread's registers and the CFI (.eh_frame, or .debug_frame) of the modules mapped in the
// process. Needs no attach of its own: memory is read through the MemoryReader it is given.
//
// Owns a Dwfl with the process's modules (dwfl_linux_proc_report at creation and at each
// Refresh) and libdw's per-module CFI caches, so that an unwind costs only the stack reads.
// Not thread-safe; not movable (libdw holds a pointer to it).
class Unwinder {
 public:
  // `read` (for example Process::ReadMemory) must stay valid for the Unwinder's lifetime.
  // Errors: reading /proc/PID/maps (errno), libdw's own (with dwfl_errmsg).
  static absl::StatusOr<std::unique_ptr<Unwinder>> ForProcess(pid_t pid, MemoryReader read);

  ~Unwinder();
  Unwinder(const Unwinder&) = delete;
  Unwinder& operator=(const Unwinder&) = delete;
  Unwinder(Unwinder&&) = delete;
  Unwinder& operator=(Unwinder&&) = delete;

  // Reports the process's modules again: call after the target mapped code (dlopen, mmap of
  // an executable file) or exec'd. On error the previous modules stay in use.
  absl::Status Refresh();

  // The stack of thread `tid`, stopped with registers `regs` (PTRACE_GETREGS): absolute
  // code addresses, innermost first, at most `max_frames`. Frame 0 is regs.rip; every later
  // frame is a return address, so look it up at address - 1 to name the calling function
  // and line (the call may be the caller's last instruction).
  // The trace ends where the CFI says the stack ends (_start, clone), or at the first frame
  // that cannot be unwound (no CFI, unreadable stack): the frames found until then are
  // returned. Errors only when not even frame 0 is known (libdw's message).
  absl::StatusOr<std::vector<RemoteAddr>> Unwind(pid_t tid, const user_regs_struct& regs,
                                                 size_t max_frames = 64);

  // Calls to the MemoryReader so far (each reads a 4 KiB stack page, or 8 bytes).
  uint64_t memory_reads() const { return memory_reads_; }

  // libdw's callbacks (Dwfl_Thread_Callbacks), public for the C trampolines in unwind.cc.
  pid_t NextThread(void** thread_arg);
  bool GetThread(pid_t tid) const;
  bool ReadWord(uint64_t addr, uint64_t* out);
  bool SetInitialRegisters(void* thread);

 private:
  struct DwflDeleter {
    void operator()(Dwfl* dwfl) const;
  };
  using DwflHandle = std::unique_ptr<Dwfl, DwflDeleter>;

  // A page of the stack read during the current Unwind.
  static constexpr size_t kPageSize = 4096;
  static constexpr size_t kCachedPages = 4;
  struct Page {
    uint64_t base = 0;
    bool valid = false;
    std::array<uint8_t, kPageSize> bytes{};
  };

  Unwinder(pid_t pid, MemoryReader read);
  // A new Dwfl with the process's modules (their files found by `finder`, which must outlive
  // it), attached to this Unwinder's thread callbacks.
  absl::StatusOr<DwflHandle> Report(ProcessElfFinder& finder);

  pid_t pid_;
  MemoryReader read_;
  std::unique_ptr<ProcessElfFinder> finder_;  // dwfl_'s: outlives it
  DwflHandle dwfl_;
  uint64_t memory_reads_ = 0;

  // The thread being unwound (valid during Unwind only).
  pid_t tid_ = 0;
  const user_regs_struct* regs_ = nullptr;
  bool thread_listed_ = false;
  std::array<Page, kCachedPages> pages_{};
  size_t next_page_ = 0;     // round-robin replacement
  absl::Status read_error_;  // the last failed read, for the error message
};

}  // namespace kwatch::core::symbols
