#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"

namespace kwatch::watch {

// What the kernel does with user memory inside system calls, as far as page-protection
// watches need to know (x86-64 numbers). Pure functions: no process is touched except
// through the `read` callback given.

// How a call uses a range of user memory.
enum class KernelUse : uint8_t {
  kRead,       // reads the bytes
  kWrite,      // writes them
  kReadWrite,  // both
  kPage,       // needs the page mapped and readable but uses no byte (a shared futex's key)
  kUnknown,    // an argument points here; what the kernel does there is not modelled
};

struct KernelRange {
  uint64_t addr = 0;
  uint64_t size = 0;
  KernelUse use = KernelUse::kUnknown;
};

// A buffer argument that kwatch may point at a scratch copy instead ("bounce buffer"): the
// kernel then never touches the protected page, and kwatch copies the bytes in before the
// call and out after it, as exact accesses.
struct Bounce {
  int arg = -1;       // index of the pointer argument (0..5)
  uint64_t size = 0;  // bytes of the buffer
  bool in = false;    // the kernel reads the buffer: copied to scratch before the call
  bool out = false;   // the kernel writes it: copied back after the call
  uint32_t unit = 1;  // out: bytes written = result x unit (read: 1, epoll_wait: 12);
                      // 0: the whole buffer when the call succeeds (poll)
};

struct SyscallModel {
  bool known = false;               // the call's use of memory is modelled; else `ranges` only hint
  bool lifecycle = false;           // clone, fork, exec, exit: never run alone with others stopped
  bool start_only = false;          // every access comes before the call may sleep (futex wait)
  std::vector<KernelRange> ranges;  // what the call may touch (known calls: all of it)
  // Ranges from this index on are data buffers (iovecs) filled or consumed in order, as
  // many bytes as the result says; -1: none. Those before it are used whole.
  int data_first = -1;
  std::optional<Bounce> bounce;  // ranges[0] when set
};

// Reads `out.size()` bytes of the target at `addr`; false when it cannot.
using ReadFn = absl::FunctionRef<bool(uint64_t addr, std::span<uint8_t> out)>;

// The model of call `nr` with `args` (iovec arrays and message headers are read through
// `read`). Calls not modelled: every argument as a kUnknown range (of the next argument's
// size when that is a small number, else one byte).
SyscallModel ModelSyscall(uint64_t nr, const std::array<uint64_t, 6>& args, ReadFn read);

// The bytes a finished call of a known model touched, given its raw result (-errno on
// failure): read() wrote `ret` bytes of its buffer, futex(FUTEX_WAIT) read the word...
// kPage ranges are left out (no byte is used). Empty for unknown calls.
std::vector<KernelRange> TouchedRanges(uint64_t nr, const SyscallModel& model, int64_t ret);

// Bytes the kernel wrote into a bounced buffer, given the call's raw result.
uint64_t BounceOutBytes(const Bounce& b, int64_t ret);

// Whether a raw result asks the kernel to restart the call (-ERESTARTSYS and kin): the call
// is not over, it runs again (or fails with EINTR) after a signal.
bool IsRestartResult(int64_t ret);

// "read", "futex"... or "syscall_512" for numbers this table does not know.
std::string SyscallName(uint64_t nr);

}  // namespace kwatch::watch
