// A target for long sessions (scripts/memory_soak.sh): THREADS workers write and read the
// fields of g_soak from several source lines, forever (until killed, or until SECONDS have
// passed when SECONDS > 0), so that a watch of g_soak sees a steady stream of events from
// several threads and several code sites, and a probe of soak_tick() a steady stream of hits.
//
//   soak_writer THREADS [SECONDS] [--churn MS]
//
// Each worker iteration: g_soak.a = i (8-byte store), g_soak.b = i (4-byte store) when i is
// odd, g_soak.c read (2-byte load) when i % 4 == 0, g_soak.d[i % 4] = i (1-byte store), and
// one call of soak_tick(i). --churn MS: every MS milliseconds one worker ends and a new one
// (a new thread id) takes its place, so per-thread tables see thread churn too.
// At exit (SECONDS elapsed) it prints "iterations=N threads_started=T".
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct soak {
  long a;
  int b;
  short c;
  char d[4];
};

// On its own page, so that a page-mode watch faults only on g_soak.
volatile struct soak g_soak __attribute__((aligned(4096)));
static volatile long g_sink __attribute__((aligned(4096)));
static atomic_long g_iterations __attribute__((aligned(4096)));
static atomic_int g_stop __attribute__((aligned(4096)));

__attribute__((noinline)) long soak_tick(long i) {
  __asm__ volatile("" ::"r"(i));
  return i + 1;
}

struct worker {
  pthread_t thread;
  atomic_int quit;
};

static void* Work(void* arg) {
  struct worker* w = arg;
  long i = 0;
  while (!atomic_load_explicit(&g_stop, memory_order_relaxed) &&
         !atomic_load_explicit(&w->quit, memory_order_relaxed)) {
    g_soak.a = i;
    if (i & 1) {
      g_soak.b = (int)i;
    }
    if (i % 4 == 0) {
      g_sink += g_soak.c;
    }
    g_soak.d[i % 4] = (char)i;
    i = soak_tick(i);
  }
  atomic_fetch_add(&g_iterations, i);
  return NULL;
}

static void SleepMs(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s THREADS [SECONDS] [--churn MS]\n", argv[0]);
    return 2;
  }
  int threads = atoi(argv[1]);
  long seconds = 0;
  long churn_ms = 0;
  for (int i = 2; i < argc; ++i) {
    if (strcmp(argv[i], "--churn") == 0 && i + 1 < argc) {
      churn_ms = atol(argv[++i]);
    } else {
      seconds = atol(argv[i]);
    }
  }
  if (threads < 1) {
    threads = 1;
  }
  struct worker* ws = calloc((size_t)threads, sizeof(*ws));
  long started = 0;
  for (int t = 0; t < threads; ++t) {
    pthread_create(&ws[t].thread, NULL, Work, &ws[t]);
    ++started;
  }
  const long tick_ms = churn_ms > 0 ? churn_ms : 100;
  long elapsed_ms = 0;
  int next = 0;
  while (seconds == 0 || elapsed_ms < seconds * 1000) {
    SleepMs(tick_ms);
    elapsed_ms += tick_ms;
    if (churn_ms > 0) {
      atomic_store(&ws[next].quit, 1);
      pthread_join(ws[next].thread, NULL);
      atomic_store(&ws[next].quit, 0);
      pthread_create(&ws[next].thread, NULL, Work, &ws[next]);
      ++started;
      next = (next + 1) % threads;
    }
  }
  atomic_store(&g_stop, 1);
  for (int t = 0; t < threads; ++t) {
    pthread_join(ws[t].thread, NULL);
  }
  printf("iterations=%ld threads_started=%ld\n", atomic_load(&g_iterations), started);
  free(ws);
  return 0;
}
