#pragma once

// Raw system calls and the few kernel structures the agent uses without libc: the hit paths,
// the signal handlers and the watchdog thread (which has no TLS of its own) call only these.
// Each returns the kernel's value: >= 0, or -errno.

#include <sys/syscall.h>

#include <cstddef>
#include <cstdint>

namespace kwatch::agent {

inline long Sys6(long n, long a1, long a2, long a3, long a4, long a5, long a6) {
  long ret = 0;
  register long r10 asm("r10") = a4;
  register long r8 asm("r8") = a5;
  register long r9 asm("r9") = a6;
  asm volatile("syscall"
               : "=a"(ret)
               : "a"(n), "D"(a1), "S"(a2), "d"(a3), "r"(r10), "r"(r8), "r"(r9)
               : "rcx", "r11", "memory");
  return ret;
}
inline long Sys(long n, long a1 = 0, long a2 = 0, long a3 = 0, long a4 = 0, long a5 = 0) {
  return Sys6(n, a1, a2, a3, a4, a5, 0);
}
template <typename T>
inline long Arg(T* p) {
  return reinterpret_cast<long>(p);
}

// The kernel's struct sigaction on x86-64 (not glibc's: its mask is 8 bytes).
struct KSigaction {
  uint64_t handler;
  uint64_t flags;
  uint64_t restorer;
  uint64_t mask;
};
inline constexpr long kSigsetBytes = 8;
inline constexpr uint64_t SigBit(int sig) {
  return uint64_t{1} << (sig - 1);
}

inline long SysGettid() {
  return Sys(SYS_gettid);
}
inline long SysGetpid() {
  return Sys(SYS_getpid);
}
inline long SysRtSigaction(int sig, const KSigaction* act, KSigaction* old) {
  return Sys(SYS_rt_sigaction, sig, Arg(act), Arg(old), kSigsetBytes);
}
inline long SysRtSigprocmask(int how, const uint64_t* set, uint64_t* old) {
  return Sys(SYS_rt_sigprocmask, how, Arg(set), Arg(old), kSigsetBytes);
}

}  // namespace kwatch::agent
