// fetch_edges: values at the edges of what a probe argument shows, for the fetch tests of the
// in-process agent (tests/core/probe/agent_fetch_test.cc). Each function is called once with
// known arguments (built with -O1 as fetch_edges, and -O2 as fetch_edges_o2):
//
//   strings(s255, s256, s257, s300, edge, gone, quoted)
//       strings of 255, 256, 257 and 300 bytes ("abc...z" repeated); edge: "tail" at the end
//       of a page whose next page is unmapped (no NUL); gone: that unmapped page; quoted:
//       "tab\t nl\n \"q\" \\ \x01 \xc3\xa9"
//   bits(p)             p->neg = -3, p->pos = 5, p->wide = 100000, p->flag = 1, p->id = 42
//   floats(f, d)        f = -1.25f, d = 3.5e10
//   pair(v, w)          two 16-byte structs by value: v = {7, -9}, w = {11, 13}
//   smalls(c, uc, s, us, i, ul)   -5, 250, -300, 60000, -70000, 2^63 + 1
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

struct bits {
  long id;
  int neg : 4;
  unsigned pos : 3;
  unsigned wide : 20;
  unsigned flag : 1;
};

struct two {
  long a;
  long b;
};

static char g_s255[256];
static char g_s256[257];
static char g_s257[258];
static char g_s300[301];
static const char* g_quoted = "tab\t nl\n \"q\" \\ \x01 \xc3\xa9";
long g_sink;

__attribute__((noipa)) long strings(const char* s255, const char* s256, const char* s257,
                                    const char* s300, const char* edge, const char* gone,
                                    const char* quoted) {
  return (long)strlen(s255) + (long)strlen(s256) + (long)strlen(s257) + (long)strlen(s300) +
         (edge != gone) + (long)strlen(quoted);
}

__attribute__((noipa)) long bits(const struct bits* p) {
  return p->id + p->neg + p->pos + p->wide + p->flag;
}

__attribute__((noipa)) double floats(float f, double d) {
  return f + d;
}

__attribute__((noipa)) long pair(struct two v, struct two w) {
  g_sink = v.a * w.b;
  return v.a + v.b + w.a + w.b;
}

__attribute__((noipa)) long smalls(signed char c, unsigned char uc, short s, unsigned short us,
                                   int i, unsigned long ul) {
  return c + uc + s + us + i + (long)(ul & 1);
}

static void fill(char* buf, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    buf[i] = (char)('a' + i % 26);
  }
  buf[n] = 0;
}

int main(void) {
  fill(g_s255, 255);
  fill(g_s256, 256);
  fill(g_s257, 257);
  fill(g_s300, 300);
  const long page = sysconf(_SC_PAGESIZE);
  char* two_pages = mmap(NULL, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (two_pages == MAP_FAILED || munmap(two_pages + page, page) != 0) {
    perror("fetch_edges: mmap");
    return 1;
  }
  char* edge = two_pages + page - 4;
  memcpy(edge, "tail", 4);  // no NUL: the next page is gone
  long sum = strings(g_s255, g_s256, g_s257, g_s300, edge, two_pages + page, g_quoted);
  struct bits b = {.id = 42, .neg = -3, .pos = 5, .wide = 100000, .flag = 1};
  sum += bits(&b);
  const double f = floats(-1.25f, 3.5e10);
  struct two v = {7, -9};
  struct two w = {11, 13};
  sum += pair(v, w);
  sum += smalls(-5, 250, -300, 60000, -70000, (1UL << 63) + 1);
  printf("sum=%ld f=%g sink=%ld\n", sum, f, g_sink);
  return 0;
}
