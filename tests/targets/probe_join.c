// For a `kwatch probe` that joins the session of another kwatch (tests/cli/probe_join_test.cc):
//
//   probe_join THREADS CALLS [--wait] [--pace US]
//
// THREADS threads each call step(i, &r) for i = 0..CALLS-1, with r->len == 100 + the thread's
// index; step writes g_stats.calls = i (one 8-byte store) and returns 3*i + r->len. --wait:
// prints "ready PID" and waits for SIGUSR1 before starting. --pace US: each thread sleeps US
// microseconds after each call. It has no SIGTRAP handler: an INT3 left behind kills it. At the
// end it prints "calls=N sum=S" (S the sum of step's return values).
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ready_wait.h"

struct req {
  int id;
  long len;
};

struct stats {
  long calls;
  long other;
};

volatile struct stats g_stats;

__attribute__((noinline)) long step(long i, struct req* r) {
  g_stats.calls = i;
  __asm__ volatile("" ::: "memory");
  return 3 * i + r->len;
}

static long g_calls;
static long g_pace_us;

static void* Run(void* arg) {
  struct req r = {(int)(long)arg, 100 + (long)arg};
  long sum = 0;
  for (long i = 0; i < g_calls; ++i) {
    sum += step(i, &r);
    if (g_pace_us > 0) {
      usleep((useconds_t)g_pace_us);
    }
  }
  return (void*)sum;
}


int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s THREADS CALLS [--wait] [--pace US]\n", argv[0]);
    return 2;
  }
  const long threads = atol(argv[1]);
  g_calls = atol(argv[2]);
  int wait = 0;
  for (int i = 3; i < argc; ++i) {
    if (strcmp(argv[i], "--wait") == 0) {
      wait = 1;
    } else if (strcmp(argv[i], "--pace") == 0 && i + 1 < argc) {
      g_pace_us = atol(argv[++i]);
    }
  }
  if (threads < 1 || threads > 64) {
    fprintf(stderr, "probe_join: 1..64 threads\n");
    return 2;
  }
  if (wait) {
    ReadyAndWaitForUsr1();
  }
  pthread_t tids[64];
  for (long t = 0; t < threads; ++t) {
    pthread_create(&tids[t], NULL, Run, (void*)t);
  }
  long sum = 0;
  for (long t = 0; t < threads; ++t) {
    void* ret = NULL;
    pthread_join(tids[t], &ret);
    sum += (long)ret;
  }
  printf("calls=%ld sum=%ld\n", threads * g_calls, sum);
  return 0;
}
