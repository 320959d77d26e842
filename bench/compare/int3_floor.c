// The floor under any in-process INT3 probe on this machine (kwatch probe --backend agent
// --no-jump): tests/targets/uprobe_loop's loop with an `int3` at the start of each tick()
// and an empty SIGTRAP handler, no tracer. Each hit is the trap, the signal delivery and
// sigreturn, nothing else; the agent's INT3 path does this plus its own work (the lookup,
// the probe, its record, the out-of-line copy). bench/compare/compare.sh builds it and runs
// it with the same sizes as the real tools, so its cost per hit is the same slope over hits
// minus the bare uprobe_loop's slope (the loop itself).
//
//   int3_floor N        (prints "sum=S" as uprobe_loop N does, then "hits=H")
//
// The handler only counts (one add): the count is the program's proof that every int3
// trapped into it.

#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct req {
  int id;
  long len;
  const char* name;
};

static volatile sig_atomic_t g_hits;

static void EmptyTrap(int sig, siginfo_t* info, void* uc) {
  (void)sig;
  (void)info;
  (void)uc;
  g_hits = g_hits + 1;
}

__attribute__((noinline)) long tick(long i, struct req* r) {
  __asm__ volatile("int3" ::: "memory");
  return 3 * i + r->len;
}

static long g_iters;

static void* run(void* arg) {
  struct req r = {0, 100, "loop"};
  long sum = 0;
  (void)arg;
  for (long i = 0; i < g_iters; i++) {
    sum += tick(i, &r);
  }
  return (void*)sum;
}

int main(int argc, char** argv) {
  g_iters = argc > 1 ? atol(argv[1]) : 1000;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = EmptyTrap;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  if (sigaction(SIGTRAP, &sa, NULL) != 0) {
    perror("int3_floor: sigaction(SIGTRAP)");
    return 1;
  }
  // One thread, as uprobe_loop N runs its loop.
  pthread_t tid;
  if (pthread_create(&tid, NULL, run, NULL) != 0) {
    fprintf(stderr, "int3_floor: pthread_create failed\n");
    return 1;
  }
  void* ret = NULL;
  pthread_join(tid, &ret);
  printf("sum=%ld\n", (long)ret);
  printf("hits=%ld\n", (long)g_hits);
  return 0;
}
