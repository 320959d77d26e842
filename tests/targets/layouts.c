// A fixture with data of every shape, for symbol, type-layout and symbolizer tests:
// nested structs, arrays of structs, bitfields, unions, anonymous members, typedefs,
// pointers to structs, a function-static and a file-static variable, a thread-local.
//
//   layouts           touch every variable once and exit 0
//   layouts --wait    print "ready PID", then "addr NAME 0xADDR" lines with run-time
//                     addresses for the tests to compare with, then "done", and pause
//                     until killed
//
// The tests copy these definitions to compute expected offsets: keep them in sync with
// tests/core/symbols_test.cc.
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>
#include <unistd.h>

struct inner {
  int a;
  int b;
};

struct stats {
  long hits;
  int misses;
  short flags;
  char tag[8];
  unsigned mode : 3;
  unsigned ready : 1;
  unsigned level : 12;
  struct inner inner;
  union {
    int as_int;
    float as_float;
  } u;
  struct {  // anonymous member: x and y are members of struct stats
    short x;
    short y;
  };
};

struct line {
  unsigned long tag;
  unsigned char valid : 1;
  unsigned char dirty : 1;
  short owner;
  long data[2];
};

struct cache {
  int nlines;
  struct line lines[4];
  struct cache* next;
};

typedef struct cache cache_t;
typedef unsigned long counter_t;

union value {
  long l;
  double d;
  unsigned char bytes[8];
};

struct stats g_stats;
struct line g_lines[3];
cache_t g_cache;
cache_t g_cache2;
cache_t* cache = &g_cache;
struct cache* g_null_cache;
struct line* g_line_ptr = &g_lines[1];
union value g_value;
int g_matrix[3][4];
long g_big[1000];
volatile struct inner g_vrows[4];  // GCC: volatile -> array -> volatile -> struct
counter_t g_counter;
const char* g_name = "layouts";
static int s_file_static;
__thread int t_tls;

// Returns the address of its function-static counter after bumping it.
__attribute__((noinline)) int* BumpCalls(void) {
  static int calls;
  ++calls;
  return &calls;
}

__attribute__((noinline)) void StoreHits(long v) {
  g_stats.hits = v; /* LINE_MARKER */
}

__attribute__((noinline)) int LoadMisses(void) { return g_stats.misses; }

__attribute__((noinline)) void IncCounter(void) { g_counter++; }

// An inlined function, for the symbolizer's "X inlined in Y".
static inline __attribute__((always_inline)) void ScaleHits(long v) {
  g_stats.hits = v * 3; /* INLINE_MARKER */
}

__attribute__((noinline)) void StoreScaled(long v) {
  ScaleHits(v + 1);
  g_counter += 2;
}

static void Touch(int seed) {
  StoreHits(seed);
  g_stats.misses = seed + 1;
  g_stats.mode = (unsigned)seed & 7u;
  g_stats.ready = 1;
  g_stats.x = (short)seed;
  strcpy(g_stats.tag, "tag");
  g_lines[2].data[1] = seed;
  g_cache.nlines = 4;
  g_cache.next = &g_cache2;
  g_cache2.nlines = 2;
  g_value.l = seed;
  g_matrix[2][3] = seed;
  g_big[999] = seed;
  g_vrows[3].a = seed;
  IncCounter();
  StoreScaled(seed);
  s_file_static += seed + LoadMisses();
  t_tls = seed;
}

int main(int argc, char** argv) {
  Touch(argc);
  int* calls = BumpCalls();
  if (argc > 1 && strcmp(argv[1], "--wait") == 0) {
    printf("ready %d\n", (int)getpid());
    printf("addr g_stats %p\n", (void*)&g_stats);
    printf("addr g_stats.hits %p\n", (void*)&g_stats.hits);
    printf("addr g_cache %p\n", (void*)&g_cache);
    printf("addr g_cache.lines[2].data[1] %p\n", (void*)&g_cache.lines[2].data[1]);
    printf("addr g_cache2.nlines %p\n", (void*)&g_cache2.nlines);
    printf("addr g_lines[2].owner %p\n", (void*)&g_lines[2].owner);
    printf("addr calls %p\n", (void*)calls);
    printf("addr s_file_static %p\n", (void*)&s_file_static);
    printf("addr StoreHits %p\n", (void*)&StoreHits);
    printf("done\n");
    fflush(stdout);
    for (;;) {
      pause();
    }
  }
  return s_file_static == 0 ? 1 : 0;
}
