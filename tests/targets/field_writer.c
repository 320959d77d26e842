// A multi-threaded fixture: THREADS workers each write fields of the global g_stats
// ITERS times and print their own ground truth, one JSON object per thread.
//
//   field_writer THREADS ITERS [--wait] [--exit N] [--truth FILE] [--crash] [--fork]
//
// Per iteration i of each worker: g_stats.hits = i (one 8-byte store); when i is even,
// g_stats.misses = i (one 4-byte store); when i % 4 == 0, one 2-byte load of g_stats.flags.
// --fork: before the workers start, fork a child that writes g_stats.hits 100 times and
//   exits 0; the parent waits for it and exits 42 if the child did not exit 0.
// --exec PROG: after the work, exec PROG (no arguments) instead of returning.
// --crash: after the work, write through a NULL pointer (a genuine SIGSEGV).
// --truth FILE: write the ground truth there instead of stdout.
// --wait: print "ready PID" and wait for SIGUSR1 before starting (for attach tests).
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ready_wait.h"

struct inner {
  int a;
  int b;
};

struct stats {
  long hits;
  int misses;
  short flags;
  char tag[8];
  unsigned mode : 3;
  unsigned ready : 1;
  struct inner inner;
};

volatile struct stats g_stats;
volatile long g_sink;

struct worker {
  pthread_t thread;
  pid_t tid;
  long iters;
  long hits_w, misses_w, flags_r;
};

static void* Work(void* arg) {
  struct worker* w = arg;
  w->tid = (pid_t)syscall(SYS_gettid);
  for (long i = 0; i < w->iters; ++i) {
    g_stats.hits = i;
    w->hits_w++;
    if (i % 2 == 0) {
      g_stats.misses = (int)i;
      w->misses_w++;
    }
    if (i % 4 == 0) {
      g_sink += g_stats.flags;
      w->flags_r++;
    }
  }
  return NULL;
}


int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s THREADS ITERS [--wait] [--exit N]\n", argv[0]);
    return 2;
  }
  int threads = atoi(argv[1]);
  long iters = atol(argv[2]);
  int exit_code = 0;
  int wait = 0;
  const char* truth = NULL;
  int crash = 0;
  int do_fork = 0;
  const char* exec_prog = NULL;
  for (int i = 3; i < argc; ++i) {
    if (strcmp(argv[i], "--wait") == 0) {
      wait = 1;
    } else if (strcmp(argv[i], "--exit") == 0 && i + 1 < argc) {
      exit_code = atoi(argv[++i]);
    } else if (strcmp(argv[i], "--exec") == 0 && i + 1 < argc) {
      exec_prog = argv[++i];
    } else if (strcmp(argv[i], "--fork") == 0) {
      do_fork = 1;
    } else if (strcmp(argv[i], "--crash") == 0) {
      crash = 1;
    } else if (strcmp(argv[i], "--truth") == 0 && i + 1 < argc) {
      truth = argv[++i];
    }
  }
  if (wait) {
    ReadyAndWaitForUsr1();
  }
  if (do_fork) {
    pid_t child = fork();
    if (child == 0) {
      for (long i = 0; i < 100; ++i) {
        g_stats.hits = i;
      }
      _exit(0);
    }
    int status = 0;
    waitpid(child, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      fprintf(stderr, "field_writer: forked child failed (status 0x%x)\n", status);
      return 42;
    }
  }
  struct worker* ws = calloc((size_t)threads, sizeof(*ws));
  for (int t = 0; t < threads; ++t) {
    ws[t].iters = iters;
    pthread_create(&ws[t].thread, NULL, Work, &ws[t]);
  }
  for (int t = 0; t < threads; ++t) {
    pthread_join(ws[t].thread, NULL);
  }
  FILE* out = truth ? fopen(truth, "w") : stdout;
  if (out == NULL) {
    perror("fopen");
    return 3;
  }
  for (int t = 0; t < threads; ++t) {
    fprintf(out, "{\"tid\":%d,\"hits_w\":%ld,\"misses_w\":%ld,\"flags_r\":%ld}\n", ws[t].tid,
           ws[t].hits_w, ws[t].misses_w, ws[t].flags_r);
  }
  if (out != stdout) {
    fclose(out);
  }
  free(ws);
  if (exec_prog != NULL) {
    execl(exec_prog, exec_prog, (char*)NULL);
    perror("execl");
    return 4;
  }
  if (crash) {
    volatile int* volatile null_ptr = NULL;
    *null_ptr = 1;
  }
  return exit_code;
}
