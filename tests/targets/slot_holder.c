// A process for `kwatch slots` tests: the main thread and two workers that write their own
// variables now and then, until killed. Prints, once all threads run:
//   pid=P tids=T0,T1,T2 a=0xADDR b=0xADDR c=0xADDR d=0xADDR
// (T0 is the main thread; a..d are 8-byte aligned longs.)
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

volatile long g_a;
volatile long g_b;
volatile long g_c;
volatile long g_d;

static volatile pid_t g_tids[2];

static void nap(void) {
  struct timespec ts = {0, 20 * 1000 * 1000};
  nanosleep(&ts, NULL);
}

static void* worker(void* arg) {
  const long i = (long)arg;
  g_tids[i] = (pid_t)syscall(SYS_gettid);
  for (;;) {
    if (i == 0) {
      g_c += 1;
    } else {
      g_d += 1;
    }
    nap();
  }
  return NULL;
}

int main(void) {
  pthread_t t[2];
  for (long i = 0; i < 2; ++i) {
    pthread_create(&t[i], NULL, worker, (void*)i);
  }
  while (g_tids[0] == 0 || g_tids[1] == 0) {
    nap();
  }
  printf("pid=%d tids=%d,%d,%d a=%p b=%p c=%p d=%p\n", (int)getpid(), (int)getpid(),
         (int)g_tids[0], (int)g_tids[1], (void*)&g_a, (void*)&g_b, (void*)&g_c, (void*)&g_d);
  fflush(stdout);
  for (;;) {
    g_a += 1;
    g_b += 2;
    nap();
  }
  return 0;
}
