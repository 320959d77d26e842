// A target that keeps hitting kwatch's breakpoints while kwatch is killed (issue 9).
//
// usage: kill_target THREADS N USEC GOFILE [traps]
//
// Prints "ready" and waits for GOFILE to exist (60 s at most), so that kwatch can attach and
// arm first. Then THREADS threads each call kill_tick(i) for i = 0..N-1 (kill_tick writes
// g_val), sleeping USEC microseconds between calls (0: a tight loop). It prints
// "done calls=C sum=S" (C = THREADS * N, S the sum of kill_tick's results) and exits 0: the
// output and status of a run nobody watched.
//
// With `traps` it catches SIGTRAP instead of dying of it, and then also prints
// "traps=K" (the SIGTRAPs it received).
//
// With `fork` (after `traps` if both), it forks once GOFILE exists, before starting its
// threads: the child runs the same loop, prints "child done calls=C sum=S traps=K" and exits
// 0; the parent runs its loop, prints its lines, waits for the child and prints
// "child exited E signal G" (E its exit status, G the signal that ended it, else 0).
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

volatile uint64_t g_val;

static long g_n;
static long g_usec;
static volatile sig_atomic_t g_traps;

static void on_trap(int sig) {
  (void)sig;
  g_traps = g_traps + 1;
}

__attribute__((noinline)) long kill_tick(long i) {
  g_val = (uint64_t)i;
  __asm__ volatile("" ::: "memory");
  return 2 * i + 1;
}

static void* worker(void* arg) {
  long* sum = arg;
  for (long i = 0; i < g_n; i++) {
    *sum += kill_tick(i);
    if (g_usec > 0) {
      usleep((useconds_t)g_usec);
    }
  }
  return NULL;
}

int main(int argc, char** argv) {
  int catch_traps = 0;
  int do_fork = 0;
  int bad = argc < 5;
  for (int i = 5; i < argc; i++) {
    if (strcmp(argv[i], "traps") == 0 && !catch_traps && !do_fork) {
      catch_traps = 1;
    } else if (strcmp(argv[i], "fork") == 0 && !do_fork) {
      do_fork = 1;
    } else {
      bad = 1;
    }
  }
  if (bad) {
    fprintf(stderr, "usage: kill_target THREADS N USEC GOFILE [traps] [fork]\n");
    return 2;
  }
  if (catch_traps) {
    signal(SIGTRAP, on_trap);
  }
  const int threads = atoi(argv[1]);
  g_n = atol(argv[2]);
  g_usec = atol(argv[3]);
  printf("ready\n");
  fflush(stdout);
  for (int waited = 0; access(argv[4], F_OK) != 0 && waited < 6000; waited++) {
    usleep(10000);
  }
  pid_t child = -1;
  if (do_fork) {
    fflush(stdout);
    child = fork();
    if (child < 0) {
      perror("fork");
      return 2;
    }
  }
  pthread_t* th = calloc((size_t)threads, sizeof(pthread_t));
  long* sums = calloc((size_t)threads, sizeof(long));
  for (int k = 0; k < threads; k++) {
    pthread_create(&th[k], NULL, worker, &sums[k]);
  }
  long sum = 0;
  for (int k = 0; k < threads; k++) {
    pthread_join(th[k], NULL);
    sum += sums[k];
  }
  free(th);
  free(sums);
  if (child == 0) {
    printf("child done calls=%ld sum=%ld traps=%d\n", (long)threads * g_n, sum, (int)g_traps);
    fflush(stdout);
    _exit(0);
  }
  printf("done calls=%ld sum=%ld\n", (long)threads * g_n, sum);
  if (catch_traps) {
    printf("traps=%d\n", (int)g_traps);
  }
  if (child > 0) {
    fflush(stdout);
    int status = 0;
    waitpid(child, &status, 0);
    printf("child exited %d signal %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1,
           WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  }
  return 0;
}
