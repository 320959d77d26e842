// Prints who it runs as, then calls tick(7) once, which writes g_ticks once: for `-u USER`
// tests.
//   uid=U gid=G groups=N
#include <stdio.h>
#include <unistd.h>

volatile long g_ticks;

__attribute__((noinline)) void tick(long i) { g_ticks += i; }

int main(void) {
  gid_t groups[64];
  const int n = getgroups(64, groups);
  printf("uid=%d gid=%d groups=%d\n", (int)getuid(), (int)getgid(), n);
  fflush(stdout);
  tick(7);
  return 0;
}
