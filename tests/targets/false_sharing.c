// Two threads write different fields of one structure at the same time.
//   false_sharing ITERS
// g_shared.a and g_shared.b share one 64-byte cache line (false sharing); g_padded.a and
// g_padded.b are 64 bytes apart (no sharing). Thread "left" writes .a of both ITERS times,
// thread "right" writes .b of both ITERS times; each also reads .flags of its structure once
// per 4 iterations. Prints "left TID" and "right TID" so tests can match threads.
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

struct shared {
  long a;
  long b;
  int flags;
};

struct padded {
  long a;
  char pad[56];
  long b;
  int flags;
};

volatile struct shared g_shared __attribute__((aligned(64)));
volatile struct padded g_padded __attribute__((aligned(64)));
volatile long g_sink;

static long g_iters;
static pthread_barrier_t g_start;

static void* left(void* arg) {
  (void)arg;
  printf("left %ld\n", (long)syscall(SYS_gettid));
  fflush(stdout);
  pthread_barrier_wait(&g_start);
  for (long i = 0; i < g_iters; i++) {
    g_shared.a = i;
    g_padded.a = i;
    if (i % 4 == 0) {
      g_sink = g_shared.flags + g_padded.flags;
    }
  }
  return NULL;
}

static void* right(void* arg) {
  (void)arg;
  printf("right %ld\n", (long)syscall(SYS_gettid));
  fflush(stdout);
  pthread_barrier_wait(&g_start);
  for (long i = 0; i < g_iters; i++) {
    g_shared.b = i;
    g_padded.b = i;
    if (i % 4 == 0) {
      g_sink = g_shared.flags + g_padded.flags;
    }
  }
  return NULL;
}

int main(int argc, char** argv) {
  g_iters = argc > 1 ? atol(argv[1]) : 1000;
  pthread_barrier_init(&g_start, NULL, 2);
  pthread_t l;
  pthread_t r;
  pthread_create(&l, NULL, left, NULL);
  pthread_create(&r, NULL, right, NULL);
  pthread_join(l, NULL);
  pthread_join(r, NULL);
  printf("done a=%ld b=%ld\n", g_shared.a, g_shared.b);
  return 0;
}
