// Nested calls of one function, for return-probe pairing tests (kwatch report --format
// chrome-trace): descend(n) calls descend(n - 1) down to 0 and returns n.
//   call_depth ROUNDS DEPTH   calls descend(DEPTH) ROUNDS times: ROUNDS * (DEPTH + 1) calls
#include <stdio.h>
#include <stdlib.h>

__attribute__((noinline)) int descend(int n) {
  __asm__ volatile("" ::: "memory");
  if (n > 0 && descend(n - 1) != n - 1) {
    abort();
  }
  __asm__ volatile("" ::: "memory");
  return n;
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s ROUNDS DEPTH\n", argv[0]);
    return 2;
  }
  const int rounds = atoi(argv[1]);
  const int depth = atoi(argv[2]);
  for (int i = 0; i < rounds; ++i) {
    descend(depth);
  }
  return 0;
}
