// Static data members of class templates, for watch expressions that name them as gdb does:
// Box<int>::value, ns::Box<long>::value, Box<unsigned long>::value (GCC's DWARF says
// Box<long unsigned int>), Box<int>::inst.second, Arr<int, 2>::data[1].
//
//   templates [N]   N times (default 5): Box<int>::value = i + 1, Box<int>::inst.second =
//                   100 + i, ns::Box<long>::value += 2, Box<unsigned long>::value += 3,
//                   Arr<int, 2>::data[1] = i; print "wrote N" on stderr and exit 0.
#include <cstdio>
#include <cstdlib>

struct Pair {
  int first;
  long second;
};

template <typename T>
struct Box {
  static T value;
  static Pair inst;
};
template <typename T>
T Box<T>::value;
template <typename T>
Pair Box<T>::inst;

namespace ns {
template <typename T>
struct Box {
  static T value;
};
template <typename T>
T Box<T>::value;

struct Node {
  int key;
  Node* next;
};
Node g_node = {1, nullptr};
}  // namespace ns

template <typename T, int N>
struct Arr {
  static T data[N];
};
template <typename T, int N>
T Arr<T, N>::data[N];

// Each store happens (no merging across iterations): the stores are the ground truth.
#define KW_BARRIER() asm volatile("" ::: "memory")

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 5;
  for (int i = 0; i < n; ++i) {
    Box<int>::value = i + 1;
    KW_BARRIER();
    Box<int>::inst.second = 100 + i;
    KW_BARRIER();
    ns::Box<long>::value += 2;
    KW_BARRIER();
    Box<unsigned long>::value += 3;
    KW_BARRIER();
    Arr<int, 2>::data[1] = i;
    KW_BARRIER();
  }
  ns::g_node.key = n;
  std::fprintf(stderr, "wrote %d\n", n);
  return 0;
}
