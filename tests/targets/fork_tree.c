// Fixture of -f/--follow-forks: a process tree whose every process calls probed(tag) a known
// number of times.
//
//   fork_tree N [GO]
//     main: probed(0) 3 times; then N children through forker() (forker returns the child's
//     pid in the parent, 0 in the child: a return probe's instance crosses the fork).
//     Child k (1..N): probed(k) 10*k times; child 1 also forks a grandchild (plain fork) that
//     calls probed(100) 7 times and exits 7; child 1 waits for it and prints its status.
//     With GO: each child prints "ready k pid PID probed ADDR", waits until the file GO
//     exists, then calls probed(k) 10*k more times. Child k prints "child k sum=S" and
//     exits k. main waits for every child, prints "child k exited E", calls probed(0) twice
//     more, prints "main sum=S" and exits 3.
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

volatile long g_sum;

__attribute__((noinline)) long probed(long tag) {
  g_sum += tag;
  __asm__ volatile("" ::: "memory");
  return tag + 1;
}

__attribute__((noinline)) long forker(long k) {
  __asm__ volatile("" ::: "memory");
  const pid_t pid = fork();
  return pid < 0 ? -k : pid;
}

static void WaitFor(const char* go) {
  while (access(go, F_OK) != 0) {
    usleep(2000);
  }
}

static int Child(long k, const char* go) {
  long sum = 0;
  if (k == 1) {
    const pid_t g = fork();
    if (g == 0) {
      for (int i = 0; i < 7; ++i) {
        sum += probed(100);
      }
      printf("grandchild sum=%ld\n", sum);
      fflush(stdout);
      _exit(7);
    }
    int status = 0;
    waitpid(g, &status, 0);
    printf("grandchild exited %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  }
  for (long i = 0; i < 10 * k; ++i) {
    sum += probed(k);
  }
  if (go != NULL) {
    printf("ready %ld pid %d probed %p\n", k, (int)getpid(), (void*)&probed);
    fflush(stdout);
    WaitFor(go);
    for (long i = 0; i < 10 * k; ++i) {
      sum += probed(k);
    }
  }
  printf("child %ld sum=%ld\n", k, sum);
  fflush(stdout);
  return (int)k;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: fork_tree N [GO]\n");
    return 2;
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  const long n = atol(argv[1]);
  const char* go = argc > 2 ? argv[2] : NULL;
  long sum = 0;
  for (int i = 0; i < 3; ++i) {
    sum += probed(0);
  }
  pid_t pids[64];
  for (long k = 1; k <= n && k <= 64; ++k) {
    const long pid = forker(k);
    if (pid == 0) {
      _exit(Child(k, go));
    }
    pids[k - 1] = (pid_t)pid;
  }
  for (long k = 1; k <= n && k <= 64; ++k) {
    int status = 0;
    waitpid(pids[k - 1], &status, 0);
    printf("child %ld exited %d\n", k, WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  }
  for (int i = 0; i < 2; ++i) {
    sum += probed(0);
  }
  printf("main sum=%ld\n", sum);
  return 3;
}
