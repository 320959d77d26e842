// Functions whose machine code the jump optimizer's tests read from this file's binary, built
// twice (tests/CMakeLists.txt): jump_funcs_O0 (-O0) and jump_funcs_O2 (-O2). Each function is
// a code shape the optimizer must accept or refuse; main runs them all and prints the results.
//   jump_funcs [A [B]]    prints one line per function: name=value
// The leaf functions (jf_mix, jf_redzone, jf_loop) use no global and call nothing, so the tests
// may copy their bytes elsewhere and run them there.
#include <stdio.h>
#include <stdlib.h>

// A leaf: arithmetic on its arguments only.
__attribute__((noinline)) long jf_mix(long a, long b) {
  long x = a * 3 + b;
  x ^= x >> 7;
  return x - (b << 2);
}

// A leaf that keeps locals in the red zone (below %rsp, no frame of its own) across the whole
// body: at -O0 every local lives at -N(%rbp) with %rbp == %rsp; at -O2 the volatile array stays
// in memory under %rsp.
__attribute__((noinline)) long jf_redzone(long a, long b) {
  volatile long t[4];
  t[0] = a;
  t[1] = b;
  t[2] = a ^ b;
  t[3] = a + b;
  long s = t[0] * 5 + t[1];
  s += t[2] * 7;
  s -= t[3];
  return s;
}

// A loop with its head in the middle: at -O2 the back edge `ja` lands two bytes after a
// two-byte `jbe`, at -O0 two bytes after a two-byte `jmp` (the Collatz steps of x).
__attribute__((noinline)) unsigned jf_loop(unsigned x) {
  unsigned c = 0;
  while (x > 1) {
    x = (x & 1) ? 3 * x + 1 : x / 2;
    c++;
  }
  return c;
}

// A switch with a jump table at -O0 and at -O2 (`jmp *%rax` after a table lookup).
__attribute__((noinline)) long jf_switch(long x, long y) {
  switch (x) {
    case 0:
      return y * 3;
    case 1:
      return y + 17;
    case 2:
      return y ^ 0x55;
    case 3:
      return y << 3;
    case 4:
      return y - 1000;
    case 5:
      return y / 7;
    case 6:
      return y % 11;
    case 7:
      return ~y;
    default:
      return -1;
  }
}

// Calls through a pointer and goes on after the call (a two-byte `call *%rax`).
__attribute__((noinline)) long jf_indirect(long (*f)(long, long), long a) {
  return f(a, 1) * 3 + a;
}

long jf_counter;

// Calls another function and goes on after it, and reads a global (RIP-relative).
__attribute__((noinline)) long jf_calls(long a) {
  long v = jf_mix(a, jf_counter);
  jf_counter += v & 1;
  return v + jf_loop((unsigned)a & 7);
}

int main(int argc, char** argv) {
  const long a = argc > 1 ? strtol(argv[1], NULL, 0) : 5;
  const long b = argc > 2 ? strtol(argv[2], NULL, 0) : 9;
  printf("jf_mix=%ld\n", jf_mix(a, b));
  printf("jf_redzone=%ld\n", jf_redzone(a, b));
  printf("jf_loop=%u\n", jf_loop((unsigned)a));
  printf("jf_switch=%ld\n", jf_switch(b & 7, a));
  printf("jf_indirect=%ld\n", jf_indirect(jf_mix, a));
  printf("jf_calls=%ld\n", jf_calls(a));
  return 0;
}
