#include "core/ptrace/maps.h"

#include <unistd.h>

#include <gtest/gtest.h>

namespace kwatch::core::ptrace {
namespace {

TEST(ParseMaps, ParsesEveryColumn) {
  const char* text =
      "55d4c8a00000-55d4c8a01000 r--p 00000000 fd:01 1234567                    /usr/bin/prog\n"
      "55d4c8a01000-55d4c8a02000 r-xp 00001000 fd:01 1234567                    /usr/bin/prog\n"
      "7ffd1c000000-7ffd1c021000 rw-p 00000000 00:00 0                          [stack]\n"
      "7f0000000000-7f0000001000 rw-s 00000000 00:05 42                         /dev/shm/with "
      "space\n"
      "7f0000002000-7f0000003000 ---p 00000000 00:00 0 \n";
  auto maps = ParseMaps(text);
  ASSERT_TRUE(maps.ok()) << maps.status();
  ASSERT_EQ(maps->size(), 5u);
  const MapEntry& text_seg = (*maps)[1];
  EXPECT_EQ(text_seg.start.value, 0x55d4c8a01000u);
  EXPECT_EQ(text_seg.end.value, 0x55d4c8a02000u);
  EXPECT_TRUE(text_seg.read);
  EXPECT_FALSE(text_seg.write);
  EXPECT_TRUE(text_seg.exec);
  EXPECT_FALSE(text_seg.shared);
  EXPECT_EQ(text_seg.offset, 0x1000u);
  EXPECT_EQ(text_seg.dev, "fd:01");
  EXPECT_EQ(text_seg.inode, 1234567u);
  EXPECT_EQ(text_seg.path, "/usr/bin/prog");
  EXPECT_EQ((*maps)[2].path, "[stack]");
  EXPECT_TRUE((*maps)[3].shared);
  EXPECT_EQ((*maps)[3].path, "/dev/shm/with space");
  EXPECT_EQ((*maps)[4].path, "");
  EXPECT_FALSE((*maps)[4].read);
}

TEST(ParseMaps, RejectsMalformedLineNamingIt) {
  auto maps = ParseMaps("00400000-00401000 r-xp 00000000 fd:01 1 /a\nnot a maps line\n");
  ASSERT_FALSE(maps.ok());
  EXPECT_EQ(maps.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(maps.status().message().find("line 2"), absl::string_view::npos);
}

TEST(ReadMaps, OwnProcessContainsThisFunction) {
  auto maps = ReadMaps(getpid());
  ASSERT_TRUE(maps.ok()) << maps.status();
  const auto m = FindMapping(*maps, RemoteAddr{reinterpret_cast<uint64_t>(&ReadMaps)});
  ASSERT_TRUE(m.has_value());
  EXPECT_TRUE(m->exec);
}

TEST(ReadMaps, GoneProcessIsNotFound) {
  auto maps = ReadMaps(999999999);
  ASSERT_FALSE(maps.ok());
  EXPECT_EQ(maps.status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace kwatch::core::ptrace
