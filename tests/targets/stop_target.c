// A target for the ptrace applier and stop mode (watch/stop_backend).
//
// usage: stop_target threads N M   N threads at start, M more once g_go >= 1, end at g_go >= 2
//        stop_target forge V       at g_go >= 1: stores V into g_rec.a (one movq) and stops
//                                  right after the store with a forged SIGTRAP (TRAP_PERF,
//                                  perf data g_sig_data); prints "stored V traps=K", K the
//                                  SIGTRAPs its own handler received
//        stop_target fork          at g_go >= 1: forks a child that pauses; ends at g_go >= 2
//        stop_target count N       at g_go >= 1: N stores into g_rec.a and N loads of it
//
// Between steps the target raises SIGUSR1 (a milestone the tracer sees as a signal, caught by
// a handler that does nothing) and then waits for the tracer to raise g_go.
//
// The forged trap: the target makes the stop a data breakpoint of kwatch's makes, with the
// breakpoint data the tracer chose (on every machine, traps delivered or not). kw_forge
// stores V, then sends itself SIGUSR2 from the instruction right after the store; the handler
// queues a SIGTRAP with si_code TRAP_PERF and the tracer's g_sig_data as perf data (a process
// may send itself a kernel si_code) while SIGTRAP is blocked, and returns to the instruction
// after the store: the SIGTRAP is delivered there, with the registers of that instruction,
// exactly like the trap of a write breakpoint opened with perf_event_attr.sigtrap.
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <ucontext.h>
#include <unistd.h>

struct record {
  uint64_t a;
  uint32_t b;
  uint16_t c;
  uint8_t d[2];
};

struct record g_rec = {0x1111111111111111ULL, 0x22222222u, 0x3333, {0x44, 0x44}};
volatile uint64_t g_go;
volatile int g_stop;
volatile int g_forged;
volatile uint64_t g_sink;
volatile uint64_t g_sig_data;  // the forged trap's perf data, written by the tracer
volatile int g_traps;          // SIGTRAPs the program's own handler received

// kw_forge(value, pid, tid): movq value -> g_rec.a; then, once, tgkill(pid, tid, SIGUSR2).
extern void kw_forge(uint64_t value, long pid, long tid);
// The instruction after the store: `movq %rdi, disp32(%rip)` is 7 bytes (48 89 3d + disp32).
// No label there, so that the function symbol covering it stays kw_forge.
#define KW_AFTER_STORE ((char*)kw_forge + 7)
__asm__(
    ".text\n"
    ".globl kw_forge\n"
    ".type kw_forge, @function\n"
    "kw_forge:\n"
    "  movq %rdi, g_rec(%rip)\n"
    "  cmpl $0, g_forged(%rip)\n"
    "  jne 1f\n"
    "  movq %rsi, %rdi\n"
    "  movq %rdx, %rsi\n"
    "  movl $12, %edx\n"  // SIGUSR2
    "  movl $234, %eax\n"  // SYS_tgkill
    "  syscall\n"
    "1:\n"
    "  ret\n"
    ".size kw_forge, .-kw_forge\n");

static void on_usr1(int sig) { (void)sig; }

static void on_trap(int sig) {
  (void)sig;
  g_traps = g_traps + 1;
}

static void on_usr2(int sig, siginfo_t* si, void* ucv) {
  (void)sig;
  (void)si;
  ucontext_t* uc = ucv;
  siginfo_t t;
  memset(&t, 0, sizeof(t));
  t.si_signo = SIGTRAP;
  t.si_code = 6;  // TRAP_PERF
  t.si_addr = &g_rec.a;
  const uint64_t data = g_sig_data;
  memcpy((char*)&t + 24, &data, sizeof(data));  // si_perf_data (_sigfault._perf._data)
  // SIGTRAP is blocked in this handler (sa_mask): it waits until the handler returns.
  syscall(SYS_rt_tgsigqueueinfo, getpid(), gettid(), SIGTRAP, &t);
  g_forged = 1;
  // The registers a real trap would show, right after the store: %rdi still holds the value
  // (kwatch takes a plain mov's value from them).
  uc->uc_mcontext.gregs[REG_RIP] = (greg_t)KW_AFTER_STORE;
  uc->uc_mcontext.gregs[REG_RDI] = (greg_t)g_rec.a;
}

static void milestone(void) { raise(SIGUSR1); }

static void wait_go(uint64_t step) {
  while (g_go < step) {
    usleep(1000);
  }
}

static void* idle(void* arg) {
  (void)arg;
  while (!g_stop) {
    usleep(1000);
  }
  return NULL;
}

__attribute__((noinline)) void store_a(uint64_t v) { g_rec.a = v; }
__attribute__((noinline)) uint64_t load_a(void) { return g_rec.a; }

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: stop_target threads N M | forge V | fork | count N\n");
    return 2;
  }
  signal(SIGUSR1, on_usr1);
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_sigaction = on_usr2;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  sigaddset(&sa.sa_mask, SIGTRAP);
  sigaction(SIGUSR2, &sa, NULL);

  if (strcmp(argv[1], "threads") == 0 && argc == 4) {
    const int n = atoi(argv[2]);
    const int m = atoi(argv[3]);
    pthread_t* t = calloc((size_t)(n + m), sizeof(pthread_t));
    for (int i = 0; i < n; ++i) {
      pthread_create(&t[i], NULL, idle, NULL);
    }
    milestone();
    wait_go(1);
    for (int i = n; i < n + m; ++i) {
      pthread_create(&t[i], NULL, idle, NULL);
    }
    milestone();
    wait_go(2);
    g_stop = 1;
    for (int i = 0; i < n + m; ++i) {
      pthread_join(t[i], NULL);
    }
    free(t);
    return 0;
  }
  if (strcmp(argv[1], "forge") == 0 && argc == 3) {
    const uint64_t v = strtoull(argv[2], NULL, 0);
    signal(SIGTRAP, on_trap);
    milestone();
    wait_go(1);
    kw_forge(v, getpid(), gettid());
    printf("stored 0x%llx traps=%d\n", (unsigned long long)g_rec.a, g_traps);
    fflush(stdout);
    return 0;
  }
  if (strcmp(argv[1], "fork") == 0) {
    milestone();
    wait_go(1);
    const pid_t child = fork();
    if (child == 0) {
      for (;;) {
        pause();
      }
    }
    milestone();
    wait_go(2);
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    return 0;
  }
  if (strcmp(argv[1], "count") == 0 && argc == 3) {
    const long n = atol(argv[2]);
    milestone();
    wait_go(1);
    for (long i = 1; i <= n; ++i) {
      store_a((uint64_t)i);
      g_sink += load_a();
    }
    return 0;
  }
  fprintf(stderr, "bad arguments\n");
  return 2;
}
