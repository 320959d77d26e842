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
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
  if (argc != 5 && !(argc == 6 && strcmp(argv[5], "traps") == 0)) {
    fprintf(stderr, "usage: kill_target THREADS N USEC GOFILE [traps]\n");
    return 2;
  }
  if (argc == 6) {
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
  printf("done calls=%ld sum=%ld\n", (long)threads * g_n, sum);
  if (argc == 6) {
    printf("traps=%d\n", (int)g_traps);
  }
  free(th);
  free(sums);
  return 0;
}
