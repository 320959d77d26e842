// A program for `kwatch gdbserver` arbitration with page protection (tests/gdb/): kwatch
// watches the four fields of g_rec, which has a page of its own; gdb watches g_far, on another
// page, and steps through Store. Every count follows from the argument N: Store and Touch run
// N times each; Store writes g_rec.a N times (an add to memory), g_rec.b N times (a plain
// store), g_rec.c N/2 times and g_rec.d N/5 times; Touch writes g_far N times (g_far ends at
// N*(N+1)/2). Exits with status 7 after printing its totals.
#include <stdio.h>
#include <stdlib.h>

struct rec {
  long a;
  long b;
  int c;
  int d;
};

__attribute__((aligned(4096))) struct rec g_rec;
__attribute__((aligned(4096))) volatile long g_far;

__attribute__((noinline)) void Store(int i) {
  g_rec.a++;
  g_rec.b = i;
  if (i % 2 == 1) {
    g_rec.c++;
  }
  if (i % 5 == 4) {
    g_rec.d++;
  }
}

__attribute__((noinline)) void Touch(int i) {
  g_far += i + 1;
}

int main(int argc, char** argv) {
  const int n = argc > 1 ? atoi(argv[1]) : 5;
  for (int i = 0; i < n; i++) {
    Store(i);
    Touch(i);
  }
  printf("a %ld b %ld c %d d %d far %ld\n", g_rec.a, g_rec.b, g_rec.c, g_rec.d, g_far);
  return 7;
}
