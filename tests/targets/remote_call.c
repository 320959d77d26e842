// Fixture of remote calls (core/ptrace/remote_call.h): functions kwatch calls in one of this
// program's stopped threads, and modes that park threads where the tests need them. Every
// mode prints "ready" once parked, then its own results, line by line (line-buffered).
//
//   remote_call count N    prints "tick I" for I in 0..N-1 and "sum S" (S = the sum of I*I):
//                          the output a launched target gives with or without calls
//   remote_call hold       the main thread spins in hold_state(), which keeps a pattern in its
//                          red zone and in %xmm7 until `release` is set (by a call of
//                          clobber_and_release); prints "intact 1" when both survived
//   remote_call signals    the main thread waits in pause(); prints "usr1 N" and
//                          "usr2 V code C self S" once SIGUSR1 and SIGUSR2 (with its sigqueue
//                          value V, si_code C, sent by this process: S) have both arrived
//   remote_call lock       a worker holds `lock` until `asked` is set (take_lock sets it, then
//                          takes the lock); main joins it and prints "joined"
//   remote_call worker     a worker waits in pause() (tid printed as "worker TID"), main prints
//                          "ready" once the worker is past its printf, joins it and prints
//                          "joined" (exit_thread called in the worker ends it)
//   remote_call threads N  N workers allocate, free and sleep in a loop; main waits in pause()
//                          until SIGUSR1, then joins them and prints "joined N"
//   remote_call dliter N   N workers sleep in a loop; main waits in pause() inside a callback
//                          of dl_iterate_phdr (holding the loader's lock) until SIGUSR1, then
//                          joins them and prints "joined N"
//   remote_call calls N    prints "ready", waits in pause() until SIGUSR1, then calls
//                          add6(i, 0, 0, 0, 0, 0) for i in 0..N-1 and prints "sum S"
// --out FILE as the last two arguments sends stdout to FILE.
#define _GNU_SOURCE
#include <link.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

// ---- Called by the tests. ----

// Every argument in its own place: a wrong order gives another sum. Never inlined: "calls"
// probes it.
__attribute__((noinline)) long add6(long a, long b, long c, long d, long e, long f) {
  return a + 2 * b + 3 * c + 4 * d + 5 * e + 6 * f;
}

// rsp at the function's first instruction (the ABI: rsp + 8 a multiple of 16).
long entry_rsp(void);
__asm__(
    ".text\n"
    ".globl entry_rsp\n.type entry_rsp,@function\n"
    "entry_rsp:\n"
    "  mov %rsp,%rax\n"
    "  ret\n"
    ".size entry_rsp,.-entry_rsp\n");

volatile int release;

// Overwrites the stack below it and %xmm7, then lets hold_state() return.
long clobber_and_release(void) {
  volatile char junk[4096];
  memset((char*)junk, 0x5a, sizeof(junk));
  __asm__ volatile("pcmpeqd %%xmm7,%%xmm7" ::: "xmm7");
  release = 1;
  return 99 + junk[100] - 0x5a;
}

// Keeps 0x1111...0x8888 in its red zone and 0x77.. in %xmm7 until `release`; returns 1 when
// both are unchanged. A leaf function: it never moves rsp.
long hold_state(void);
__asm__(
    ".text\n"
    ".globl hold_state\n.type hold_state,@function\n"
    "hold_state:\n"
    "  mov $0x1111111111111111,%rax\n"
    "  mov $-128,%rcx\n"
    "1:\n"
    "  mov %rax,(%rsp,%rcx)\n"
    "  add $8,%rcx\n"
    "  jne 1b\n"
    "  mov $0x7777777777777777,%rax\n"
    "  movq %rax,%xmm7\n"
    "  punpcklqdq %xmm7,%xmm7\n"
    ".globl hold_spin\n.type hold_spin,@function\n"
    "hold_spin:\n"
    "  pause\n"
    "  cmpl $0,release(%rip)\n"
    "  je hold_spin\n"
    ".globl hold_check\n.type hold_check,@function\n"
    "hold_check:\n"
    "  mov $0x1111111111111111,%rax\n"
    "  mov $-128,%rcx\n"
    "3:\n"
    "  cmp %rax,(%rsp,%rcx)\n"
    "  jne 4f\n"
    "  add $8,%rcx\n"
    "  jne 3b\n"
    "  movq %xmm7,%rax\n"
    "  mov $0x7777777777777777,%rcx\n"
    "  cmp %rcx,%rax\n"
    "  jne 4f\n"
    "  pextrq $1,%xmm7,%rax\n"
    "  cmp %rcx,%rax\n"
    "  jne 4f\n"
    "  mov $1,%eax\n"
    "  ret\n"
    "4:\n"
    "  xor %eax,%eax\n"
    "  ret\n"
    ".size hold_state,.-hold_state\n");

// Two signals to this process from inside the call; returns 7.
long raise_both(long value) {
  kill(getpid(), SIGUSR1);
  union sigval v;
  v.sival_int = (int)value;
  sigqueue(getpid(), SIGUSR2, v);
  return 7;
}

long deref(long addr) {
  return *(volatile long*)addr;
}

long spin(void) {
  for (;;) {
    __asm__ volatile("pause");
  }
}

// Forks a child that exits 3; returns its exit status, or 100 + the signal that killed it.
long do_fork(void) {
  const pid_t child = fork();
  if (child == 0) {
    _exit(3);
  }
  int status = 0;
  if (child < 0 || waitpid(child, &status, 0) != child) {
    return -1;
  }
  return WIFSIGNALED(status) ? 100 + WTERMSIG(status) : WEXITSTATUS(status);
}

long exit_thread(void) {
  syscall(SYS_exit, 0);
  return 0;
}

// ---- Modes. ----

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static volatile int asked;
static volatile int holding;

long take_lock(void) {
  asked = 1;
  pthread_mutex_lock(&lock);
  pthread_mutex_unlock(&lock);
  return 5;
}

static void* lock_holder(void* arg) {
  (void)arg;
  pthread_mutex_lock(&lock);
  holding = 1;
  while (!asked) {
    usleep(1000);
  }
  pthread_mutex_unlock(&lock);
  return NULL;
}

static volatile int parked;

// Prints its tid, then tells main it is past printf: a worker stopped inside printf would
// hold stdout's lock, and a call that ends it there would leave main's printf waiting forever.
static void* pauser(void* arg) {
  (void)arg;
  printf("worker %ld\n", (long)syscall(SYS_gettid));
  __atomic_store_n(&parked, 1, __ATOMIC_SEQ_CST);
  for (;;) {
    pause();
  }
  return NULL;
}

static volatile int stop_workers;

// Workers leave SIGUSR1 to main (it waits for it in pause()).
static void block_usr1(void) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &set, NULL);
}

// Workers past their start: a new thread runs with every signal blocked until its start
// routine sets its own mask, so "ready" waits for all of them to be here.
static int workers_started;

static void worker_started(void) {
  __atomic_add_fetch(&workers_started, 1, __ATOMIC_SEQ_CST);
}

static void start_workers(pthread_t* t, int n, void* (*fn)(void*)) {
  for (int i = 0; i < n; ++i) {
    pthread_create(&t[i], NULL, fn, NULL);
  }
  while (__atomic_load_n(&workers_started, __ATOMIC_SEQ_CST) < n) {
    usleep(100);
  }
}

static void* allocator(void* arg) {
  (void)arg;
  block_usr1();
  worker_started();
  unsigned n = 0;
  while (!stop_workers) {
    void* volatile p = malloc(16 + (n++ % 64) * 8);
    free(p);
    usleep(100);
  }
  return NULL;
}

static void* sleeper(void* arg) {
  (void)arg;
  block_usr1();
  worker_started();
  while (!stop_workers) {
    usleep(1000);
  }
  return NULL;
}

static volatile sig_atomic_t usr1_count;

static int wait_in_callback(struct dl_phdr_info* info, size_t size, void* data) {
  (void)info;
  (void)size;
  (void)data;
  printf("ready\n");
  while (usr1_count == 0) {
    pause();
  }
  return 1;  // stop iterating
}
static volatile sig_atomic_t usr2_seen;
static volatile int usr2_value;
static volatile int usr2_code;
static volatile pid_t usr2_pid;

static void on_usr1(int sig) {
  (void)sig;
  ++usr1_count;
}

static void on_usr2(int sig, siginfo_t* si, void* uc) {
  (void)sig;
  (void)uc;
  usr2_value = si->si_value.sival_int;
  usr2_code = si->si_code;
  usr2_pid = si->si_pid;
  usr2_seen = 1;
}

int main(int argc, char** argv) {
  // --out FILE (last): stdout to FILE (a launched target shares its tracer's stdout).
  if (argc > 2 && strcmp(argv[argc - 2], "--out") == 0) {
    if (freopen(argv[argc - 1], "w", stdout) == NULL) {
      return 2;
    }
    argc -= 2;
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  const char* mode = argc > 1 ? argv[1] : "count";
  if (strcmp(mode, "count") == 0) {
    const long n = argc > 2 ? atol(argv[2]) : 3;
    long sum = 0;
    for (long i = 0; i < n; ++i) {
      printf("tick %ld\n", i);
      sum += i * i;
    }
    printf("sum %ld\n", sum);
    return 0;
  }
  if (strcmp(mode, "hold") == 0) {
    printf("ready\n");
    printf("intact %ld\n", hold_state());
    return 0;
  }
  if (strcmp(mode, "signals") == 0) {
    signal(SIGUSR1, on_usr1);
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = on_usr2;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGUSR2, &sa, NULL);
    printf("ready\n");
    while (usr1_count == 0 || !usr2_seen) {
      pause();
    }
    printf("usr1 %d\n", (int)usr1_count);
    printf("usr2 %d code %d self %d\n", usr2_value, usr2_code, usr2_pid == getpid());
    return 0;
  }
  if (strcmp(mode, "lock") == 0) {
    pthread_t t;
    pthread_create(&t, NULL, lock_holder, NULL);
    while (!holding) {
      usleep(1000);
    }
    printf("ready\n");
    pthread_join(t, NULL);
    printf("joined\n");
    return 0;
  }
  if (strcmp(mode, "worker") == 0) {
    pthread_t t;
    pthread_create(&t, NULL, pauser, NULL);
    while (!__atomic_load_n(&parked, __ATOMIC_SEQ_CST)) {
      usleep(100);
    }
    printf("ready\n");
    pthread_join(t, NULL);
    printf("joined\n");
    return 0;
  }
  if (strcmp(mode, "threads") == 0) {
    const int n = argc > 2 ? atoi(argv[2]) : 3;
    signal(SIGUSR1, on_usr1);
    pthread_t t[64];
    start_workers(t, n < 64 ? n : 64, allocator);
    printf("ready\n");
    while (usr1_count == 0) {
      pause();
    }
    stop_workers = 1;
    for (int i = 0; i < n && i < 64; ++i) {
      pthread_join(t[i], NULL);
    }
    printf("joined %d\n", n);
    return 0;
  }
  if (strcmp(mode, "calls") == 0) {
    const long n = argc > 2 ? atol(argv[2]) : 10;
    signal(SIGUSR1, on_usr1);
    printf("ready\n");
    while (usr1_count == 0) {
      pause();
    }
    long sum = 0;
    for (long i = 0; i < n; ++i) {
      sum += add6(i, 0, 0, 0, 0, 0);
    }
    printf("sum %ld\n", sum);
    return 0;
  }
  if (strcmp(mode, "dliter") == 0) {
    const int n = argc > 2 ? atoi(argv[2]) : 1;
    signal(SIGUSR1, on_usr1);
    pthread_t t[64];
    start_workers(t, n < 64 ? n : 64, sleeper);
    dl_iterate_phdr(wait_in_callback, NULL);
    stop_workers = 1;
    for (int i = 0; i < n && i < 64; ++i) {
      pthread_join(t[i], NULL);
    }
    printf("joined %d\n", n);
    return 0;
  }
  fprintf(stderr, "unknown mode %s\n", mode);
  return 2;
}
