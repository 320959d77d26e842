// A pointer that start-up code sets late, then moves: for --arm-at and --follow.
//
//   late_pointer N M [--null] [--wait] [--never]
//
// --wait: print "ready PID" on stdout and wait for SIGUSR1 before the start-up work (attach).
// --never: nothing else; never_called() is never called (an --arm-at point that never runs).
// main spins a little (start-up work), then setup() allocates object A and points g_p at it;
// write_through(N) writes g_p->v N times (one 8-byte store each); switch_to_b() allocates
// object B and points g_p at it (with --null: g_p is first set to NULL, a write of g_other
// follows, then g_p = B); write_through(M) writes g_p->v M times. Ground truth goes to stderr:
// "a=0xADDR b=0xADDR" (the objects' v fields).
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct obj {
  long v;
  long pad[7];
};

struct obj* volatile g_p;
volatile long g_other;
volatile long g_sink;

__attribute__((noinline)) void setup(void) {
  struct obj* a = calloc(1, sizeof(struct obj));
  g_p = a;
  g_sink = 1;  // the line after the assignment (an --arm-at FILE:LINE test stops here)
}

__attribute__((noinline)) void write_through(long n) {
  for (long i = 0; i < n; ++i) {
    g_p->v = i;
  }
}

__attribute__((noinline)) void switch_to_b(int via_null) {
  struct obj* b = calloc(1, sizeof(struct obj));
  if (via_null) {
    g_p = NULL;
    g_other = 1;
  }
  g_p = b;
}

__attribute__((noinline)) void never_called(void) {
  g_other = 2;
}

static volatile sig_atomic_t g_go;

static void OnUsr1(int sig) {
  (void)sig;
  g_go = 1;
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: late_pointer N M [--null] [--wait] [--never]\n");
    return 2;
  }
  const long n = atol(argv[1]);
  const long m = atol(argv[2]);
  int via_null = 0;
  for (int i = 3; i < argc; ++i) {
    if (strcmp(argv[i], "--null") == 0) {
      via_null = 1;
    } else if (strcmp(argv[i], "--never") == 0) {
      if (n < 0) {
        never_called();
      }
      return 0;
    } else if (strcmp(argv[i], "--wait") == 0) {
      sigset_t block;
      sigemptyset(&block);
      sigaddset(&block, SIGUSR1);
      sigprocmask(SIG_BLOCK, &block, NULL);
      signal(SIGUSR1, OnUsr1);
      printf("ready %d\n", (int)getpid());
      fflush(stdout);
      sigset_t none;
      sigemptyset(&none);
      while (!g_go) {
        sigsuspend(&none);
      }
    }
  }
  for (long i = 0; i < 100000; ++i) {
    g_sink = i;  // start-up work before the pointer exists
  }
  setup();
  struct obj* a = g_p;
  write_through(n);
  switch_to_b(via_null);
  struct obj* b = g_p;
  write_through(m);
  fprintf(stderr, "a=%p b=%p\n", (void*)&a->v, (void*)&b->v);
  return 0;
}
