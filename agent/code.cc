// Writing code inside the target, the restore of the patch journal, and the watchdog thread
// (docs/agent.md "Dying"). Raw system calls only: the watchdog runs this code with no TLS of
// its own and every signal blocked.

#include <fcntl.h>
#include <linux/membarrier.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>

#include <array>
#include <cerrno>
#include <cstdint>

#include "agent/agent.h"
#include "agent/sys.h"

namespace kwatch::agent {

namespace {

constexpr size_t kPage = 4096;
constexpr size_t kWatchdogRegion = size_t{64} * 1024;  // guard page, block, stack

// The watchdog's memory: a guard page, then this block (a TCB of its own: fs points here, so
// that nothing of another thread's TLS is reachable from it), then its stack up to the end.
struct WatchdogBlock {
  std::array<uint64_t, 8> tcb;  // tcb[0] and tcb[2] point to the block, as glibc's TCB does
  Session* session;
  uint64_t region;
  uint64_t region_size;
};

void WatchdogMain(void* arg) {
  auto* block = static_cast<WatchdogBlock*>(arg);
  Session& s = *block->session;
  const int fd = s.lifeline_fd.load(std::memory_order_acquire);
  for (;;) {
    char c = 0;
    const long r = Sys(SYS_read, fd, Arg(&c), 1);
    if (r > 0 || r == -EINTR) {
      continue;
    }
    break;  // EOF: every write end is closed, kwatch is gone (or done)
  }
  KwControl& ctl = *s.ctl;
  uint32_t state = ctl.state.load(std::memory_order_acquire);
  const bool restoring =
      state < kKwStateRestoring &&
      ctl.state.compare_exchange_strong(state, kKwStateRestoring, std::memory_order_acq_rel);
  const uint32_t n = RestoreJournal(s);
  DisableCallSlots(s);  // per-call watches armed when kwatch died take no more samples
  if (n != 0) {
    ctl.restored_by_agent.fetch_add(n, std::memory_order_relaxed);
  }
  if (restoring || state == kKwStateRestoring) {
    ctl.state.store(kKwStateRestored, std::memory_order_release);
  }
  CloseLifeline(s);
  kw_unmap_and_exit(reinterpret_cast<void*>(block->region), block->region_size);
}

}  // namespace

int NoteLifeline(Session& s, int fd) {
  struct stat st {};
  if (const long r = Sys(SYS_fstat, fd, Arg(&st)); r < 0) {
    return static_cast<int>(r);
  }
  if (!S_ISFIFO(st.st_mode)) {
    return -EBADF;
  }
  s.lifeline_dev = st.st_dev;
  s.lifeline_ino = st.st_ino;
  s.lifeline_fd.store(fd, std::memory_order_release);
  return 0;
}

void CloseLifeline(Session& s) {
  const int fd = s.lifeline_fd.exchange(-1, std::memory_order_acq_rel);
  if (fd < 0) {
    return;
  }
  struct stat st {};
  if (Sys(SYS_fstat, fd, Arg(&st)) == 0 && st.st_dev == s.lifeline_dev &&
      st.st_ino == s.lifeline_ino) {
    Sys(SYS_close, fd);
  }
}

int RegisterSyncCore() {
  const long cmds = Sys(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0);
  if (cmds < 0) {
    return static_cast<int>(cmds);
  }
  if ((cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE) == 0) {
    return -ENOSYS;
  }
  return static_cast<int>(
      Sys(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_SYNC_CORE, 0));
}

void SyncCore() {
  Sys(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE, 0);
}

int WriteCode(uint64_t addr, const uint8_t* bytes, size_t n) {
  constexpr const char* kMem = "/proc/thread-self/mem";
  const long fd = Sys(SYS_openat, AT_FDCWD, Arg(kMem), O_RDWR | O_CLOEXEC);
  if (fd >= 0) {
    const long r = Sys(SYS_pwrite64, fd, Arg(bytes), static_cast<long>(n), static_cast<long>(addr));
    Sys(SYS_close, fd);
    if (r == static_cast<long>(n)) {
      return 0;
    }
  }
  // No /proc (a chroot, a mount namespace): make the pages writable for the write, then give
  // them back the text's usual r-x.
  const uint64_t first = addr & ~(kPage - 1);
  const uint64_t end = (addr + n + kPage - 1) & ~(kPage - 1);
  const long r = Sys(SYS_mprotect, static_cast<long>(first), static_cast<long>(end - first),
                     PROT_READ | PROT_WRITE | PROT_EXEC);
  if (r < 0) {
    return static_cast<int>(r);
  }
  auto* dst = reinterpret_cast<volatile uint8_t*>(addr);
  for (size_t i = 0; i < n; ++i) {
    dst[i] = bytes[i];
  }
  Sys(SYS_mprotect, static_cast<long>(first), static_cast<long>(end - first),
      PROT_READ | PROT_EXEC);
  return 0;
}

// NOLINTNEXTLINE(readability-non-const-parameter): the system call writes `bytes`
int ReadCode(uint64_t addr, uint8_t* bytes, size_t n) {
  iovec local{bytes, n};
  iovec remote{reinterpret_cast<void*>(addr), n};
  const long r = Sys6(SYS_process_vm_readv, SysGetpid(), Arg(&local), 1, Arg(&remote), 1, 0);
  if (r < 0) {
    return static_cast<int>(r);
  }
  return r == static_cast<long>(n) ? 0 : -EFAULT;
}

uint32_t RestoreJournal(const Session& s) {
  uint32_t restored = 0;
  for (uint32_t i = 0; i < s.patch_capacity; ++i) {
    const KwPatch& p = s.patches[i];
    const uint32_t state = p.state.load(std::memory_order_acquire);
    if (state == kKwPatchFree) {
      continue;
    }
    const uint32_t len = state == kKwPatchInt3 ? 1 : p.len;
    if (len == 0 || len > sizeof(p.original)) {
      continue;
    }
    std::array<uint8_t, sizeof(p.original)> now{};
    if (ReadCode(p.addr, now.data(), len) != 0) {
      continue;  // no longer mapped
    }
    bool original = true;
    bool ours = now[0] == 0xCC || now[0] == p.original[0] || now[0] == p.patched[0];
    for (uint32_t k = 0; k < len; ++k) {
      original = original && now[k] == p.original[k];
      if (k > 0) {
        ours = ours && (now[k] == p.original[k] || now[k] == p.patched[k]);
      }
    }
    if (original || !ours) {
      continue;  // already back, or someone else's code is there now
    }
    if (len == 1) {
      WriteCode(p.addr, p.original.data(), 1);
      SyncCore();
    } else {
      if (now[0] != 0xCC) {
        const uint8_t int3 = 0xCC;
        WriteCode(p.addr, &int3, 1);
        SyncCore();
      }
      WriteCode(p.addr + 1, p.original.data() + 1, len - 1);
      SyncCore();
      WriteCode(p.addr, p.original.data(), 1);
      SyncCore();
    }
    ++restored;
  }
  return restored;
}

int PatchCode(uint64_t addr, const uint8_t* patch, size_t n) {
  if (n == 0) {
    return 0;
  }
  if (n > 1) {
    uint8_t first = 0;
    if (const int r = ReadCode(addr, &first, 1); r != 0) {
      return r;
    }
    const uint8_t int3 = 0xCC;
    if (const int r = WriteCode(addr, &int3, 1); r != 0) {
      return r;
    }
    SyncCore();
    if (const int r = WriteCode(addr + 1, patch + 1, n - 1); r != 0) {
      WriteCode(addr, &first, 1);
      SyncCore();
      return r;
    }
    SyncCore();
  }
  const int r = WriteCode(addr, patch, 1);
  SyncCore();
  return r;
}

int StartWatchdog(Session& s, bool publish_tid) {
  const long m = Sys6(SYS_mmap, 0, kWatchdogRegion, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
  if (m < 0 && m > -4096) {
    return static_cast<int>(m);
  }
  Sys(SYS_mprotect, m, kPage, PROT_NONE);  // a guard below the block
  auto* block = reinterpret_cast<WatchdogBlock*>(m + kPage);
  block->tcb[0] = reinterpret_cast<uint64_t>(block);
  block->tcb[2] = reinterpret_cast<uint64_t>(block);
  block->session = &s;
  block->region = static_cast<uint64_t>(m);
  block->region_size = kWatchdogRegion;
  void* stack_top = reinterpret_cast<void*>(m + kWatchdogRegion);
  constexpr unsigned long kFlags = CLONE_VM | CLONE_FS | CLONE_FILES | CLONE_SIGHAND |
                                   CLONE_THREAD | CLONE_SYSVSEM | CLONE_SETTLS;
  // The new thread starts with every signal blocked (it inherits this thread's mask), so no
  // signal of the program is ever delivered to it.
  const uint64_t all = ~uint64_t{0};
  uint64_t saved = 0;
  SysRtSigprocmask(SIG_BLOCK, &all, &saved);
  const long tid = kw_clone_thread(kFlags, stack_top, block, &WatchdogMain, block);
  SysRtSigprocmask(SIG_SETMASK, &saved, nullptr);
  if (tid < 0) {
    Sys(SYS_munmap, m, kWatchdogRegion);
    return static_cast<int>(tid);
  }
  if (publish_tid) {
    s.ctl->watchdog_tid = static_cast<int32_t>(tid);
  }
  return 0;
}

}  // namespace kwatch::agent
