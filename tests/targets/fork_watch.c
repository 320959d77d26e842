// Fixture of `kwatch -f` for watch sessions: a process tree in which every process writes the
// watched global g_counter a known number of times, and says how many debug registers it
// found free (a child that inherited a watcher's breakpoint finds fewer than 4).
//
//   fork_watch CHILDREN TRUTH [--exec] [--go FILE]
//     main: 3 writes; then CHILDREN children (at most 16). Child k: 10*k writes; child 1 also
//     forks a grandchild (7 writes, exits 7) and waits for it; child 2 also runs a thread
//     that writes 10 times. With --exec, the last child execs this program again
//     (/proc/self/exe --execd TRUTH) after its writes: the new image writes 5 times and
//     exits 5 (else child k exits k). With --go FILE, each child prints "ready k pid P",
//     waits until FILE exists, then writes 10*k more times. main waits for its children,
//     writes 2 more times and exits 3.
//   Each process appends one line to TRUTH when it ends (one write(2), O_APPEND):
//     {"pid":P,"parent":Q,"writes":N,"free_slots":S,"free_after":A,"image":"first"|"exec"}
//   free_slots: hardware breakpoints the process could open on itself (disabled perf
//   events, closed at once) before its writes, of 4; free_after: the same when it ends.
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/hw_breakpoint.h>
#include <linux/perf_event.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

volatile long g_counter;
volatile long g_probe_slots[4];  // what the slot check watches (never written)

static const char* g_truth;
static long g_writes;

__attribute__((noinline)) static void Write(long n) {
  for (long i = 0; i < n; ++i) {
    g_counter = g_counter + 1;
    __atomic_add_fetch(&g_writes, 1, __ATOMIC_RELAXED);
  }
}

// Debug registers this process can still take: disabled write breakpoints on itself.
static int FreeSlots(void) {
  int fds[4];
  int n = 0;
  for (int i = 0; i < 4; ++i) {
    struct perf_event_attr attr;
    memset(&attr, 0, sizeof(attr));
    attr.type = PERF_TYPE_BREAKPOINT;
    attr.size = sizeof(attr);
    attr.bp_type = HW_BREAKPOINT_W;
    attr.bp_addr = (unsigned long)&g_probe_slots[i];
    attr.bp_len = HW_BREAKPOINT_LEN_8;
    attr.disabled = 1;
    attr.exclude_kernel = 1;
    attr.exclude_hv = 1;
    const int fd = (int)syscall(SYS_perf_event_open, &attr, 0, -1, -1, 0);
    if (fd < 0) {
      break;
    }
    fds[n++] = fd;
  }
  for (int i = 0; i < n; ++i) {
    close(fds[i]);
  }
  return n;
}

static void Truth(int free_slots, const char* image) {
  char line[256];
  const int len = snprintf(line, sizeof(line),
                           "{\"pid\":%d,\"parent\":%d,\"writes\":%ld,\"free_slots\":%d,"
                           "\"free_after\":%d,\"image\":\"%s\"}\n",
                           (int)getpid(), (int)getppid(), g_writes, free_slots, FreeSlots(), image);
  const int fd = open(g_truth, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd >= 0) {
    (void)!write(fd, line, (size_t)len);
    close(fd);
  }
}

static void* Thread(void* arg) {
  (void)arg;
  Write(10);
  return NULL;
}

static void WaitFor(const char* go) {
  while (access(go, F_OK) != 0) {
    usleep(2000);
  }
}

static int Child(long k, int last, int do_exec, const char* go) {
  g_writes = 0;  // this process's own writes
  const int free_slots = FreeSlots();
  if (k == 1) {
    const pid_t g = fork();
    if (g == 0) {
      g_writes = 0;
      const int s = FreeSlots();
      Write(7);
      Truth(s, "first");
      _exit(7);
    }
    int status = 0;
    waitpid(g, &status, 0);
  }
  Write(10 * k);
  if (k == 2) {
    pthread_t t;
    pthread_create(&t, NULL, Thread, NULL);
    pthread_join(t, NULL);
  }
  if (go != NULL) {
    printf("ready %ld pid %d\n", k, (int)getpid());
    fflush(stdout);
    WaitFor(go);
    Write(10 * k);
  }
  Truth(free_slots, "first");
  if (last && do_exec) {
    execl("/proc/self/exe", "fork_watch", "--execd", g_truth, (char*)NULL);
    perror("execl");
    return 100;
  }
  return (int)k;
}

int main(int argc, char** argv) {
  if (argc == 3 && strcmp(argv[1], "--execd") == 0) {
    g_truth = argv[2];
    const int s = FreeSlots();
    Write(5);
    Truth(s, "exec");
    return 5;
  }
  if (argc < 3) {
    fprintf(stderr, "usage: fork_watch CHILDREN TRUTH [--exec] [--go FILE]\n");
    return 2;
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  long n = atol(argv[1]);
  if (n > 16) {
    n = 16;
  }
  g_truth = argv[2];
  int do_exec = 0;
  const char* go = NULL;
  for (int i = 3; i < argc; ++i) {
    if (strcmp(argv[i], "--exec") == 0) {
      do_exec = 1;
    } else if (strcmp(argv[i], "--go") == 0 && i + 1 < argc) {
      go = argv[++i];
    }
  }
  const int free_slots = FreeSlots();
  Write(3);
  pid_t pids[16];
  for (long k = 1; k <= n; ++k) {
    const pid_t pid = fork();
    if (pid == 0) {
      _exit(Child(k, k == n, do_exec, go));
    }
    pids[k - 1] = pid;
  }
  for (long k = 1; k <= n; ++k) {
    int status = 0;
    waitpid(pids[k - 1], &status, 0);
    printf("child %ld exited %d\n", k, WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  }
  Write(2);
  Truth(free_slots, "first");
  return 3;
}
