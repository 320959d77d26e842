// For targets that kwatch attaches to (their --wait): prints "ready PID" on stdout, then waits
// for SIGUSR1 (kwatch attaches in between). SIGUSR1 stays blocked afterwards.
#ifndef KWATCH_TESTS_TARGETS_READY_WAIT_H_
#define KWATCH_TESTS_TARGETS_READY_WAIT_H_

#include <signal.h>
#include <stdio.h>
#include <unistd.h>

static volatile sig_atomic_t g_ready_go;

static void ReadyGo(int sig) {
  (void)sig;
  g_ready_go = 1;
}

static void ReadyAndWaitForUsr1(void) {
  sigset_t block;
  sigset_t old;
  sigemptyset(&block);
  sigaddset(&block, SIGUSR1);
  sigprocmask(SIG_BLOCK, &block, &old);
  signal(SIGUSR1, ReadyGo);
  printf("ready %d\n", (int)getpid());
  fflush(stdout);
  while (!g_ready_go) {
    sigsuspend(&old);
  }
}

#endif  // KWATCH_TESTS_TARGETS_READY_WAIT_H_
