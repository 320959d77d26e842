// Objects reached only through their address, and statics that GCC renames, for the watch
// expressions that name them as gdb does: ((struct record *)0xADDR)->arr[2].x,
// *(record_t *)0xADDR, initialized.0.
//
//   casts [N] [--wait]   print "record 0xADDR" (a record on the heap), and with --wait
//                        "ready PID", then wait for SIGUSR1; then N times (default 5): write
//                        arr[2].x = i + 1 and id = 10 * (i + 1) of the heap record, and call
//                        setup() and teardown(), whose function statics are both called
//                        `initialized` (initialized.0 and initialized.1 in the symbol
//                        table: one goes up by 1, the other by 2 per call); print "wrote N"
//                        on stderr and exit 0.
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ready_wait.h"

struct point {
  int x;
  int y;
};

struct record {
  long id;
  struct point arr[4];
  unsigned flags;
  char name[8];
};

typedef struct record record_t;
typedef struct record* record_ptr;

union slot {
  long as_long;
  double as_double;
};

enum color { kRed, kGreen };

struct record g_record;  // a record whose address the symbol table knows
record_ptr g_heap;       // the heap record
union slot g_slot;       // for casts to a union
enum color g_color;      // for casts to an enum


__attribute__((noinline)) static int setup(void) {
  static volatile int initialized;
  return ++initialized;
}

__attribute__((noinline)) static int teardown(void) {
  static volatile int initialized = 100;
  initialized += 2;
  return initialized;
}

int main(int argc, char** argv) {
  int n = 5;
  int wait = 0;
  for (int i = 1; i < argc; ++i) {
    if (strcmp(argv[i], "--wait") == 0) {
      wait = 1;
    } else {
      n = atoi(argv[i]);
    }
  }
  volatile record_t* rec = calloc(1, sizeof(record_t));
  if (rec == NULL) {
    return 1;
  }
  g_heap = (record_ptr)rec;
  printf("record %p\n", (void*)rec);
  fflush(stdout);
  if (wait) {
    ReadyAndWaitForUsr1();
  }
  for (int i = 0; i < n; ++i) {
    rec->arr[2].x = i + 1;
    rec->id = 10L * (i + 1);
    setup();
    teardown();
  }
  g_record.flags = (unsigned)n;
  g_slot.as_long = n;
  g_color = kGreen;
  fprintf(stderr, "wrote %d\n", n);
  free((void*)rec);
  return 0;
}
