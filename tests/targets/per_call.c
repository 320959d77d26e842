// Functions that write through their arguments and locals a known number of times per call:
// for watches armed per call (`kwatch --write 'r->len' --in compute`).
//
//   per_call THREADS CALLS DEPTH [--wait] [--usec N]
//
// Each of THREADS threads (the main thread too when THREADS is 1) makes CALLS calls of
// compute(r, 3), alternating an object on its stack and one on the heap: each call writes
// r->len 3 times and r->flags once; then CALLS calls of run(5), whose local `sum` (in memory)
// is written 6 times per call; then one recurse(r, DEPTH): DEPTH + 1 nested calls, each
// writing its own object's r->len twice (once before, once after the inner call).
// --wait: print "ready PID" on stdout and wait for SIGUSR1 before the work (attach).
// --usec N: each call of compute sleeps N microseconds after its first write (calls in
// flight most of the time: their return addresses are kwatch's while it tracks them).
// --waves N: the THREADS threads run N times one after the other, 150 ms apart (threads come
// and go: 8 x 10 waves is 80 threads); at the end "perf_fds=N" on stderr counts the perf events
// the process still holds open (anon_inode:[perf_event] in /proc/self/fd).
// Ground truth goes to stderr: "compute_writes=N run_writes=N recurse_calls=N".
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <time.h>
#include <unistd.h>

struct req {
  long id;
  volatile int len;  // each write in the source is one store
  volatile int flags;
};

static int g_calls;
static int g_depth;
static int g_usec;
volatile long g_sink;

__attribute__((noinline)) void compute(struct req* r, int n) {
  for (int i = 0; i < n; ++i) {
    r->len = r->len + 1;
    if (i == 0 && g_usec > 0) {
      usleep(g_usec);
    }
  }
  r->flags = 1;
}

__attribute__((noinline)) int run(int n) {
  volatile int sum = 0;
  for (int i = 1; i <= n; ++i) {
    sum = sum + i;
  }
  return sum;
}

__attribute__((noinline)) void recurse(struct req* r, int depth) {
  r->len = r->len + 1;
  if (depth > 0) {
    struct req inner;
    memset(&inner, 0, sizeof(inner));
    recurse(&inner, depth - 1);
    g_sink = inner.len;
  }
  r->len = r->len + 1;
}

static void* worker(void* arg) {
  (void)arg;
  struct req* heap = calloc(1, sizeof(struct req));
  for (int i = 0; i < g_calls; ++i) {
    struct req local;
    memset(&local, 0, sizeof(local));
    compute(i % 2 == 0 ? &local : heap, 3);
    g_sink = local.len;
  }
  long total = 0;
  for (int i = 0; i < g_calls; ++i) {
    total += run(5);
  }
  g_sink = total;
  struct req top;
  memset(&top, 0, sizeof(top));
  recurse(&top, g_depth);
  free(heap);
  return NULL;
}

static void on_usr1(int sig) { (void)sig; }

static int perf_fds(void) {
  DIR* d = opendir("/proc/self/fd");
  int n = 0;
  struct dirent* e;
  while (d != NULL && (e = readdir(d)) != NULL) {
    char path[300];
    char link[256];
    snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
    const ssize_t len = readlink(path, link, sizeof(link) - 1);
    if (len > 0) {
      link[len] = 0;
      n += strcmp(link, "anon_inode:[perf_event]") == 0;
    }
  }
  if (d != NULL) {
    closedir(d);
  }
  return n;
}

int main(int argc, char** argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: per_call THREADS CALLS DEPTH [--wait]\n");
    return 2;
  }
  const int threads = atoi(argv[1]);
  g_calls = atoi(argv[2]);
  g_depth = atoi(argv[3]);
  int waves = 0;
  for (int i = 4; i + 1 < argc; ++i) {
    if (strcmp(argv[i], "--usec") == 0) {
      g_usec = atoi(argv[i + 1]);
    }
    if (strcmp(argv[i], "--waves") == 0) {
      waves = atoi(argv[i + 1]);
    }
  }
  if (argc > 4 && strcmp(argv[4], "--wait") == 0) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    sigprocmask(SIG_BLOCK, &set, NULL);
    signal(SIGUSR1, on_usr1);
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    int sig = 0;
    sigwait(&set, &sig);
  }
  const int rounds = waves > 0 ? waves : 1;
  for (int w = 0; w < rounds; ++w) {
    if (w > 0) {
      const struct timespec gap = {0, 150 * 1000 * 1000};
      nanosleep(&gap, NULL);
    }
    if (threads <= 1) {
      worker(NULL);
    } else {
      pthread_t t[64];
      const int n = threads > 64 ? 64 : threads;
      for (int i = 0; i < n; ++i) {
        pthread_create(&t[i], NULL, worker, NULL);
      }
      for (int i = 0; i < n; ++i) {
        pthread_join(t[i], NULL);
      }
    }
  }
  const int n = rounds * (threads <= 1 ? 1 : (threads > 64 ? 64 : threads));
  fprintf(stderr, "compute_writes=%d run_writes=%d recurse_calls=%d\n", n * g_calls * 3,
          n * g_calls * 6, n * (g_depth + 1));
  if (waves > 0) {
    fprintf(stderr, "perf_fds=%d\n", perf_fds());
  }
  return 0;
}
