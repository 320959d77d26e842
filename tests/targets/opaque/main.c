// An opaque handle, as C libraries hand them out (ZSTD_CCtx, FILE, sqlite3): this unit only
// declares `struct handle`; handle.c defines it. `g_handle->counter` resolves only through the
// definition in the other unit. Usage: opaque [BUMPS] (default 5): bumps the counter BUMPS times
// through the handle and prints "bumped N" on stderr. Both units also have a file static
// `bumps` and a function static `calls` (in tick and handle_count): names that need a file or a
// function to be told apart.
#include <stdio.h>
#include <stdlib.h>

struct handle;
extern struct handle the_handle;
struct handle* g_handle = &the_handle;
struct handle* volatile g_last;  // the handle last bumped: a pointer that changes

static volatile long bumps;  // counts main's loop; handle.c has its own

void handle_bump(struct handle* h);
long handle_count(const struct handle* h);

__attribute__((noinline)) static void tick(void) {
  static volatile long calls;
  calls++;
}

int main(int argc, char** argv) {
  const int n = argc > 1 ? atoi(argv[1]) : 5;
  for (int i = 0; i < n; ++i) {
    handle_bump(g_handle);
    g_last = i % 2 == 0 ? g_handle : NULL;
    bumps++;
    tick();
  }
  fprintf(stderr, "bumped %ld\n", handle_count(g_handle));
  return 0;
}
