// A program for `kwatch gdbserver` tests (tests/gdb/): gdb breaks in Bump, watches g_counter,
// reads g_values; kwatch watches fields of g_stats meanwhile. Every count follows from the
// argument: Bump runs N times, g_counter ends at 3*N, g_stats.hits at N, g_stats.misses at
// N/2. Exits with status 7 after printing its totals.
#include <stdio.h>
#include <stdlib.h>

struct stats {
  long hits;
  long misses;
  int flags;
  int pad;
};

struct stats g_stats;
volatile int g_counter;
int g_values[4] = {10, 20, 30, 40};

__attribute__((noinline)) int Bump(int step) {
  g_counter += step;
  return g_counter;
}

int main(int argc, char** argv) {
  const int n = argc > 1 ? atoi(argv[1]) : 5;
  for (int i = 0; i < n; i++) {
    Bump(3);
    g_stats.hits++;
    if (i % 2 == 1) {
      g_stats.misses++;
    }
  }
  printf("counter %d hits %ld misses %ld\n", g_counter, g_stats.hits, g_stats.misses);
  return 7;
}
