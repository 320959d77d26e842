// Calls step() N times, then prints the lines of /proc/self/maps that name kwatch's agent
// library: which libkwatch-agent.so a probe session loaded (tests/packaging: the installed
// kwatch must load the installed agent, not the build tree's).
//   agent_maps N
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

__attribute__((noinline)) long step(long i) {
  __asm__ volatile("" ::: "memory");
  return i * 2;
}

int main(int argc, char** argv) {
  const long n = argc > 1 ? atol(argv[1]) : 1000;
  long sum = 0;
  for (long i = 0; i < n; i++) {
    sum += step(i);
  }
  printf("sum=%ld\n", sum);
  FILE* maps = fopen("/proc/self/maps", "r");
  if (maps == NULL) {
    perror("agent_maps: /proc/self/maps");
    return 1;
  }
  char line[4096];
  while (fgets(line, sizeof line, maps) != NULL) {
    if (strstr(line, "kwatch-agent") != NULL) {
      fputs(line, stdout);
    }
  }
  fclose(maps);
  return 0;
}
