// Fixture of the INT3 probe engine: functions called a known number of times with known
// arguments, some written in assembly so that the probed instruction is known exactly.
//
//   probe_engine basic [--out FILE]       every probe kind once (see RunBasic); prints results
//   probe_engine threads T N [--out FILE] T threads each call hot(i) for i in 0..N-1
//   probe_engine fork [--out FILE]        work() 100 times; spawn() forks at i == 50; the child
//                                         calls work() 10 times and exits 0
//   probe_engine rawfork [--out FILE]     a fork through raw_fork (the syscall at
//                                         raw_fork_syscall); the child exits 0
//   probe_engine exec N M [--out FILE]    work() N times, then execs itself as "after-exec M"
//   probe_engine after-exec M [--out F]   work() and deref() M times
//   probe_engine fault [--out FILE]       deref(NULL) with a SIGSEGV handler, deref(&x) twice
//   probe_engine spin [--out FILE]        a thread waits inside blocker(); main calls work()
//                                         until SIGUSR1; then blocker returns 42
//   probe_engine bench WHICH N T          T threads each call bench_emul / bench_xol (WHICH
//                                         "emul", "xol", "none") N times
// --out FILE sends stdout to FILE (a launched target shares the tracer's stdout otherwise).
#define _GNU_SOURCE
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

// ---- Assembly functions: the probed instruction of each is fixed. ----
int rip_counter;  // incremented by rip_inc's first instruction (RIP-relative)

long callee(long x);
long call_site_fn(long x);
long jcc_fn(long x);
long emul_fn(long x);
void rip_inc(void);
long syscall_getpid(void);
long raw_fork(void);
long has_int3(void);
int deref(const int* p);
long bench_emul(long x);
long bench_xol(long x);

__asm__(
    ".text\n"
    // callee(x) = x + 5
    ".globl callee\n.type callee,@function\n"
    "callee:\n"
    "  lea 5(%rdi),%rax\n"
    "  ret\n"
    ".size callee,.-callee\n"
    // call_site_fn(x) = callee(x) * 2; the call is at call_site
    ".globl call_site_fn\n.type call_site_fn,@function\n"
    "call_site_fn:\n"
    "  push %rbp\n"
    "  mov %rsp,%rbp\n"
    ".globl call_site\n.type call_site,@function\n"
    "call_site:\n"
    "  call callee\n"
    "  add %rax,%rax\n"
    "  pop %rbp\n"
    "  ret\n"
    ".size call_site_fn,.-call_site_fn\n"
    // jcc_fn(x) = x < 10 ? 1 : 2; the conditional jump is at jcc_site
    ".globl jcc_fn\n.type jcc_fn,@function\n"
    "jcc_fn:\n"
    "  cmp $10,%rdi\n"
    ".globl jcc_site\n.type jcc_site,@function\n"
    "jcc_site:\n"
    "  jl 1f\n"
    "  mov $2,%eax\n"
    "  ret\n"
    "1:\n"
    "  mov $1,%eax\n"
    "  ret\n"
    ".size jcc_fn,.-jcc_fn\n"
    // emul_fn(x) = x * 2 + 7: its first instruction (mov %rdi,%rax) is emulated
    ".globl emul_fn\n.type emul_fn,@function\n"
    "emul_fn:\n"
    "  mov %rdi,%rax\n"
    "  sub $-7,%rax\n"
    "  add %rdi,%rax\n"
    "  ret\n"
    ".size emul_fn,.-emul_fn\n"
    // rip_inc(): rip_counter++ with a RIP-relative first instruction
    ".globl rip_inc\n.type rip_inc,@function\n"
    "rip_inc:\n"
    "  addl $1,rip_counter(%rip)\n"
    "  ret\n"
    ".size rip_inc,.-rip_inc\n"
    // syscall_getpid(): getpid through a syscall instruction at syscall_site
    ".globl syscall_getpid\n.type syscall_getpid,@function\n"
    "syscall_getpid:\n"
    "  mov $39,%eax\n"
    ".globl syscall_site\n.type syscall_site,@function\n"
    "syscall_site:\n"
    "  syscall\n"
    "  ret\n"
    ".size syscall_getpid,.-syscall_getpid\n"
    // raw_fork(): fork(2) without libc, the syscall at raw_fork_syscall
    ".globl raw_fork\n.type raw_fork,@function\n"
    "raw_fork:\n"
    "  mov $57,%eax\n"
    ".globl raw_fork_syscall\n.type raw_fork_syscall,@function\n"
    "raw_fork_syscall:\n"
    "  syscall\n"
    "  ret\n"
    ".size raw_fork,.-raw_fork\n"
    // has_int3(): never called; its first instruction is an int3
    ".globl has_int3\n.type has_int3,@function\n"
    "has_int3:\n"
    "  int3\n"
    "  ret\n"
    ".size has_int3,.-has_int3\n"
    // deref(p) = *p: the load is the first instruction
    ".globl deref\n.type deref,@function\n"
    "deref:\n"
    "  mov (%rdi),%eax\n"
    "  ret\n"
    ".size deref,.-deref\n"
    // bench_emul(x) = x + 1, first instruction emulated (register move)
    ".globl bench_emul\n.type bench_emul,@function\n"
    "bench_emul:\n"
    "  mov %rdi,%rax\n"
    "  add $1,%rax\n"
    "  ret\n"
    ".size bench_emul,.-bench_emul\n"
    // bench_xol(x) = x + 1, first instruction (push %rbp) run out of line
    ".globl bench_xol\n.type bench_xol,@function\n"
    "bench_xol:\n"
    "  push %rbp\n"
    "  mov %rsp,%rbp\n"
    "  lea 1(%rdi),%rax\n"
    "  pop %rbp\n"
    "  ret\n"
    ".size bench_xol,.-bench_xol\n");

// ---- C functions. ----
__attribute__((noinline)) long work(long i) {
  __asm__ volatile("" ::: "memory");
  return 3 * i + 1;
}

__attribute__((noinline)) long hot(long i) {
  __asm__ volatile("" ::: "memory");
  return i ^ 0x55;
}

__attribute__((noinline)) long fact(long n) {
  __asm__ volatile("" ::: "memory");
  if (n <= 1) {
    return 1;
  }
  return n * fact(n - 1);
}

static jmp_buf g_jump;

// Returns v + 1, or longjmps out when `jump`.
__attribute__((noinline)) long maybe_jump(long v, int jump) {
  __asm__ volatile("" ::: "memory");
  if (jump) {
    longjmp(g_jump, 1);
  }
  return v + 1;
}

static void RunBasic(void) {
  long sum = 0;
  for (long i = 0; i < 1000; i++) {
    sum += work(i);
  }
  printf("work sum %ld\n", sum);
  printf("fact(10) %ld\n", fact(10));
  long calls = 0;
  for (long i = 0; i < 300; i++) {
    calls += call_site_fn(i);
  }
  printf("call_site_fn sum %ld\n", calls);
  long jcc = 0;
  for (long i = 0; i < 20; i++) {
    jcc += jcc_fn(i);
  }
  printf("jcc_fn sum %ld\n", jcc);
  long emul = 0;
  for (long i = 0; i < 400; i++) {
    emul += emul_fn(i);
  }
  printf("emul_fn sum %ld\n", emul);
  for (int i = 0; i < 500; i++) {
    rip_inc();
  }
  printf("rip_counter %d\n", rip_counter);
  int pid_ok = 1;
  for (int i = 0; i < 10; i++) {
    pid_ok &= syscall_getpid() == getpid();
  }
  printf("syscall_getpid ok %d\n", pid_ok);
  long jumped = 0;
  long returned = 0;
  for (long i = 0; i < 10; i++) {
    if (setjmp(g_jump) == 0) {
      returned += maybe_jump(i, (int)(i % 2));
    } else {
      jumped++;
    }
  }
  returned += maybe_jump(100, 0);
  printf("maybe_jump returned %ld jumped %ld\n", returned, jumped);
}

static long g_iters;

static void* ThreadMain(void* arg) {
  long sum = 0;
  for (long i = 0; i < g_iters; i++) {
    sum += hot(i);
  }
  (void)arg;
  return (void*)sum;
}

static int RunThreads(long threads, long iters) {
  if (threads < 1 || threads > 64) {
    fprintf(stderr, "probe_engine: 1..64 threads\n");
    return 2;
  }
  g_iters = iters;
  pthread_t tids[64];
  for (long t = 0; t < threads; t++) {
    pthread_create(&tids[t], NULL, ThreadMain, NULL);
  }
  long total = 0;
  for (long t = 0; t < threads; t++) {
    void* ret = NULL;
    pthread_join(tids[t], &ret);
    total += (long)ret;
  }
  printf("threads total %ld\n", total);
  return 0;
}

// Forks; returns the child's pid in the parent and 0 in the child.
__attribute__((noinline)) long spawn(void) {
  fflush(stdout);
  return fork();
}

static int RunFork(void) {
  long sum = 0;
  pid_t child = -1;
  for (long i = 0; i < 100; i++) {
    sum += work(i);
    if (i == 50) {
      child = (pid_t)spawn();
      if (child == 0) {
        long csum = 0;
        for (long j = 0; j < 10; j++) {
          csum += work(j);
        }
        _exit(csum == 145 ? 0 : 1);
      }
    }
  }
  int status = 0;
  waitpid(child, &status, 0);
  printf("work sum %ld\n", sum);
  printf("child exited %d signaled %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1,
         WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  return 0;
}

static int RunRawFork(void) {
  fflush(stdout);
  const long child = raw_fork();
  if (child == 0) {
    _exit(syscall_getpid() == getpid() ? 0 : 1);
  }
  int status = 0;
  waitpid((pid_t)child, &status, 0);
  printf("raw child exited %d signaled %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1,
         WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  return 0;
}

static int RunExec(const char* self, long n, long m) {
  long sum = 0;
  for (long i = 0; i < n; i++) {
    sum += work(i);
  }
  printf("before exec sum %ld\n", sum);
  fflush(stdout);
  char count[32];
  snprintf(count, sizeof(count), "%ld", m);
  execl(self, "probe_engine", "after-exec", count, (char*)NULL);
  perror("execl");
  return 1;
}

static sigjmp_buf g_segv_jump;

static void OnSegv(int sig) {
  (void)sig;
  siglongjmp(g_segv_jump, 1);
}

static int RunFault(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = OnSegv;
  sigaction(SIGSEGV, &sa, NULL);
  int x = 42;
  volatile int caught = 0;
  volatile int value = deref(&x);
  if (sigsetjmp(g_segv_jump, 1) == 0) {
    value += deref(NULL);
  } else {
    caught = 1;
  }
  value += deref(&x);
  printf("fault caught %d value %d\n", caught, value);
  return 0;
}

static volatile sig_atomic_t g_stop;

static void OnUsr1(int sig) {
  (void)sig;
  g_stop = 1;
}

// Waits until SIGUSR1, then returns 42.
__attribute__((noinline)) long blocker(void) {
  while (!g_stop) {
    usleep(1000);
  }
  return 42;
}

static void* BlockerMain(void* arg) {
  (void)arg;
  return (void*)blocker();
}

static int RunSpin(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = OnUsr1;
  sigaction(SIGUSR1, &sa, NULL);
  pthread_t t;
  pthread_create(&t, NULL, BlockerMain, NULL);
  long iters = 0;
  long sum = 0;
  while (!g_stop) {
    sum += work(iters) + emul_fn(iters);
    rip_inc();
    iters++;
  }
  void* ret = NULL;
  pthread_join(t, &ret);
  // work(i) + emul_fn(i) = 5i + 8.
  const int ok = sum == 5 * (iters * (iters - 1) / 2) + 8 * iters && rip_counter == iters;
  printf("spin ok %d blocker %ld\n", ok, (long)ret);
  return 0;
}

static int RunBench(const char* which, long n, long threads);

int main(int argc, char** argv) {
  // --out FILE, anywhere after the mode.
  for (int i = 1; i + 1 < argc; i++) {
    if (strcmp(argv[i], "--out") == 0) {
      if (freopen(argv[i + 1], "w", stdout) == NULL) {
        perror("freopen");
        return 2;
      }
      for (int j = i; j + 2 <= argc; j++) {
        argv[j] = argv[j + 2];
      }
      argc -= 2;
      break;
    }
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  const char* mode = argc > 1 ? argv[1] : "basic";
  if (strcmp(mode, "basic") == 0) {
    RunBasic();
    return 0;
  }
  if (strcmp(mode, "threads") == 0 && argc > 3) {
    return RunThreads(atol(argv[2]), atol(argv[3]));
  }
  if (strcmp(mode, "fork") == 0) {
    return RunFork();
  }
  if (strcmp(mode, "rawfork") == 0) {
    return RunRawFork();
  }
  if (strcmp(mode, "exec") == 0 && argc > 3) {
    return RunExec("/proc/self/exe", atol(argv[2]), atol(argv[3]));
  }
  if (strcmp(mode, "after-exec") == 0 && argc > 2) {
    long sum = 0;
    const int zero = 0;
    for (long i = 0; i < atol(argv[2]); i++) {
      sum += work(i) + deref(&zero);  // deref: a load, run out of line when probed
    }
    printf("after exec sum %ld\n", sum);
    return 0;
  }
  if (strcmp(mode, "fault") == 0) {
    return RunFault();
  }
  if (strcmp(mode, "spin") == 0) {
    return RunSpin();
  }
  if (strcmp(mode, "bench") == 0 && argc > 4) {
    return RunBench(argv[2], atol(argv[3]), atol(argv[4]));
  }
  fprintf(stderr, "probe_engine: unknown mode or missing arguments\n");
  return 2;
}

// ---- Bench mode. ----
static long (*g_bench_fn)(long);

static void* BenchMain(void* arg) {
  long sum = 0;
  for (long i = 0; i < g_iters; i++) {
    sum += g_bench_fn(i);
  }
  (void)arg;
  return (void*)sum;
}

static int RunBench(const char* which, long n, long threads) {
  if (strcmp(which, "emul") == 0) {
    g_bench_fn = bench_emul;
  } else if (strcmp(which, "xol") == 0) {
    g_bench_fn = bench_xol;
  } else {
    g_bench_fn = bench_emul;  // "none": the same call, left unprobed
  }
  if (threads < 1 || threads > 64) {
    return 2;
  }
  g_iters = n;
  pthread_t tids[64];
  for (long t = 0; t < threads; t++) {
    pthread_create(&tids[t], NULL, BenchMain, NULL);
  }
  long total = 0;
  for (long t = 0; t < threads; t++) {
    void* ret = NULL;
    pthread_join(tids[t], &ret);
    total += (long)ret;
  }
  printf("bench total %ld\n", total);
  return 0;
}
