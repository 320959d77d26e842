// The floor under any in-process INT3 probe on this machine (kwatch probe --backend agent
// --no-jump): tests/targets/uprobe_loop's loop with an `int3` at the start of each Tick()
// (its tick()) and an empty SIGTRAP handler, no tracer. Each hit is the trap, the signal
// delivery and sigreturn, nothing else; the agent's INT3 path does this plus its own work
// (the lookup, the probe, its record, the out-of-line copy). bench/compare/compare.sh builds
// it and runs it with the same sizes as the real tools, so its cost per hit is the same slope
// over hits minus the bare uprobe_loop's slope (the loop itself).
//
//   int3_floor N        (prints "sum=S" as uprobe_loop N does, then "hits=H")
//
// The handler only counts (one add): the count is the program's proof that every int3
// trapped into it.

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

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

__attribute__((noinline)) long Tick(long i, struct req* r) {
  __asm__ volatile("int3" ::: "memory");
  return 3 * i + r->len;
}

static long g_iters;
static long g_sum;

static void* Run(void* arg) {
  struct req r = {0, 100, "loop"};
  long sum = 0;
  (void)arg;
  for (long i = 0; i < g_iters; i++) {
    sum += Tick(i, &r);
  }
  g_sum = sum;
  return NULL;
}

int main(int argc, char** argv) {
  g_iters = argc > 1 ? atol(argv[1]) : 1000;
  struct sigaction sa = {.sa_sigaction = EmptyTrap, .sa_flags = SA_SIGINFO};
  sigemptyset(&sa.sa_mask);
  if (sigaction(SIGTRAP, &sa, NULL) != 0) {
    perror("int3_floor: sigaction(SIGTRAP)");
    return 1;
  }
  // One thread, as uprobe_loop N runs its loop.
  pthread_t tid = 0;
  if (pthread_create(&tid, NULL, Run, NULL) != 0) {
    fprintf(stderr, "int3_floor: pthread_create failed\n");
    return 1;
  }
  pthread_join(tid, NULL);
  printf("sum=%ld\n", g_sum);
  printf("hits=%ld\n", (long)g_hits);
  return 0;
}
