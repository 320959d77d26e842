// unwind_levels MODE: main -> level1 -> level2 -> level3, each a real call (no inlining, no
// tail call). MODE "trap": level3 executes an INT3 (a SIGTRAP the tracer absorbs; without a
// tracer the program dies), then every level returns and the program exits 0.
// MODE "pause": level3 calls pause() and the program waits there until it is killed.
// MODE "loop N": main calls level1 N times, each trapping once (for benchmarks).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static volatile int g_sink;
static int g_pause;

__attribute__((noinline)) void level3(void) {
  if (g_pause) {
    pause();
  } else {
    __asm__ volatile("int3");
  }
  g_sink++;
}

__attribute__((noinline)) void level2(void) {
  level3();
  g_sink++;
}

__attribute__((noinline)) void level1(void) {
  level2();
  g_sink++;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: unwind_levels trap|pause|loop N\n");
    return 2;
  }
  long rounds = 1;
  if (strcmp(argv[1], "pause") == 0) {
    g_pause = 1;
  } else if (strcmp(argv[1], "loop") == 0 && argc > 2) {
    rounds = atol(argv[2]);
  } else if (strcmp(argv[1], "trap") != 0) {
    fprintf(stderr, "unwind_levels: unknown mode '%s'\n", argv[1]);
    return 2;
  }
  for (long i = 0; i < rounds; i++) {
    level1();
  }
  g_sink++;
  return 0;
}
