// watch/kernel/drain_values.h: OpenDrainValues over fixture kernel core files.
#include "watch/kernel/drain_values.h"

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/kernel/kernel_symbols.h"
#include "tests/core/kernel_core_file.h"
#include "watch/kernel/kernel_expr.h"

namespace kwatch::watch::kernel {
namespace {

constexpr uint64_t kBase = 0xffffffff82000000ULL;

KernelWatch At(uint64_t addr, uint32_t len) {
  KernelWatch w;
  w.addr = addr;
  w.len = len;
  return w;
}

class OpenDrainValuesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / absl::StrCat("kwatch-drain-", getpid());
    std::filesystem::create_directories(dir_);
    core_ = (dir_ / "kcore").string();
    std::ofstream(core_, std::ios::binary)
        << testing::KernelCoreImage({{kBase, testing::PatternBytes(64, 1)}});
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::filesystem::path dir_;
  std::string core_;
};

TEST_F(OpenDrainValuesTest, ValuesFromTheCoreFile) {
  // Byte i of the segment is 1 + 7 i: the 4 bytes at +8 are 57, 64, 71, 78 (little-endian).
  const std::vector<KernelWatch> watches = {At(kBase + 8, 4), At(kBase + 4096, 8)};
  auto opened = OpenDrainValues(core_, true, watches);
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ(opened->source, core_);
  EXPECT_TRUE(opened->why_none.ok());
  ASSERT_TRUE(opened->values->Enabled());
  // The second watch is outside the file's segments: said once, here.
  ASSERT_EQ(opened->unreadable.size(), 1U);
  EXPECT_EQ(opened->unreadable[0].first, 1U);
  EXPECT_FALSE(opened->unreadable[0].second.ok());
  const DrainValues::Value v = opened->values->Get(0, watches[0]);
  EXPECT_EQ(v.value, std::optional<uint64_t>(0x4e474039U));
  EXPECT_TRUE(v.first_failure.ok());
  const DrainValues::Value gone = opened->values->Get(1, watches[1]);
  EXPECT_FALSE(gone.value.has_value());
  EXPECT_TRUE(gone.first_failure.ok());  // already said
}

TEST_F(OpenDrainValuesTest, NotNeededOpensNothing) {
  auto opened = OpenDrainValues("/no/such/kcore", false, std::vector<KernelWatch>{At(kBase, 8)});
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_FALSE(opened->values->Enabled());
  EXPECT_EQ(opened->source, "");
  EXPECT_TRUE(opened->why_none.ok());
  EXPECT_TRUE(opened->unreadable.empty());
}

TEST_F(OpenDrainValuesTest, AGivenFileMustOpen) {
  auto opened = OpenDrainValues((dir_ / "missing").string(), true, {});
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kNotFound) << opened.status();
}

TEST_F(OpenDrainValuesTest, ProcKcoreOrWhyNot) {
  auto opened = OpenDrainValues("", true, std::vector<KernelWatch>{At(kBase, 8)});
  ASSERT_TRUE(opened.ok()) << opened.status();
  if (std::filesystem::exists("/proc/kcore")) {
    EXPECT_EQ(opened->source, "/proc/kcore");
    EXPECT_TRUE(opened->values->Enabled());
    return;
  }
  // This machine's kernel is built without CONFIG_PROC_KCORE (docs/design.md): BPF reads.
  EXPECT_EQ(opened->source,
            "kernel memory through BPF (bpf_probe_read_kernel; no /proc/kcore here)");
  EXPECT_TRUE(opened->values->Enabled());
  EXPECT_TRUE(opened->why_none.ok());
}

TEST_F(OpenDrainValuesTest, ThroughBpfAKernelWordIsReadAndAnUnmappedOneSaidOnce) {
  // The kernel's jiffies (found in the code of jiffies_read without data symbols): a word that
  // only grows. Read through BPF here; through /proc/kcore where there is one.
  core::kernel::KernelSymbolSources sources;  // /proc/kallsyms only
  sources.system_map_places = std::vector<std::string>{};
  sources.vmlinux_places = std::vector<std::string>{};
  auto symbols = core::kernel::KernelSymbolResolver::Create(sources);
  ASSERT_TRUE(symbols.ok()) << symbols.status();
  auto jiffies = ResolveKernelExpr("&jiffies", {}, **symbols, nullptr);
  ASSERT_TRUE(jiffies.ok()) << jiffies.status();
  std::vector<KernelWatch> watches = {jiffies->watch, At(0x10, 8)};
  auto opened = OpenDrainValues("", true, watches);
  ASSERT_TRUE(opened.ok()) << opened.status();
  ASSERT_EQ(opened->unreadable.size(), 1U);
  EXPECT_EQ(opened->unreadable[0].first, 1U);
  DrainValues& v = *opened->values;
  const std::optional<uint64_t> first = v.Get(0, watches[0]).value;
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(v.Get(0, watches[0]).value, first);  // one read per batch
  usleep(50'000);
  v.NewBatch();
  const std::optional<uint64_t> later = v.Get(0, watches[0]).value;
  ASSERT_TRUE(later.has_value());
  EXPECT_GT(*later, *first);
  const DrainValues::Value none = v.Get(1, watches[1]);
  EXPECT_FALSE(none.value.has_value());
  EXPECT_TRUE(none.first_failure.ok());  // said at open, not again
}

}  // namespace
}  // namespace kwatch::watch::kernel
