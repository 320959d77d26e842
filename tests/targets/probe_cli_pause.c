// probe_cli_pause N GOFILE: calls step(i) for i in 0..N-1, prints "phase1 sum=S", waits until
// GOFILE exists (up to 60 s), calls step(i) for i in N..2N-1, prints "phase2 sum=S" and exits 0.
// step(i) returns 2*i + 1. For tests that act on kwatch while the target is between calls.
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

__attribute__((noinline)) long step(long i) {
  __asm__ volatile("" ::: "memory");
  return 2 * i + 1;
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: probe_cli_pause N GOFILE\n");
    return 2;
  }
  const long n = atol(argv[1]);
  long sum = 0;
  for (long i = 0; i < n; i++) {
    sum += step(i);
  }
  printf("phase1 sum=%ld\n", sum);
  fflush(stdout);
  for (int waited = 0; access(argv[2], F_OK) != 0; waited++) {
    if (waited == 6000) {
      fprintf(stderr, "probe_cli_pause: %s never appeared\n", argv[2]);
      return 3;
    }
    usleep(10000);
  }
  for (long i = n; i < 2 * n; i++) {
    sum += step(i);
  }
  printf("phase2 sum=%ld\n", sum);
  return 0;
}
