// Prints who it runs as, then calls tick(7) once: for `-u USER` tests.
//   uid=U gid=G groups=N
#include <stdio.h>
#include <unistd.h>

__attribute__((noinline)) void tick(long i) { __asm__ volatile("" ::"r"(i)); }

int main(void) {
  gid_t groups[64];
  const int n = getgroups(64, groups);
  printf("uid=%d gid=%d groups=%d\n", (int)getuid(), (int)getgid(), n);
  fflush(stdout);
  tick(7);
  return 0;
}
