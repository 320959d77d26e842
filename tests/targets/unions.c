// Unions and values of each numeric kind, for the storage profile's counting (an access to a
// union counts once, on the union, whichever member it went through) and for how values read
// (signed, unsigned, float, double, pointer).
//
//   unions N    N rounds (default 3); round k = 1..N writes, one store each:
//               g_rec.u.i = k, g_rec.u.p.lo = -k (both the union u), g_rec.a = 10k (the
//               anonymous union {a,b}), g_rec.f = 0.5k, g_rec.d = -0.25k, g_rec.neg = -k,
//               g_rec.uc = 250 + k, g_rec.ptr = &g_target (k odd) or NULL (k even)
#include <stdlib.h>

struct rec {
  union {
    int i;
    float f;
    struct {
      short lo;
      short hi;
    } p;
  } u;
  union {  // anonymous: a and b are members of struct rec
    long a;
    double b;
  };
  float f;
  double d;
  int neg;
  unsigned char uc;
  int* ptr;
};

volatile struct rec g_rec;  // volatile: -O1 keeps every store
int g_target;

int main(int argc, char** argv) {
  const int n = argc > 1 ? atoi(argv[1]) : 3;
  for (int k = 1; k <= n; ++k) {
    g_rec.u.i = k;
    g_rec.u.p.lo = (short)-k;
    g_rec.a = 10L * k;
    g_rec.f = 0.5f * (float)k;
    g_rec.d = -0.25 * k;
    g_rec.neg = -k;
    g_rec.uc = (unsigned char)(250 + k);
    g_rec.ptr = k % 2 != 0 ? &g_target : NULL;
  }
  return 0;
}
