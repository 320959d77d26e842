#include "core/kernel/kernel_memory.h"

#include <unistd.h>

#include <array>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tests/core/kernel_core_file.h"

namespace kwatch::core::kernel {
namespace {

using ::kwatch::testing::CoreSegment;
using ::kwatch::testing::KernelCoreImage;
using ::kwatch::testing::PatternBytes;

// Kernel text (two adjacent segments, as kcore splits a range) and a vmalloc'd area whose
// segment is not a whole page.
constexpr uint64_t kText = 0xffffffff81000000;
constexpr uint64_t kTextTail = 0xffffffff81002000;
constexpr uint64_t kVmalloc = 0xffffc90000010000;
constexpr size_t kTextBytes = 0x2000;
constexpr size_t kTailBytes = 0x1000;
constexpr size_t kVmallocBytes = 0x100;

class KernelMemoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           absl::StrCat("kwatch-kcore-", getpid(), "-",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
    text_ = PatternBytes(kTextBytes, 1);
    tail_ = PatternBytes(kTailBytes, 2);
    vmalloc_ = PatternBytes(kVmallocBytes, 3);
    image_ = KernelCoreImage({{kText, text_}, {kTextTail, tail_}, {kVmalloc, vmalloc_}});
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Write(const std::string& name, const std::string& bytes) {
    const std::string p = (dir_ / name).string();
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
  }

  std::filesystem::path dir_;
  std::vector<uint8_t> text_;
  std::vector<uint8_t> tail_;
  std::vector<uint8_t> vmalloc_;
  std::string image_;
};

// The program headers as written: file order, offsets page-aligned after the headers page.
TEST_F(KernelMemoryTest, SegmentsAreThePtLoadHeaders) {
  const std::string path = Write("kcore", image_);
  auto mem = KernelMemory::Open(path);
  ASSERT_TRUE(mem.ok()) << mem.status();
  EXPECT_EQ((*mem)->path(), path);
  const std::vector<KernelMemorySegment>& s = (*mem)->segments();
  ASSERT_EQ(s.size(), 3U);
  EXPECT_EQ(s[0].vaddr, kText);
  EXPECT_EQ(s[0].offset, 0x1000U);
  EXPECT_EQ(s[0].filesz, kTextBytes);
  EXPECT_EQ(s[1].vaddr, kTextTail);
  EXPECT_EQ(s[1].offset, 0x3000U);
  EXPECT_EQ(s[1].filesz, kTailBytes);
  EXPECT_EQ(s[2].vaddr, kVmalloc);
  EXPECT_EQ(s[2].offset, 0x4000U);
  EXPECT_EQ(s[2].filesz, kVmallocBytes);
}

TEST_F(KernelMemoryTest, ReadsTheExactBytesOfEachSegment) {
  auto mem = KernelMemory::Open(Write("kcore", image_));
  ASSERT_TRUE(mem.ok()) << mem.status();
  std::array<uint8_t, 8> buf{};
  ASSERT_TRUE((*mem)->Read(kText, buf).ok());
  EXPECT_EQ(std::vector<uint8_t>(buf.begin(), buf.end()),
            std::vector<uint8_t>(text_.begin(), text_.begin() + 8));
  ASSERT_TRUE((*mem)->Read(kText + 0x1234, buf).ok());
  EXPECT_EQ(std::vector<uint8_t>(buf.begin(), buf.end()),
            std::vector<uint8_t>(text_.begin() + 0x1234, text_.begin() + 0x123c));
  ASSERT_TRUE((*mem)->Read(kVmalloc + 0x10, buf).ok());
  EXPECT_EQ(std::vector<uint8_t>(buf.begin(), buf.end()),
            std::vector<uint8_t>(vmalloc_.begin() + 0x10, vmalloc_.begin() + 0x18));
  // A whole segment in one read.
  std::vector<uint8_t> whole(kTailBytes);
  ASSERT_TRUE((*mem)->Read(kTextTail, whole).ok());
  EXPECT_EQ(whole, tail_);
  // Nothing to read is no error.
  EXPECT_TRUE((*mem)->Read(0, std::span<uint8_t>()).ok());
}

TEST_F(KernelMemoryTest, SegmentEdges) {
  const std::string path = Write("kcore", image_);
  auto mem = KernelMemory::Open(path);
  ASSERT_TRUE(mem.ok()) << mem.status();
  // The last bytes of a segment, and a read across two adjacent segments.
  std::array<uint8_t, 8> buf{};
  ASSERT_TRUE((*mem)->Read(kVmalloc + kVmallocBytes - 8, buf).ok());
  EXPECT_EQ(std::vector<uint8_t>(buf.begin(), buf.end()),
            std::vector<uint8_t>(vmalloc_.end() - 8, vmalloc_.end()));
  ASSERT_TRUE((*mem)->Read(kTextTail - 4, buf).ok());
  EXPECT_EQ(
      std::vector<uint8_t>(buf.begin(), buf.end()),
      std::vector<uint8_t>({text_[kTextBytes - 4], text_[kTextBytes - 3], text_[kTextBytes - 2],
                            text_[kTextBytes - 1], tail_[0], tail_[1], tail_[2], tail_[3]}));
  // One byte past the end of a segment, and a read that runs past it.
  absl::Status past = (*mem)->Read(kVmalloc + kVmallocBytes, buf);
  EXPECT_TRUE(absl::IsNotFound(past)) << past;
  EXPECT_EQ(past.message(),
            absl::StrFormat("%s maps no kernel address 0xffffc90000010100 (in none of its 3 "
                            "PT_LOAD segments)",
                            path));
  absl::Status across = (*mem)->Read(kVmalloc + kVmallocBytes - 4, buf);
  EXPECT_TRUE(absl::IsNotFound(across)) << across;
  EXPECT_EQ(across.message(),
            absl::StrFormat("%s maps no kernel address 0xffffc90000010100 (reading 8 bytes at "
                            "0xffffc900000100fc: in none of its 3 PT_LOAD segments)",
                            path));
  absl::Status before = (*mem)->Read(kText - 1, std::span<uint8_t>(buf).first(2));
  EXPECT_EQ(before.message(),
            absl::StrFormat("%s maps no kernel address 0xffffffff80ffffff (in none of its 3 "
                            "PT_LOAD segments)",
                            path));
}

// The fixmap's last page ends at the top of the address space: its last bytes read, and a
// read past them finds no address (it wraps to 0).
TEST_F(KernelMemoryTest, SegmentAtTheTopOfTheAddressSpace) {
  const std::vector<uint8_t> top = PatternBytes(0x1000, 4);
  const std::string path = Write("top", KernelCoreImage({{0xfffffffffffff000, top}}));
  auto mem = KernelMemory::Open(path);
  ASSERT_TRUE(mem.ok()) << mem.status();
  std::array<uint8_t, 8> buf{};
  ASSERT_TRUE((*mem)->Read(0xfffffffffffffff8, buf).ok());
  EXPECT_EQ(std::vector<uint8_t>(buf.begin(), buf.end()),
            std::vector<uint8_t>(top.end() - 8, top.end()));
  EXPECT_EQ((*mem)->Read(0xfffffffffffffffc, buf).message(),
            absl::StrFormat("%s maps no kernel address 0x0 (reading 8 bytes at "
                            "0xfffffffffffffffc: in none of its 1 PT_LOAD segments)",
                            path));
}

TEST_F(KernelMemoryTest, UnmappedAddressIsNotFoundWithTheAddress) {
  const std::string path = Write("kcore", image_);
  auto mem = KernelMemory::Open(path);
  ASSERT_TRUE(mem.ok()) << mem.status();
  std::array<uint8_t, 8> buf{};
  const absl::Status st = (*mem)->Read(0xffff888000001000, buf);
  EXPECT_TRUE(absl::IsNotFound(st)) << st;
  EXPECT_EQ(st.message(), absl::StrFormat("%s maps no kernel address 0xffff888000001000 (in none "
                                          "of its 3 PT_LOAD segments)",
                                          path));
}

TEST_F(KernelMemoryTest, MissingFileIsNotFoundWithTheCall) {
  const std::string path = (dir_ / "none").string();
  auto mem = KernelMemory::Open(path);
  EXPECT_TRUE(absl::IsNotFound(mem.status())) << mem.status();
  EXPECT_EQ(mem.status().message(), absl::StrCat("open(", path, "): No such file or directory"));
}

TEST_F(KernelMemoryTest, GarbageIsNotAnElfFile) {
  const std::string path = Write("garbage", std::string(4096, 'x'));
  auto mem = KernelMemory::Open(path);
  EXPECT_TRUE(absl::IsInvalidArgument(mem.status())) << mem.status();
  EXPECT_EQ(mem.status().message(), absl::StrCat(path, ": not an ELF file"));
  const std::string empty = Write("empty", "");
  EXPECT_EQ(KernelMemory::Open(empty).status().message(), absl::StrCat(empty, ": not an ELF file"));
}

TEST_F(KernelMemoryTest, AnElfFileThatIsNoCoreIsRefused) {
  std::string exec = image_;
  const Elf64_Half type = ET_EXEC;
  std::memcpy(exec.data() + offsetof(Elf64_Ehdr, e_type), &type, sizeof(type));
  const std::string path = Write("exec", exec);
  auto mem = KernelMemory::Open(path);
  EXPECT_TRUE(absl::IsInvalidArgument(mem.status())) << mem.status();
  EXPECT_EQ(
      mem.status().message(),
      absl::StrCat(path, ": an ELF file of type 2, not a core file (ET_CORE, as /proc/kcore)"));
}

// Cut inside the program headers: Open fails cleanly and says what is missing.
TEST_F(KernelMemoryTest, TruncatedHeadersAreAnError) {
  const std::string path = Write("cut", image_.substr(0, sizeof(Elf64_Ehdr) + 20));
  auto mem = KernelMemory::Open(path);
  EXPECT_TRUE(absl::IsInvalidArgument(mem.status())) << mem.status();
  EXPECT_EQ(mem.status().message(),
            absl::StrCat(path,
                         ": truncated: its ELF header declares 4 program headers at offset "
                         "64, and the file holds 0 of them"))
      << mem.status();
  const std::string two =
      Write("cut2", image_.substr(0, sizeof(Elf64_Ehdr) + 2 * sizeof(Elf64_Phdr) + 8));
  EXPECT_EQ(KernelMemory::Open(two).status().message(),
            absl::StrCat(two,
                         ": truncated: its ELF header declares 4 program headers at offset "
                         "64, and the file holds 2 of them"));
}

// A program header whose segment runs past the end of the address space is refused.
TEST_F(KernelMemoryTest, OverflowingSegmentIsRefused) {
  std::string bad = image_;
  Elf64_Phdr ph{};
  const size_t at = sizeof(Elf64_Ehdr) + 3 * sizeof(Elf64_Phdr);  // the third PT_LOAD
  std::memcpy(&ph, bad.data() + at, sizeof(ph));
  ph.p_vaddr = 0xfffffffffffff000;
  ph.p_filesz = 0x2000;
  std::memcpy(bad.data() + at, &ph, sizeof(ph));
  const std::string path = Write("overflow", bad);
  auto mem = KernelMemory::Open(path);
  EXPECT_TRUE(absl::IsInvalidArgument(mem.status())) << mem.status();
  EXPECT_EQ(mem.status().message(),
            absl::StrCat(path,
                         ": program header 3: PT_LOAD of 0x2000 bytes at 0xfffffffffffff000 "
                         "(file offset 0x4000) overflows"));
}

// Cut inside a segment's bytes: the headers open, the segments before the cut read, and a read
// past it says the file is truncated.
TEST_F(KernelMemoryTest, TruncatedDataIsDataLoss) {
  const std::string path = Write("cut", image_.substr(0, 0x3000 + 0x800));
  auto mem = KernelMemory::Open(path);
  ASSERT_TRUE(mem.ok()) << mem.status();
  std::array<uint8_t, 8> buf{};
  EXPECT_TRUE((*mem)->Read(kText, buf).ok());
  EXPECT_TRUE((*mem)->Read(kTextTail + 0x7f8, buf).ok());
  const absl::Status st = (*mem)->Read(kTextTail + 0x800, buf);
  EXPECT_TRUE(absl::IsDataLoss(st)) << st;
  EXPECT_EQ(st.message(),
            absl::StrFormat("%s ends before offset 0x3800, where its PT_LOAD segment of 0x1000 "
                            "bytes at 0xffffffff81002000 keeps kernel address 0xffffffff81002800: "
                            "the file is truncated",
                            path));
}

TEST_F(KernelMemoryTest, ACoreWithoutLoadSegmentsIsRefused) {
  const std::string path = Write("notes", KernelCoreImage({}));
  auto mem = KernelMemory::Open(path);
  EXPECT_TRUE(absl::IsInvalidArgument(mem.status())) << mem.status();
  EXPECT_EQ(mem.status().message(),
            absl::StrCat(path, ": no PT_LOAD segment with bytes in the file (1 program header)"));
}

}  // namespace
}  // namespace kwatch::core::kernel
