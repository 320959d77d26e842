// SIGTRAPs of every legitimate origin, and forged spurious ones, for kwatch's trap filter.
//
// usage: sigtraps ROUNDS [--forge N]
//        sigtraps --icebp-kind
//
// With a SIGTRAP handler installed, each round calls tick() (which writes g_counter) and then
// raises SIGTRAP four legitimate ways: raise() (SI_TKILL), kill() (SI_USER), an int3 it
// executes (SI_KERNEL) and an icebp/int1 it executes (TRAP_BRKPT). Each must reach the
// handler whether or not kwatch watches or probes the program. It prints
//   tkill=R user=R int3=R icebp=R other=0 counter=SUM
// Hosts differ on the icebp: most report it after the instruction; some hypervisors report
// it as a fault, with the instruction pointer on the 0xF1 byte, so the handler steps over
// it (as a program must on such a host, or it runs the icebp forever); some drop it
// (icebp=0). --icebp-kind prints which this host does, seen from the handler:
//   icebp: trap | icebp: fault | icebp: dropped
// --bare-icebp executes one icebp with no handler: it dies of SIGTRAP on hosts that report
// it, and prints "no trap" where the host drops it.
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
#include <ucontext.h>
#include <unistd.h>

volatile long g_counter;
static volatile sig_atomic_t by_tkill, by_user, by_int3, by_icebp, other, icebp_fault;

static void on_trap(int sig, siginfo_t* si, void* uc) {
  (void)sig;
  if (si->si_code == TRAP_BRKPT) {
    greg_t* rip = &((ucontext_t*)uc)->uc_mcontext.gregs[REG_RIP];
    if (*(const unsigned char*)*rip == 0xf1) {  // reported as a fault: step over it
      ++icebp_fault;
      ++*rip;
    }
  }
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
  if (argc > 1 && strcmp(argv[1], "--bare-icebp") == 0) {
    alarm(2);
    tick(1);
    __asm__ volatile(".byte 0xf1");
    printf("no trap\n");
    return 0;
  }
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_sigaction = on_trap;
  sa.sa_flags = SA_SIGINFO;
  sigaction(SIGTRAP, &sa, NULL);
  if (argc > 1 && strcmp(argv[1], "--icebp-kind") == 0) {
    alarm(2);  // a host that loops some other way must not hang the caller
    __asm__ volatile(".byte 0xf1");
    printf("icebp: %s\n", by_icebp == 0 ? "dropped" : icebp_fault ? "fault" : "trap");
    return 0;
  }
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
