// The floor under any ptrace-based probe on this machine: the smallest tracer that can
// probe tick() of tests/targets/uprobe_loop. It launches the program, writes one INT3 over
// tick's first instruction and, at each trap, emulates that instruction (lea
// (%rdi,%rdi,2),%rax: four bytes, one register written) with one PTRACE_GETREGS and one
// PTRACE_SETREGS, then continues: wait4 + 2 register calls + PTRACE_CONT per hit, nothing
// else. No symbols, no handlers, no output per hit. bench/compare/compare.sh builds and runs
// it next to the real tools; kwatch's ptrace backend does this plus its own work.
//
//   ptrace_floor TICK_FILE_OFFSET PROGRAM ARGS...     (prints "hits=N", exits as PROGRAM)
//
// It checks the bytes it replaces and refuses any other instruction.

#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/types.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <unistd.h>

static const unsigned char kLea[4] = {0x48, 0x8d, 0x04, 0x7f};  // lea (%rdi,%rdi,2),%rax

// The address PROGRAM's file offset 0 is mapped at in `pid` (its first mapping).
static uint64_t LoadBase(pid_t pid, const char* program) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/maps", pid);
  FILE* f = fopen(path, "r");
  char real[4096];
  if (f == NULL || realpath(program, real) == NULL) {
    return 0;
  }
  char line[8192];
  uint64_t base = 0;
  while (fgets(line, sizeof line, f) != NULL) {
    unsigned long long lo = 0;
    unsigned long long off = 0;
    char file[4096] = "";
    if (sscanf(line, "%llx-%*x %*s %llx %*s %*s %4095s", &lo, &off, file) == 3 &&
        strcmp(file, real) == 0 && off == 0) {
      base = lo;
      break;
    }
  }
  fclose(f);
  return base;
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: ptrace_floor TICK_FILE_OFFSET PROGRAM ARGS...\n");
    return 2;
  }
  const uint64_t offset = strtoull(argv[1], NULL, 0);
  const pid_t child = fork();
  if (child == 0) {
    ptrace(PTRACE_TRACEME, 0, NULL, NULL);
    execv(argv[2], argv + 2);
    perror("execv");
    _exit(127);
  }
  int status = 0;
  if (waitpid(child, &status, 0) != child || !WIFSTOPPED(status)) {
    fprintf(stderr, "ptrace_floor: %s did not stop at exec\n", argv[2]);
    return 1;
  }
  // uprobe_loop calls tick() from the threads it creates: trace them too.
  ptrace(PTRACE_SETOPTIONS, child, NULL,
         (void*)(uintptr_t)(PTRACE_O_EXITKILL | PTRACE_O_TRACECLONE));
  const uint64_t base = LoadBase(child, argv[2]);
  const uint64_t addr = base + offset;
  errno = 0;
  const long word = ptrace(PTRACE_PEEKTEXT, child, (void*)addr, NULL);
  if (base == 0 || errno != 0 || memcmp(&word, kLea, sizeof kLea) != 0) {
    fprintf(stderr, "ptrace_floor: no 'lea (%%rdi,%%rdi,2),%%rax' at %s+0x%llx\n", argv[2],
            (unsigned long long)offset);
    kill(child, SIGKILL);
    return 1;
  }
  const long patched = (word & ~0xffL) | 0xcc;
  ptrace(PTRACE_POKETEXT, child, (void*)addr, (void*)patched);
  long hits = 0;
  ptrace(PTRACE_CONT, child, NULL, NULL);
  for (;;) {
    const pid_t tid = waitpid(-1, &status, __WALL);
    if (tid < 0) {
      perror("waitpid");
      return 1;
    }
    if (WIFEXITED(status) || WIFSIGNALED(status)) {
      if (tid == child) {
        break;
      }
      continue;
    }
    int sig = WSTOPSIG(status);
    if (sig == SIGTRAP && (status >> 16) != 0) {
      sig = 0;  // PTRACE_EVENT_CLONE
    } else if (sig == SIGSTOP) {
      sig = 0;  // a new thread's first stop
    } else if (sig == SIGTRAP) {
      struct user_regs_struct r;
      ptrace(PTRACE_GETREGS, tid, NULL, &r);
      if (r.rip == addr + 1) {
        r.rax = r.rdi * 3;
        r.rip = addr + sizeof kLea;
        ptrace(PTRACE_SETREGS, tid, NULL, &r);
        ++hits;
        sig = 0;
      }
    }
    ptrace(PTRACE_CONT, tid, NULL, (void*)(uintptr_t)sig);
  }
  printf("hits=%ld\n", hits);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}
