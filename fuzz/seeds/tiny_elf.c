struct item { long id; unsigned len; struct item* next; int values[4]; };
struct item g_items[2];
long g_total;
__attribute__((noipa)) long sum_item(struct item* p) {
  long t = 0;
  for (unsigned i = 0; i < 4; ++i) t += p->values[i];
  return t + p->id;
}
void _start(void) { g_total = sum_item(&g_items[0]); for (;;) {} }
