// Functions for kwatch to call inside this process (core/ptrace/remote_call.h: RemoteCall,
// with remote_exec.h's system calls),
// and a main thread that waits in pause() until SIGUSR1, then reports what the calls did:
//
//   remote_exec    print "ready PID", wait; on SIGUSR1 print "calls N last V" (the calls
//                  of remote_add6 and the last value it computed) and exit 0
#define _GNU_SOURCE
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>

static volatile sig_atomic_t done;
long g_calls;
long g_last;

// a + 2b + 3c + 4d + 5e + 6f, counted.
__attribute__((noinline, used)) long remote_add6(long a, long b, long c, long d, long e, long f) {
  g_calls++;
  g_last = a + 2 * b + 3 * c + 4 * d + 5 * e + 6 * f;
  return g_last;
}

// Arithmetic in the vector registers (doubles live in xmm): (x * 1.5 + 0.25) * 4.
__attribute__((noinline, used)) long remote_vectors(long x) {
  volatile double d = (double)x;
  d = d * 1.5 + 0.25;
  return (long)(d * 4.0);
}

// The frame's alignment (the ABI's 16 bytes at the call: 0 when the caller got it right).
__attribute__((noinline, used)) long remote_frame_alignment(void) {
  return (long)((uintptr_t)__builtin_frame_address(0) % 16);
}

// Reads through `p` (a fault for NULL).
__attribute__((noinline, used)) long remote_load(const long* p) {
  return *p;
}

// Never returns.
__attribute__((noinline, used)) long remote_forever(void) {
  for (;;) {
    pause();
  }
}

static void on_usr1(int sig) {
  (void)sig;
  done = 1;
}

int main(void) {
  struct sigaction sa = {0};
  sa.sa_handler = on_usr1;
  sigaction(SIGUSR1, &sa, NULL);
  printf("ready %d\n", (int)getpid());
  fflush(stdout);
  while (!done) {
    pause();
  }
  printf("calls %ld last %ld\n", g_calls, g_last);
  return 0;
}
