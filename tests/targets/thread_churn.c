// Thread churn: THREADS short-lived threads, created and joined BATCH at a time, each
// calling tick() once and writing g_churn.writes WRITES times, while kwatch watches or
// probes the process. Prints the ground truth to stdout, or to TRUTH_FILE (so that it cannot
// interleave with kwatch's own output on a shared pipe):
//   threads=T writes=W ticks=T
//
// usage: thread_churn THREADS WRITES [BATCH [TRUTH_FILE]]
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

struct churn {
  long created;
  long writes;
  long ticks;
};

// Each on its own page, so that page-mode watches of g_churn fault only on g_churn.
struct churn g_churn __attribute__((aligned(4096)));
static pthread_mutex_t lock __attribute__((aligned(4096))) = PTHREAD_MUTEX_INITIALIZER;
static long writes_per_thread;

__attribute__((noinline)) void tick(long id) {
  pthread_mutex_lock(&lock);
  g_churn.ticks += 1;
  pthread_mutex_unlock(&lock);
  __asm__ volatile("" ::"r"(id));
}

static void* worker(void* arg) {
  tick((long)arg);
  for (long k = 0; k < writes_per_thread; ++k) {
    pthread_mutex_lock(&lock);
    g_churn.writes += 1;
    pthread_mutex_unlock(&lock);
  }
  return NULL;
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s THREADS WRITES [BATCH [TRUTH_FILE]]\n", argv[0]);
    return 2;
  }
  const long threads = atol(argv[1]);
  writes_per_thread = atol(argv[2]);
  const long batch = argc > 3 ? atol(argv[3]) : 8;
  pthread_t tids[64];
  for (long done = 0; done < threads;) {
    long n = 0;
    for (; n < batch && n < 64 && done + n < threads; ++n) {
      if (pthread_create(&tids[n], NULL, worker, (void*)(done + n)) != 0) {
        perror("pthread_create");
        return 1;
      }
      g_churn.created += 1;
    }
    for (long i = 0; i < n; ++i) {
      pthread_join(tids[i], NULL);
    }
    done += n;
  }
  FILE* out = argc > 4 ? fopen(argv[4], "w") : stdout;
  if (out == NULL) {
    perror(argv[4]);
    return 1;
  }
  fprintf(out, "threads=%ld writes=%ld ticks=%ld\n", g_churn.created, g_churn.writes,
          g_churn.ticks);
  return fclose(out) == 0 ? 0 : 1;
}
