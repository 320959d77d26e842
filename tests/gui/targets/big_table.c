// A structure with thousands of leaf fields, for the viewer's large-layout tests: g_table is
// 64 rows of { long key; int cells[32]; short tags[14]; } (64 x 47 = 3008 leaves).
//
//   big_table
//
// Writes g_table[r].key = r and then g_table[r].cells[r % 32] = r for r = 0..63 (128 stores,
// one per field touched), and exits 0.
#include <stdio.h>

struct row {
  long key;
  int cells[32];
  short tags[14];
};

volatile struct row g_table[64];

int main(void) {
  for (int r = 0; r < 64; ++r) {
    g_table[r].key = r;
    g_table[r].cells[r % 32] = r;
  }
  printf("done %ld\n", (long)g_table[63].key);
  return 0;
}
