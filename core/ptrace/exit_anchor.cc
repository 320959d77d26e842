#include "core/ptrace/exit_anchor.h"

#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "absl/synchronization/mutex.h"
#include "core/base/syscall_status.h"

namespace kwatch::core::ptrace {

namespace {

// Code that runs in the anchor (and the short-lived process that makes it) shares kwatch's
// memory and starts with a thread pointer of its own: no library calls, no sanitizer or
// stack-protector instrumentation (both read thread-local state), raw system calls only.
// NOLINTNEXTLINE(cppcoreguidelines-macro-usage): one attribute list for five functions
#define KW_ANCHOR_CODE \
  __attribute__((noinline, no_stack_protector, no_sanitize("address", "undefined")))

constexpr size_t kStackBytes = size_t{16} * 1024;
constexpr size_t kTlsBytes = 512;  // a thread pointer's block: self pointer, canary slot

// Shared between kwatch and the processes it clones (same memory).
struct AnchorParams {
  int pidfd = -1;
  long anchor = 0;  // the anchor's pid, or -errno; written by the middle process (__atomic_*)
  uintptr_t anchor_stack_top = 0;
  uintptr_t anchor_tls = 0;
  int ready = 0;  // set (and futex-woken) by the anchor once it is set up
};

KW_ANCHOR_CODE long RawSyscall(long nr, long a1 = 0, long a2 = 0, long a3 = 0, long a4 = 0,
                               long a5 = 0) {
  long ret = 0;
  register long r10 __asm__("r10") = a4;
  register long r8 __asm__("r8") = a5;
  __asm__ volatile("syscall"
                   : "=a"(ret)
                   : "a"(nr), "D"(a1), "S"(a2), "d"(a3), "r"(r10), "r"(r8)
                   : "rcx", "r11", "memory");
  return ret;
}

// clone(flags) onto `stack_top` with thread pointer `tls`; the child calls fn(arg), which
// must end with an exit system call. Returns the child's pid or -errno (in the caller).
KW_ANCHOR_CODE long CloneRunning(unsigned long flags, uintptr_t stack_top, uintptr_t tls,
                                 void (*fn)(AnchorParams*), AnchorParams* arg) {
  long ret = 0;
  register long r10 __asm__("r10") = 0;  // child_tid
  register uintptr_t r8 __asm__("r8") = tls;
  register void (*r12)(AnchorParams*) __asm__("r12") = fn;  // kept by the child: the kernel
  register AnchorParams* r13 __asm__("r13") = arg;          // copies every register but rax, rsp
  __asm__ volatile(
      "syscall\n\t"
      "test %%rax, %%rax\n\t"
      "jnz 1f\n\t"
      "xor %%ebp, %%ebp\n\t"
      "mov %%r13, %%rdi\n\t"
      "call *%%r12\n\t"
      "ud2\n"
      "1:\n\t"
      : "=a"(ret)
      : "a"(SYS_clone), "D"(flags), "S"(stack_top), "d"(0L), "r"(r10), "r"(r8), "r"(r12), "r"(r13)
      : "rcx", "r11", "memory");
  return ret;
}

[[noreturn]] KW_ANCHOR_CODE void RawExit(long code) {
  for (;;) {
    RawSyscall(SYS_exit, code);
  }
}

// The anchor: holds kwatch's address space until kwatch is gone, then frees it.
[[noreturn]] KW_ANCHOR_CODE void AnchorMain(AnchorParams* p) {
  const int pidfd = p->pidfd;
  // Every signal blocked, glibc's own too (kwatch's pthread_sigmask around the clone keeps
  // those): only kwatch's end wakes the anchor, and no handler of kwatch's runs in it.
  unsigned long all = ~0UL;
  RawSyscall(SYS_rt_sigprocmask, SIG_SETMASK, reinterpret_cast<long>(&all), 0, sizeof(all));
  RawSyscall(SYS_setsid);
  if (pidfd > 0) {
    RawSyscall(SYS_close_range, 0, pidfd - 1, 0);
  }
  RawSyscall(SYS_close_range, pidfd + 1, ~0U, 0);
  RawSyscall(SYS_prctl, PR_SET_NAME, reinterpret_cast<long>("kwatch-anchor"));
  __atomic_store_n(&p->ready, 1, __ATOMIC_RELEASE);
  RawSyscall(SYS_futex, reinterpret_cast<long>(&p->ready), FUTEX_WAKE, 1);
  struct pollfd pfd = {pidfd, POLLIN, 0};
  while (RawSyscall(SYS_ppoll, reinterpret_cast<long>(&pfd), 1, 0, 0, 0) == -EINTR) {
  }
  RawSyscall(SYS_setpriority, PRIO_PROCESS, 0, 19);
  RawExit(0);
}

// The middle process: clones the anchor and exits, so that the anchor is reparented away
// from kwatch (to init or a subreaper) and kwatch has no lasting child to wait for.
[[noreturn]] KW_ANCHOR_CODE void MiddleMain(AnchorParams* p) {
  const long pid = CloneRunning(CLONE_VM | CLONE_SETTLS | SIGCHLD, p->anchor_stack_top,
                                p->anchor_tls, AnchorMain, p);
  __atomic_store_n(&p->anchor, pid, __ATOMIC_RELEASE);  // no call (std::atomic is one at -O0)
  RawExit(0);
}

// A thread-pointer block whose first word points to itself, as x86-64 TLS expects.
uintptr_t MakeTls(char* block) {
  auto self = reinterpret_cast<uintptr_t>(block);
  *reinterpret_cast<uintptr_t*>(block) = self;
  return self;
}

absl::StatusOr<pid_t> Start() {
  const long pidfd = ::syscall(SYS_pidfd_open, ::getpid(), 0U);
  if (pidfd < 0) {
    const int err = errno;
    return SyscallError(err, "pidfd_open(kwatch)");
  }
  // Never unmapped: the anchor runs on it after kwatch's end (64 KiB, once per process).
  const size_t bytes = 2 * (kStackBytes + kTlsBytes) + sizeof(AnchorParams) + 64;
  void* mem = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) {
    const int err = errno;
    ::close(static_cast<int>(pidfd));
    return SyscallError(err, "mmap(exit anchor)");
  }
  char* base = static_cast<char*>(mem);
  auto* params = new (base) AnchorParams();
  char* middle_tls = base + 64 + sizeof(AnchorParams);
  char* anchor_tls = middle_tls + kTlsBytes;
  char* middle_stack = anchor_tls + kTlsBytes;
  char* anchor_stack = middle_stack + kStackBytes;
  auto top = [](const char* stack) {
    return (reinterpret_cast<uintptr_t>(stack) + kStackBytes - 64) & ~uintptr_t{15};
  };
  params->pidfd = static_cast<int>(pidfd);
  params->anchor = -EINPROGRESS;
  params->anchor_stack_top = top(anchor_stack);
  params->anchor_tls = MakeTls(anchor_tls);

  sigset_t all;
  sigset_t old;
  ::sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &old);
  // Exit signal 0: kwatch gets no SIGCHLD for the middle process (it waits for it below).
  const long middle = CloneRunning(CLONE_VM | CLONE_SETTLS, top(middle_stack), MakeTls(middle_tls),
                                   MiddleMain, params);
  ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
  if (middle < 0) {
    ::close(static_cast<int>(pidfd));
    return SyscallError(static_cast<int>(-middle), "clone(exit anchor)");
  }
  int status = 0;
  pid_t r = 0;
  do {
    r = ::waitpid(static_cast<pid_t>(middle), &status, __WALL);
  } while (r < 0 && errno == EINTR);
  // ECHILD: another thread's waitpid(-1) reaped it; the middle is gone either way.
  const long anchor = __atomic_load_n(&params->anchor, __ATOMIC_ACQUIRE);
  if (anchor < 0) {
    ::close(static_cast<int>(pidfd));
    return SyscallError(static_cast<int>(-anchor), "clone(exit anchor)");
  }
  // Wait (1 s at most) for the anchor to be set up: named, its copies of kwatch's files
  // closed, so that it keeps none of them alive once it is said to run.
  const timespec step{0, 10'000'000};
  for (int i = 0; i < 100 && __atomic_load_n(&params->ready, __ATOMIC_ACQUIRE) == 0; ++i) {
    ::syscall(SYS_futex, &params->ready, FUTEX_WAIT, 0, &step, nullptr, 0);
  }
  ::close(static_cast<int>(pidfd));
  return static_cast<pid_t>(anchor);
}

}  // namespace

absl::StatusOr<pid_t> StartExitAnchor() {
  // Per process: a fork of kwatch that starts sessions of its own needs an anchor of its own.
  static absl::Mutex mu;
  static pid_t owner = 0;
  static absl::StatusOr<pid_t>* started = nullptr;
  absl::MutexLock lock(&mu);
  if (started == nullptr || owner != ::getpid()) {
    delete started;
    started = new absl::StatusOr<pid_t>(Start());
    owner = ::getpid();
    if (!started->ok() && std::getenv("KWATCH_DEBUG") != nullptr) {
      std::fprintf(stderr, "kwatch-debug: no exit anchor: %s\n",
                   started->status().ToString().c_str());
    }
  }
  return *started;
}

}  // namespace kwatch::core::ptrace
