// Pointers that change while a field behind them is written: for --follow.
//
//   follow_chain MODE N M K [--wait]
//
// --wait: print "ready PID" on stdout and wait for SIGUSR1 before anything else (attach); the
// pointers are all NULL then.
// MODE ptr:   g_p = A; N writes of g_p->v; g_p = B; M writes of g_p->v; then K writes of A->v
//             (the old object, no longer behind g_p).
// MODE null:  as ptr, but between the two: g_p = NULL, K writes of A->v and K of B->v (B is
//             prepared before it is published), then g_p = B.
// MODE chain: g_h = &H1 (H1.obj = A); N writes of g_h->obj->v; H1.obj = B (the inner pointer);
//             M writes; g_h = &H2 (H2.obj = C: the outer pointer); K writes; H1.obj = A (no
//             longer on the way); K more writes (to C).
// MODE threads: K threads; g_p = A; each thread writes g_p->v N times; when all are done (a
//             barrier, the threads blocked in it) main sets g_p = B; each thread writes M times.
// MODE flip:  K times: g_p = A, N writes of g_p->v, g_p = B, M writes (2K moves, back and forth).
// Every write through a pointer is one 8-byte store of the field. Ground truth goes to stderr:
// "a=0xADDR b=0xADDR c=0xADDR" (the objects' v fields).
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct obj {
  long v;
  long pad[7];
};

struct holder {
  long tag;
  struct obj* volatile obj;
};

struct obj* volatile g_p;
struct holder* volatile g_h;
struct holder g_h1;
struct holder g_h2;
volatile long g_sink;

__attribute__((noinline)) void write_through(long n) {
  for (long i = 0; i < n; ++i) {
    g_p->v = i;
  }
}

__attribute__((noinline)) void write_chain(long n) {
  for (long i = 0; i < n; ++i) {
    g_h->obj->v = i;
  }
}

__attribute__((noinline)) void write_direct(volatile struct obj* o, long n) {
  for (long i = 0; i < n; ++i) {
    o->v = 1000 + i;
  }
}

static long g_n;
static long g_m;
static pthread_barrier_t g_wrote_a;  // every thread wrote A
static pthread_barrier_t g_moved;    // g_p is B

static void* Writer(void* arg) {
  (void)arg;
  write_through(g_n);
  pthread_barrier_wait(&g_wrote_a);
  pthread_barrier_wait(&g_moved);
  write_through(g_m);
  return NULL;
}

static volatile sig_atomic_t g_go;

static void OnUsr1(int sig) {
  (void)sig;
  g_go = 1;
}

static void WaitForGo(void) {
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

int main(int argc, char** argv) {
  if (argc < 5) {
    fprintf(stderr, "usage: follow_chain ptr|null|chain N M K [--wait]\n");
    return 2;
  }
  const char* mode = argv[1];
  const long n = atol(argv[2]);
  const long m = atol(argv[3]);
  const long k = atol(argv[4]);
  if (argc > 5 && strcmp(argv[5], "--wait") == 0) {
    WaitForGo();
  }
  struct obj* a = calloc(1, sizeof(struct obj));
  struct obj* b = calloc(1, sizeof(struct obj));
  struct obj* c = calloc(1, sizeof(struct obj));
  if (strcmp(mode, "chain") == 0) {
    g_h1.obj = a;
    g_h2.obj = c;
    g_h = &g_h1;
    write_chain(n);
    g_h1.obj = b;
    write_chain(m);
    g_h = &g_h2;
    write_chain(k);
    g_h1.obj = a;
    write_chain(k);
  } else if (strcmp(mode, "flip") == 0) {
    for (long i = 0; i < k; ++i) {
      g_p = a;
      write_through(n);
      g_p = b;
      write_through(m);
    }
  } else if (strcmp(mode, "threads") == 0) {
    enum { kMaxThreads = 16 };
    pthread_t threads[kMaxThreads];
    const long count = k < kMaxThreads ? k : kMaxThreads;
    g_n = n;
    g_m = m;
    pthread_barrier_init(&g_wrote_a, NULL, (unsigned)count + 1);
    pthread_barrier_init(&g_moved, NULL, (unsigned)count + 1);
    g_p = a;  // threads: the first object
    for (long i = 0; i < count; ++i) {
      pthread_create(&threads[i], NULL, Writer, NULL);
    }
    pthread_barrier_wait(&g_wrote_a);
    g_p = b;  // the threads wait in the barrier
    pthread_barrier_wait(&g_moved);
    for (long i = 0; i < count; ++i) {
      pthread_join(threads[i], NULL);
    }
  } else {
    g_p = a;  // ptr, null: the first object
    write_through(n);
    if (strcmp(mode, "null") == 0) {
      g_p = NULL;
      write_direct(a, k);
      write_direct(b, k);
    }
    g_p = b;  // ptr, null: the second object
    write_through(m);
    write_direct(a, k);
  }
  g_sink = 1;
  fprintf(stderr, "a=%p b=%p c=%p\n", (void*)&a->v, (void*)&b->v, (void*)&c->v);
  return 0;
}
