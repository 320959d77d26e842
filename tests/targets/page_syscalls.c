// System calls that use memory on a page holding watched data (page-protection watches).
//   page_syscalls pipe N      a writer thread bumps g_page.sent and writes the 8-byte value i
//                             into a pipe, N times; the main thread read()s it straight into
//                             g_page.value (blocking), then 100 bytes into g_page.buf, bumps
//                             g_page.received and write()s g_page.value to /dev/null.
//                             Prints "pipe N last=N-1 text='msg N-1'".
//   page_syscalls mutex T N   T threads each lock g_page.lock (a mutex on the watched page),
//                             bump g_page.counter, unlock, N times. Prints "mutex counter=T*N".
//   page_syscalls misc        readv from /dev/zero into g_page.buf, clock_gettime into
//                             g_page.ts, recvmmsg from a socket pair into g_page.buf (a pointer
//                             two structures deep). Prints "misc ok".
//   page_syscalls readvpipe N like pipe, but the main thread readv()s the 8-byte values into
//                             g_page.buf (a call kwatch cannot bounce: it blocks with the page
//                             open). Prints "readvpipe N last=N-1".
//   page_syscalls signals N   a 1 ms interval timer whose SA_RESTART handler bumps
//                             g_page.ticks interrupts read()s into g_page.value that block on a
//                             slow writer. Prints "signals N last=N-1 ticks=T".
//   page_syscalls getpid N    N getpid() calls; prints "getpid N calls NS ns/call".
// g_page is page-aligned, so that every field shares one 4 KiB page.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

struct page {
  volatile long value;     // written by the kernel (read), read by it (write)
  volatile long sent;      // bumped by the writer thread
  volatile long received;  // bumped by the main thread
  volatile long counter;   // bumped under the mutex
  volatile long ticks;     // bumped by the signal handler
  pthread_mutex_t lock;
  struct timespec ts;
  char buf[256];
};

struct page g_page __attribute__((aligned(4096)));

static long g_n;
static int g_pipe[2];

static void die(const char* what) {
  fprintf(stderr, "page_syscalls: %s: %s\n", what, strerror(errno));
  exit(3);
}

static void* writer(void* arg) {
  (void)arg;
  for (long i = 0; i < g_n; i++) {
    g_page.sent = g_page.sent + 1;
    if (write(g_pipe[1], &i, sizeof(i)) != (ssize_t)sizeof(i)) {
      die("write value");
    }
    char text[100];
    memset(text, 0, sizeof(text));
    snprintf(text, sizeof(text), "msg %ld", i);
    if (write(g_pipe[1], text, sizeof(text)) != (ssize_t)sizeof(text)) {
      die("write text");
    }
    usleep(200);  // the reader blocks in read() most of the time
  }
  return NULL;
}

static int run_pipe(void) {
  if (pipe(g_pipe) != 0) {
    die("pipe");
  }
  const int devnull = open("/dev/null", O_WRONLY);
  if (devnull < 0) {
    die("open /dev/null");
  }
  pthread_t w;
  pthread_create(&w, NULL, writer, NULL);
  for (long i = 0; i < g_n; i++) {
    ssize_t r = read(g_pipe[0], (void*)&g_page.value, sizeof(long));
    if (r != (ssize_t)sizeof(long)) {
      die("read value");
    }
    if (g_page.value != i) {
      fprintf(stderr, "page_syscalls: got value %ld, expected %ld\n", g_page.value, i);
      return 4;
    }
    size_t got = 0;
    while (got < 100) {
      r = read(g_pipe[0], g_page.buf + got, 100 - got);
      if (r <= 0) {
        die("read text");
      }
      got += (size_t)r;
    }
    g_page.received = g_page.received + 1;
    if (write(devnull, (const void*)&g_page.value, sizeof(long)) != (ssize_t)sizeof(long)) {
      die("write /dev/null");
    }
  }
  pthread_join(w, NULL);
  printf("pipe %ld last=%ld text='%s'\n", g_n, g_page.value, g_page.buf);
  return 0;
}

static void* value_writer(void* arg) {
  const long pause_us = (long)arg;
  for (long i = 0; i < g_n; i++) {
    g_page.sent = g_page.sent + 1;
    if (write(g_pipe[1], &i, sizeof(i)) != (ssize_t)sizeof(i)) {
      die("write value");
    }
    usleep((useconds_t)pause_us);
  }
  return NULL;
}

static int run_readvpipe(void) {
  if (pipe(g_pipe) != 0) {
    die("pipe");
  }
  pthread_t w;
  pthread_create(&w, NULL, value_writer, (void*)200L);
  long last = -1;
  for (long i = 0; i < g_n; i++) {
    struct iovec iov = {g_page.buf, sizeof(long)};
    if (readv(g_pipe[0], &iov, 1) != (ssize_t)sizeof(long)) {
      die("readv");
    }
    memcpy(&last, g_page.buf, sizeof(long));
    if (last != i) {
      fprintf(stderr, "page_syscalls: got %ld, expected %ld\n", last, i);
      return 4;
    }
  }
  pthread_join(w, NULL);
  printf("readvpipe %ld last=%ld\n", g_n, last);
  return 0;
}

static void on_tick(int sig) {
  (void)sig;
  g_page.ticks = g_page.ticks + 1;
}

static int run_signals(void) {
  if (pipe(g_pipe) != 0) {
    die("pipe");
  }
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = on_tick;
  sa.sa_flags = SA_RESTART;
  sigaction(SIGALRM, &sa, NULL);
  // The writer must not take the timer's signals: block SIGALRM in it.
  sigset_t alrm;
  sigemptyset(&alrm);
  sigaddset(&alrm, SIGALRM);
  pthread_sigmask(SIG_BLOCK, &alrm, NULL);
  pthread_t w;
  pthread_create(&w, NULL, value_writer, (void*)3000L);
  pthread_sigmask(SIG_UNBLOCK, &alrm, NULL);
  struct itimerval it = {{0, 1000}, {0, 1000}};
  setitimer(ITIMER_REAL, &it, NULL);
  for (long i = 0; i < g_n; i++) {
    const ssize_t r = read(g_pipe[0], (void*)&g_page.value, sizeof(long));
    if (r != (ssize_t)sizeof(long)) {
      die("read value");
    }
    if (g_page.value != i) {
      fprintf(stderr, "page_syscalls: got value %ld, expected %ld\n", g_page.value, i);
      return 4;
    }
  }
  struct itimerval off = {{0, 0}, {0, 0}};
  setitimer(ITIMER_REAL, &off, NULL);
  pthread_join(w, NULL);
  printf("signals %ld last=%ld ticks=%ld\n", g_n, g_page.value, g_page.ticks);
  return 0;
}

static void* locker(void* arg) {
  (void)arg;
  for (long i = 0; i < g_n; i++) {
    pthread_mutex_lock(&g_page.lock);
    g_page.counter = g_page.counter + 1;
    pthread_mutex_unlock(&g_page.lock);
  }
  return NULL;
}

static int run_mutex(int threads) {
  pthread_t t[16];
  pthread_mutex_init(&g_page.lock, NULL);
  for (int i = 0; i < threads; i++) {
    pthread_create(&t[i], NULL, locker, NULL);
  }
  for (int i = 0; i < threads; i++) {
    pthread_join(t[i], NULL);
  }
  printf("mutex counter=%ld\n", g_page.counter);
  return 0;
}

static int run_misc(void) {
  const int zero = open("/dev/zero", O_RDONLY);
  if (zero < 0) {
    die("open /dev/zero");
  }
  memset(g_page.buf, 'x', sizeof(g_page.buf));
  struct iovec iov[2] = {{g_page.buf, 10}, {g_page.buf + 20, 10}};
  if (readv(zero, iov, 2) != 20) {
    die("readv");
  }
  if (g_page.buf[0] != 0 || g_page.buf[9] != 0 || g_page.buf[10] != 'x' || g_page.buf[29] != 0) {
    fprintf(stderr, "page_syscalls: readv filled the wrong bytes\n");
    return 4;
  }
  if (clock_gettime(CLOCK_MONOTONIC, &g_page.ts) != 0 || g_page.ts.tv_sec == 0) {
    die("clock_gettime");
  }
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) {
    die("socketpair");
  }
  if (write(sv[0], "hello", 5) != 5) {
    die("write socket");
  }
  struct iovec riov = {g_page.buf, 5};
  struct mmsghdr msg;
  memset(&msg, 0, sizeof(msg));
  msg.msg_hdr.msg_iov = &riov;
  msg.msg_hdr.msg_iovlen = 1;
  if (recvmmsg(sv[1], &msg, 1, MSG_DONTWAIT, NULL) != 1 || msg.msg_len != 5 ||
      memcmp(g_page.buf, "hello", 5) != 0) {
    die("recvmmsg");
  }
  printf("misc ok\n");
  return 0;
}

static int run_getpid(void) {
  struct timespec a;
  struct timespec b;
  clock_gettime(CLOCK_MONOTONIC, &a);
  for (long i = 0; i < g_n; i++) {
    syscall(SYS_getpid);
  }
  clock_gettime(CLOCK_MONOTONIC, &b);
  const double ns = (double)(b.tv_sec - a.tv_sec) * 1e9 + (double)(b.tv_nsec - a.tv_nsec);
  printf("getpid %ld calls %.0f ns/call\n", g_n, g_n > 0 ? ns / (double)g_n : 0.0);
  return 0;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(
        stderr,
        "usage: page_syscalls pipe N | readvpipe N | signals N | mutex T N | misc | getpid N\n");
    return 2;
  }
  if (strcmp(argv[1], "pipe") == 0 && argc > 2) {
    g_n = atol(argv[2]);
    return run_pipe();
  }
  if (strcmp(argv[1], "mutex") == 0 && argc > 3) {
    int threads = atoi(argv[2]);
    if (threads < 1 || threads > 16) {
      threads = 2;
    }
    g_n = atol(argv[3]);
    return run_mutex(threads);
  }
  if (strcmp(argv[1], "misc") == 0) {
    return run_misc();
  }
  if (strcmp(argv[1], "readvpipe") == 0 && argc > 2) {
    g_n = atol(argv[2]);
    return run_readvpipe();
  }
  if (strcmp(argv[1], "signals") == 0 && argc > 2) {
    g_n = atol(argv[2]);
    return run_signals();
  }
  if (strcmp(argv[1], "getpid") == 0 && argc > 2) {
    g_n = atol(argv[2]);
    return run_getpid();
  }
  fprintf(stderr, "page_syscalls: unknown mode %s\n", argv[1]);
  return 2;
}
