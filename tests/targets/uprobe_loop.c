// Calls tick() a known number of times with known arguments, for probe tests and benches.
//   uprobe_loop N [--threads T]   T threads each call tick(i, &r) for i in 0..N-1
// tick returns 3*i + r->len (r->len == 100 + thread index); the program prints the sum.
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct req {
  int id;
  long len;
  const char* name;
};

__attribute__((noinline)) long tick(long i, struct req* r) {
  __asm__ volatile("" ::: "memory");
  return 3 * i + r->len;
}

static long g_iters;

static void* run(void* arg) {
  struct req r = {(int)(long)arg, 100 + (long)arg, "loop"};
  long sum = 0;
  for (long i = 0; i < g_iters; i++) {
    sum += tick(i, &r);
  }
  return (void*)sum;
}

int main(int argc, char** argv) {
  g_iters = argc > 1 ? atol(argv[1]) : 1000;
  long threads = 1;
  if (argc > 3 && strcmp(argv[2], "--threads") == 0) {
    threads = atol(argv[3]);
  }
  if (threads < 1 || threads > 64) {
    fprintf(stderr, "uprobe_loop: 1..64 threads\n");
    return 2;
  }
  pthread_t tids[64];
  long total = 0;
  for (long t = 0; t < threads; t++) {
    pthread_create(&tids[t], NULL, run, (void*)t);
  }
  for (long t = 0; t < threads; t++) {
    void* ret = NULL;
    pthread_join(tids[t], &ret);
    total += (long)ret;
  }
  printf("sum=%ld\n", total);
  return 0;
}
