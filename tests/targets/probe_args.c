// probe_args: a fixture for probe points and fetch arguments (perf probe syntax). Every
// function is called a known number of times with known arguments:
//
//   add_ints(a, b)          5 calls: (i, 10 * i) for i = 0..4          returns a + b
//   sum_item(p)             3 calls: &g_items[0], &g_items[1], then from local_item
//   name_len(name, limit)   1 call:  ("hello probe", 64)                returns 11
//   scale(x, factor)        2 calls: (1.5, 2), (-0.25, 8)               returns x * factor
//   fact(n)                 fact(5): 5 calls, n = 5, 4, 3, 2, 1         returns n!
//   many_args(a..h)         1 call:  (1, 2, 3, 4, 5, 6, 70, 80)         g and h on the stack
//   local_item(id)          1 call:  id = 303, a struct item on its stack
//   loop_lines(n)           1 call:  n = 4; its loop body line runs 4 times (i = 0..3)
//
// Lines marked "PROBE:" are looked up by the tests by their text.
#include <stdio.h>
#include <string.h>

struct item {
  long id;
  unsigned len;
  short flags;
  unsigned char kind : 3;
  unsigned char hot : 1;
  const char* label;
  struct item* next;
  int values[4];
};

struct item g_items[2] = {
    {.id = 101,
     .len = 3,
     .flags = -2,
     .kind = 5,
     .hot = 1,
     .label = "first",
     .next = &g_items[1],
     .values = {1, 2, 3, 4}},
    {.id = 202,
     .len = 7,
     .flags = 5,
     .kind = 2,
     .label = "second",
     .next = 0,
     .values = {10, 20, 30, 40}},
};
long g_total;

__attribute__((noipa)) int add_ints(int a, int b) {
  return a + b;
}

__attribute__((noipa)) long sum_item(struct item* p) {
  long total = 0;
  for (unsigned i = 0; i < 4; ++i) {
    total += p->values[i];
  }
  return total + p->id;
}

__attribute__((noipa)) size_t name_len(const char* name, int limit) {
  size_t n = strlen(name);
  return n < (size_t)limit ? n : (size_t)limit;
}

__attribute__((noipa)) double scale(double x, int factor) {
  return x * factor;
}

__attribute__((noipa)) int fact(int n) {
  if (n <= 1) {
    return 1;
  }
  return n * fact(n - 1);
}

__attribute__((noipa)) long many_args(long a, long b, long c, long d, long e, long f, long g,
                                      long h) {
  return a + b + c + d + e + f + g + h;
}

__attribute__((noipa)) long local_item(long id) {
  struct item local = {.id = id, .len = 9, .label = "local", .values = {5, 6, 7, 8}};
  return sum_item(&local);  // PROBE: local_item call
}

__attribute__((noipa)) long tick(long v) {
  g_total += v;
  return v;
}

__attribute__((noipa)) long loop_lines(int n) {
  long acc = 0;

  // PROBE: no code on this line or the one above
  for (int i = 0; i < n; ++i) {
    acc += tick(i) * 3;  // PROBE: loop body
  }
  return acc;
}

int main(void) {
  long sum = 0;
  for (int i = 0; i < 5; ++i) {
    sum += add_ints(i, 10 * i);
  }
  sum += sum_item(&g_items[0]);
  sum += sum_item(&g_items[1]);
  sum += (long)name_len("hello probe", 64);
  const double s = scale(1.5, 2) + scale(-0.25, 8);
  sum += fact(5);
  sum += many_args(1, 2, 3, 4, 5, 6, 70, 80);
  sum += local_item(303);
  sum += loop_lines(4);
  printf("sum=%ld scaled=%g total=%ld\n", sum, s, g_total);
  return 0;
}
