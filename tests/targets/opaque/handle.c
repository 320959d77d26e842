// The definition behind main.c's opaque `struct handle`.
struct handle {
  int id;
  long counter;
  char name[16];
};

struct handle the_handle = {7, 0, "first"};

static volatile long bumps;  // twice per bump: not main.c's

void handle_bump(struct handle* h) {
  h->counter++;
  bumps += 2;
}

long handle_count(const struct handle* h) {
  static volatile long calls;
  calls++;
  return h->counter;
}
