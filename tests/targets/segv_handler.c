// A program with its own SIGSEGV handler, as JVMs, Go and garbage collectors have, for page
// mode: the handler touches the page of a watched variable while SIGSEGV is blocked (the
// usual case inside a SIGSEGV handler), which makes the kernel reset the handler to SIG_DFL
// (force_sig_info_to_task) before kwatch sees the fault.
//   segv_handler FAULTS WRITES [--wait] [--resethand]
// Installs a SIGSEGV handler (SA_SIGINFO, no SA_NODEFER), then FAULTS times writes to its own
// PROT_NONE guard page (the handler counts the fault, bumps g_shared.watched, checks that
// SIGSEGV is still blocked, and makes the guard page writable; main protects it again), and
// WRITES times writes g_shared.watched. g_shared fills one page alone: the handler's counters
// share the watched variable's page, and nothing else does. Prints on stderr
//   "faults FAULTS seen N blocked B watched V"
// (N: faults the handler saw; B: of them, those after which SIGSEGV was still blocked in the
// handler once it had touched the watched page) and exits 0 when the handler saw every fault,
// 1 otherwise; a fault with no handler left kills it with SIGSEGV.
// --wait: installs the handler, prints "ready PID" and waits for SIGUSR1 before starting (for
// attach tests).
// --resethand: the handler is installed with SA_RESETHAND (for one fault) and installs itself
// again before it returns.
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ready_wait.h"

struct shared {
  volatile long watched;      // the watched variable: WRITES + FAULTS writes
  volatile long faults_seen;  // the handler's count, on the same page
  volatile long blocked;      // faults after which SIGSEGV was still blocked in the handler
  char rest[4096 - 3 * sizeof(long)];  // nothing else on the page
};
struct shared g_shared __attribute__((aligned(4096)));

static char* g_guard;
static struct sigaction g_action;
static int g_resethand;

static void OnSegv(int sig, siginfo_t* si, void* ctx) {
  (void)sig;
  (void)ctx;
  if ((char*)si->si_addr != g_guard) {
    _exit(3);  // not the guard page: a fault nobody expected
  }
  g_shared.faults_seen++;  // a write to the watched page with SIGSEGV blocked
  g_shared.watched++;
  sigset_t now;
  sigprocmask(SIG_BLOCK, NULL, &now);
  if (sigismember(&now, SIGSEGV)) {
    g_shared.blocked++;
  }
  mprotect(g_guard, 4096, PROT_READ | PROT_WRITE);
  if (g_resethand) {
    sigaction(SIGSEGV, &g_action, NULL);  // the kernel reset it at this delivery
  }
}


int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s FAULTS WRITES [--wait] [--resethand]\n", argv[0]);
    return 2;
  }
  const long faults = atol(argv[1]);
  const long writes = atol(argv[2]);
  int wait = 0;
  for (int i = 3; i < argc; ++i) {
    wait |= strcmp(argv[i], "--wait") == 0;
    g_resethand |= strcmp(argv[i], "--resethand") == 0;
  }
  g_guard = mmap(NULL, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (g_guard == MAP_FAILED) {
    perror("mmap");
    return 2;
  }
  g_action.sa_sigaction = OnSegv;
  g_action.sa_flags = SA_SIGINFO | (g_resethand ? SA_RESETHAND : 0);
  sigemptyset(&g_action.sa_mask);
  if (sigaction(SIGSEGV, &g_action, NULL) != 0) {
    perror("sigaction");
    return 2;
  }
  if (wait) {
    ReadyAndWaitForUsr1();
  }
  for (long i = 0; i < faults || i < writes; ++i) {
    if (i < writes) {
      g_shared.watched = g_shared.watched + 1;
    }
    if (i < faults) {
      g_guard[0] = 1;  // faults: the handler opens the page and the store runs again
      mprotect(g_guard, 4096, PROT_NONE);
    }
  }
  fprintf(stderr, "faults %ld seen %ld blocked %ld watched %ld\n", faults, g_shared.faults_seen,
          g_shared.blocked, g_shared.watched);
  return g_shared.faults_seen == faults ? 0 : 1;
}
