#include "core/probe/xol.h"

#include <gtest/gtest.h>

namespace kwatch::core::probe {
namespace {

ptrace::MapEntry Map(uint64_t start, uint64_t end, const std::string& path, bool exec = false) {
  ptrace::MapEntry m;
  m.start = RemoteAddr{start};
  m.end = RemoteAddr{end};
  m.read = true;
  m.exec = exec;
  m.path = path;
  return m;
}

// A PIE program's layout: the executable, its heap, libraries high up, the stack on top.
std::vector<ptrace::MapEntry> Layout() {
  return {
      Map(0x555555554000, 0x555555555000, "/bin/prog"),
      Map(0x555555555000, 0x555555556000, "/bin/prog", true),
      Map(0x555555556000, 0x555555558000, "/bin/prog"),
      Map(0x555555558000, 0x555555579000, "[heap]"),
      Map(0x7ffff7d00000, 0x7ffff7f00000, "/lib/libc.so.6", true),
      Map(0x7ffff7f00000, 0x7ffff7fff000, "/lib/ld.so", true),
      Map(0x7ffffffde000, 0x7ffffffff000, "[stack]"),
  };
}

TEST(XolGap, GoesJustBelowTheExecutable) {
  const auto at = FindXolGap(Layout(), RemoteAddr{0x555555555100}, kXolAreaSize, kXolMaxDistance);
  ASSERT_TRUE(at.has_value());
  // The top of the gap under the executable, a guard page below it.
  EXPECT_EQ(at->value, 0x555555554000 - 4096 - kXolAreaSize);
}

TEST(XolGap, LeavesRoomAboveTheHeap) {
  // Only the executable's first page below is taken: the gap above [heap] is closer to a
  // probe at the end of the heap region, yet the area keeps 1 GiB away from the heap's top.
  std::vector<ptrace::MapEntry> maps = Layout();
  maps.insert(maps.begin(), Map(0x100000, 0x555555554000, "filler"));
  const auto at = FindXolGap(maps, RemoteAddr{0x555555578000}, kXolAreaSize, 2 * kXolMaxDistance);
  ASSERT_TRUE(at.has_value());
  EXPECT_GE(at->value, 0x555555579000 + (1ULL << 30));
}

TEST(XolGap, NearLibrariesAndNeverUnderTheStack) {
  const auto lib = FindXolGap(Layout(), RemoteAddr{0x7ffff7d10000}, kXolAreaSize, kXolMaxDistance);
  ASSERT_TRUE(lib.has_value());
  EXPECT_EQ(lib->value, 0x7ffff7d00000 - 4096 - kXolAreaSize);
  // Right under the stack is the closest gap for this address, but the stack grows there:
  // the area goes under the libraries instead.
  const auto near_stack =
      FindXolGap(Layout(), RemoteAddr{0x7ffffff00000}, kXolAreaSize, kXolMaxDistance);
  ASSERT_TRUE(near_stack.has_value());
  EXPECT_EQ(near_stack->value, 0x7ffff7d00000 - 4096 - kXolAreaSize);
}

TEST(XolGap, NothingWithinReach) {
  std::vector<ptrace::MapEntry> maps = {Map(0x100000, 0x7ffffff00000, "everything", true)};
  EXPECT_FALSE(
      FindXolGap(maps, RemoteAddr{0x555555555000}, kXolAreaSize, kXolMaxDistance).has_value());
  // A gap exists, but 4 GiB away.
  maps = {Map(0x100000, 0x500000000, "low", true), Map(0x600000000, 0x7ffffff00000, "high")};
  EXPECT_FALSE(
      FindXolGap(maps, RemoteAddr{0x100000000}, kXolAreaSize, kXolMaxDistance).has_value());
  EXPECT_TRUE(FindXolGap(maps, RemoteAddr{0x4d0000000}, kXolAreaSize, kXolMaxDistance).has_value());
}

}  // namespace
}  // namespace kwatch::core::probe
