// The main thread waits on a futex (no timeout) until a second thread wakes it after
// DELAY_MS; every result the futex call gives is checked: 0, EAGAIN and EINTR are the only
// ones a program may see. Writes "futex ok" or "futex errno N" to OUTFILE.
// A tracer that stops the waiting thread and runs a system call in it must not leave it with
// the kernel's internal -ERESTARTSYS (errno 512) as its result.
//
// usage: futex_restart OUTFILE [DELAY_MS]
#define _GNU_SOURCE
#include <errno.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static _Atomic int word;
static long delay_ms = 500;

static void* waker(void* arg) {
  (void)arg;
  struct timespec ts = {delay_ms / 1000, (delay_ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
  atomic_store(&word, 1);
  syscall(SYS_futex, &word, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
  return NULL;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s OUTFILE [DELAY_MS]\n", argv[0]);
    return 2;
  }
  if (argc > 2) {
    delay_ms = atol(argv[2]);
  }
  pthread_t t;
  pthread_create(&t, NULL, waker, NULL);
  int bad = 0;
  while (atomic_load(&word) == 0) {
    if (syscall(SYS_futex, &word, FUTEX_WAIT_PRIVATE, 0, NULL, NULL, 0) != 0 &&
        errno != EAGAIN && errno != EINTR) {
      bad = errno;
      break;
    }
  }
  pthread_join(t, NULL);
  FILE* out = fopen(argv[1], "w");
  if (out == NULL) {
    perror(argv[1]);
    return 1;
  }
  if (bad != 0) {
    fprintf(out, "futex errno %d\n", bad);
  } else {
    fprintf(out, "futex ok\n");
  }
  return fclose(out) == 0 ? 0 : 1;
}
