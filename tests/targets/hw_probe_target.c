// A fixture for `kwatch probe --hw` (execute breakpoints in the debug registers).
//
// usage: hw_probe_target run N               hw_tick(i, &g_rec) for i = 0..N-1, then hw_done()
//        hw_probe_target threads T N GOFILE  T threads (started by main, after kwatch armed the
//                                            probes) each call hw_tick for i = 0..N-1; once all
//                                            are done main prints "ready", then every thread
//                                            waits for GOFILE (60 s at most) and ends
//        hw_probe_target forge N             N calls of hw_tick(k, &g_rec), k = 0..N-1, each
//                                            entered through a forged execute-breakpoint trap
//                                            (below), after a SIGUSR1 milestone and a wait for
//                                            g_go >= k + 1 (the tracer writes g_go)
//        hw_probe_target burst N             N forged calls back to back, after one milestone
//                                            (g_go >= 1)
// forge and burst end with one more milestone (g_go one higher), g_sink holding the sum.
// Each mode prints "sum=S traps=K": S the sum of hw_tick's results (3i + 100 each), K the
// SIGTRAPs the program itself received (0 when a tracer claimed every forged trap).
//
// The forged trap: the program makes the stop an execute breakpoint of kwatch's on hw_tick
// makes, with the breakpoint data the tracer chose (g_sig_data). kw_forge_call(i, r, pid, tid)
// sends itself SIGUSR2; the handler queues a SIGTRAP with si_code TRAP_PERF and g_sig_data as
// its perf data (SIGTRAP is blocked in the handler), then turns its return into a call of
// hw_tick(i, r): the return address pushed, %rdi/%rsi set, %rip at hw_tick, and EFLAGS.RF
// set as the kernel sets it for an execute breakpoint. The SIGTRAP is delivered when the handler returns, at hw_tick's first
// instruction with the registers of the call, before that instruction runs; RF keeps a real
// execute breakpoint there from firing a second time.
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

struct hw_rec {
  long id;
  unsigned len;
  const char* name;
};

struct hw_rec g_rec = {7, 100, "hw"};
volatile uint64_t g_go;
volatile long g_traps;
volatile long g_sink;
volatile uint64_t g_sig_data;  // the forged traps' perf data, written by the tracer
static const char* g_gofile;
static volatile int g_done_threads;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

__attribute__((noinline)) long hw_tick(long i, struct hw_rec* r) {
  __asm__ volatile("" ::: "memory");
  return 3 * i + r->len;
}

__attribute__((noinline)) void hw_done(long sum) {
  __asm__ volatile("" ::: "memory");
  g_sink = sum;
}

// kw_forge_call(i, r, pid, tid): tgkill(pid, tid, SIGUSR2); the handler makes the rest of the
// call (see above); returns hw_tick's result.
extern long kw_forge_call(long i, struct hw_rec* r, long pid, long tid);
__asm__(
    ".text\n"
    ".globl kw_forge_call\n"
    ".type kw_forge_call, @function\n"
    "kw_forge_call:\n"
    "  subq $8, %rsp\n"  // hw_tick is entered with %rsp = 8 mod 16, as after a call
    "  movq %rdi, %r8\n"
    "  movq %rsi, %r9\n"
    "  movq %rdx, %rdi\n"
    "  movq %rcx, %rsi\n"
    "  movl $12, %edx\n"   // SIGUSR2
    "  movl $234, %eax\n"  // SYS_tgkill
    "  syscall\n"
    "  addq $8, %rsp\n"  // hw_tick returns here
    "  ret\n"
    ".size kw_forge_call, .-kw_forge_call\n");

static void on_usr1(int sig) {
  (void)sig;
}

static void on_trap(int sig) {
  (void)sig;
  g_traps = g_traps + 1;
}

static void on_usr2(int sig, siginfo_t* si, void* ucv) {
  (void)sig;
  (void)si;
  ucontext_t* uc = ucv;
  greg_t* g = uc->uc_mcontext.gregs;
  siginfo_t t;
  memset(&t, 0, sizeof(t));
  t.si_signo = SIGTRAP;
  t.si_code = 6;  // TRAP_PERF
  t.si_addr = (void*)hw_tick;
  const uint64_t data = g_sig_data;
  memcpy((char*)&t + 24, &data, sizeof(data));  // si_perf_data (_sigfault._perf._data)
  syscall(SYS_rt_tgsigqueueinfo, getpid(), gettid(), SIGTRAP, &t);
  // call hw_tick(%r8, %r9), returning to the instruction after the syscall.
  g[REG_RSP] -= 8;
  *(greg_t*)g[REG_RSP] = g[REG_RIP];
  g[REG_RDI] = g[REG_R8];
  g[REG_RSI] = g[REG_R9];
  g[REG_RIP] = (greg_t)hw_tick;
  g[REG_EFL] |= 0x10000;  // RF
}

static void wait_go(uint64_t step) {
  while (g_go < step) {
    usleep(1000);
  }
}

static void wait_file(void) {
  for (int waited = 0; access(g_gofile, F_OK) != 0 && waited < 6000; waited++) {
    usleep(10000);
  }
}

static long thread_n;

static void* worker(void* arg) {
  long* sum = arg;
  for (long i = 0; i < thread_n; i++) {
    *sum += hw_tick(i, &g_rec);
  }
  pthread_mutex_lock(&g_lock);
  g_done_threads++;
  pthread_mutex_unlock(&g_lock);
  wait_file();
  return NULL;
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: hw_probe_target run N | threads T N GOFILE | forge N | burst N\n");
    return 2;
  }
  signal(SIGUSR1, on_usr1);
  signal(SIGTRAP, on_trap);
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_sigaction = on_usr2;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  sigaddset(&sa.sa_mask, SIGTRAP);
  sigaction(SIGUSR2, &sa, NULL);

  long sum = 0;
  if (strcmp(argv[1], "run") == 0) {
    const long n = atol(argv[2]);
    for (long i = 0; i < n; i++) {
      sum += hw_tick(i, &g_rec);
    }
  } else if (strcmp(argv[1], "threads") == 0 && argc == 5) {
    const int t = atoi(argv[2]);
    thread_n = atol(argv[3]);
    g_gofile = argv[4];
    pthread_t* th = calloc((size_t)t, sizeof(pthread_t));
    long* sums = calloc((size_t)t, sizeof(long));
    for (int k = 0; k < t; k++) {
      pthread_create(&th[k], NULL, worker, &sums[k]);
    }
    for (;;) {
      pthread_mutex_lock(&g_lock);
      const int done = g_done_threads;
      pthread_mutex_unlock(&g_lock);
      if (done == t) {
        break;
      }
      usleep(1000);
    }
    for (int k = 0; k < t; k++) {
      sum += sums[k];
    }
    printf("ready\n");
    fflush(stdout);
    for (int k = 0; k < t; k++) {
      pthread_join(th[k], NULL);
    }
    free(th);
    free(sums);
  } else if (strcmp(argv[1], "forge") == 0 || strcmp(argv[1], "burst") == 0) {
    const long n = atol(argv[2]);
    const int each = strcmp(argv[1], "forge") == 0;
    uint64_t step = 0;
    for (long k = 0; k < n; k++) {
      if (each || k == 0) {
        raise(SIGUSR1);
        wait_go(++step);
      }
      sum += kw_forge_call(k, &g_rec, getpid(), gettid());
    }
    g_sink = sum;
    raise(SIGUSR1);  // the tracer reads g_traps and g_sink here
    wait_go(++step);
  } else {
    fprintf(stderr, "bad arguments\n");
    return 2;
  }
  hw_done(sum);
  printf("sum=%ld traps=%ld\n", sum, (long)g_traps);
  return 0;
}
