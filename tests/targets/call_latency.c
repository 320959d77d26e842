// call_latency: calls whose durations are known, for $duration on return probes.
//
//   nap(ms)        3 calls, in order: nap(1), nap(20), nap(5): each sleeps ms milliseconds
//   dive(depth)    dive(0) recurses to depth 4 and longjmps out from there: dive's five calls
//                  never return; then dive(4) is called once and returns at once (depth >= 4)
//   nap(ms)        one more call, nap(2), after the longjmp
//
// Prints "done" at the end.
#include <setjmp.h>
#include <stdio.h>
#include <time.h>

static jmp_buf g_out;
static int g_jumped;

__attribute__((noipa)) int nap(int ms) {
  struct timespec t = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
  while (nanosleep(&t, &t) != 0) {
  }
  return ms;
}

__attribute__((noipa)) int dive(int depth) {
  if (depth >= 4) {
    if (!g_jumped) {
      g_jumped = 1;
      longjmp(g_out, 1);
    }
    return depth;
  }
  return dive(depth + 1) + 1;
}

int main(void) {
  int sum = nap(1) + nap(20) + nap(5);
  if (setjmp(g_out) == 0) {
    sum += dive(0);
  }
  sum += dive(4);
  sum += nap(2);
  printf("done %d\n", sum);
  return 0;
}
