// SIGTRAPs of every legitimate origin, and forged spurious ones, for kwatch's trap filter.
//
// usage: sigtraps ROUNDS [--forge N]
//
// With a SIGTRAP handler installed, each round calls tick() (which writes g_counter) and then
// raises SIGTRAP four legitimate ways: raise() (SI_TKILL), kill() (SI_USER), an int3 it
// executes (SI_KERNEL) and an icebp/int1 it executes (TRAP_BRKPT after an 0xF1 byte). Each
// must reach the handler whether or not kwatch watches or probes the program. It prints
//   tkill=R user=R int3=R icebp=R other=0 counter=SUM
// With --forge N it then restores SIGTRAP's default action (death) and sends itself N
// signals exactly like the kernel's for a debug exception with no cause (SIGTRAP, si_code
// TRAP_BRKPT, not after an icebp): alone it dies of the first; under kwatch it must survive
// and print "survived N forged debug traps".
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

volatile long g_counter;
static volatile sig_atomic_t by_tkill, by_user, by_int3, by_icebp, other;

static void on_trap(int sig, siginfo_t* si, void* uc) {
  (void)sig;
  (void)uc;
  switch (si->si_code) {
    case SI_TKILL:
      ++by_tkill;
      break;
    case SI_USER:
      ++by_user;
      break;
    case SI_KERNEL:
      ++by_int3;
      break;
    case TRAP_BRKPT:
      ++by_icebp;
      break;
    default:
      ++other;
      break;
  }
}

__attribute__((noinline)) void tick(long i) { g_counter += i; }

int main(int argc, char** argv) {
  const long rounds = argc > 1 ? atol(argv[1]) : 5;
  const long forge = argc > 3 && strcmp(argv[2], "--forge") == 0 ? atol(argv[3]) : 0;
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_sigaction = on_trap;
  sa.sa_flags = SA_SIGINFO;
  sigaction(SIGTRAP, &sa, NULL);
  for (long i = 0; i < rounds; ++i) {
    tick(i + 1);
    raise(SIGTRAP);
    kill(getpid(), SIGTRAP);
    __asm__ volatile("int3");
    __asm__ volatile(".byte 0xf1");  // icebp (int1)
  }
  printf("tkill=%d user=%d int3=%d icebp=%d other=%d counter=%ld\n", (int)by_tkill, (int)by_user,
         (int)by_int3, (int)by_icebp, (int)other, g_counter);
  fflush(stdout);
  if (forge > 0) {
    signal(SIGTRAP, SIG_DFL);
    for (long i = 0; i < forge; ++i) {
      siginfo_t si;
      memset(&si, 0, sizeof(si));
      si.si_signo = SIGTRAP;
      si.si_code = TRAP_BRKPT;  // what the kernel sends for a #DB with no DR6 cause bits
      // A process may send itself a kernel si_code (only itself).
      if (syscall(SYS_rt_tgsigqueueinfo, getpid(), gettid(), SIGTRAP, &si) != 0) {
        perror("rt_tgsigqueueinfo");
        return 2;
      }
      tick(1);
    }
    printf("survived %ld forged debug traps\n", forge);
  }
  return 0;
}
